//! # gpuscale-packer
//!
//! Decides where model replicas run: which GPUs are split into which MIG
//! geometry, which are time-sliced, which serve whole, and which replica goes
//! on which slot — the step that turns 40–60 % GPU utilisation into ~85 %.
//!
//! Status: an empty shell. The ILP packer (good_lp with HiGHS) lands with the
//! packer issue; until then nothing here is public and no `gpuscale`
//! subcommand uses it.
//!
//! What it will never do: network or file I/O — it is a pure library over the
//! types of `gpuscale-policies`.
