//! # gpuscale-bench
//!
//! Benchmarks, the scenario generator and the reports that back every
//! performance claim gpuscale makes. Everything here runs release builds:
//! `cargo run --release -p gpuscale-bench --bin packer-report` and
//! `cargo bench -p gpuscale-bench`.
//!
//! - [`scenario`]: clusters of 100 to 80,000 GPUs of mixed models, a model
//!   zoo from real model sizes, demand at a set memory fill;
//! - [`sim_scenarios`]: the simulator's generated scenarios (fleet-1000,
//!   marketplace), checked in under `bench/scenarios/`;
//! - [`packer_report`]: gpuscale against first-fit decreasing, one replica
//!   per whole GPU and the LP bound, in the same run, plus the incremental
//!   case;
//! - [`training`]: a stream of training jobs on a 256-GPU cluster shared
//!   with inference, under FIFO without gangs, FIFO with gangs, EASY
//!   backfill and gpuscale's gang placement and queue (`training-report`);
//! - [`routing`]: the routing benchmark's workloads (prefix-heavy chat
//!   sessions and no shared prefix, sizes from the Azure trace) for
//!   `routing-bench`, which runs round robin, least-outstanding and
//!   prefix affinity behind 1 and 3 gateways (`bench/routing.sh`).
//!
//! What it does not do: run in the test suite's timing (unit tests never
//! time anything), or reach beyond loopback.

pub mod packer_report;
pub mod routing;
pub mod scenario;
pub mod sim_scenarios;
pub mod training;
