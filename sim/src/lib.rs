//! # gpuscale-sim
//!
//! The trace-driven simulator behind `gpuscale simulate`: arrivals from a
//! production trace or generators ([`arrivals`], [`trace`]), served in
//! simulated time by replicas that run at the speed of the GPU share they
//! were placed on.
pub mod arrivals;
pub mod control;
pub mod engine;
pub mod histogram;
pub mod placement;
pub mod plot;
pub mod report;
pub mod scenario;
pub mod simulate;
pub mod trace;

pub use scenario::{PlacementKind, PolicyKind, Scenario};
pub use simulate::simulate;
