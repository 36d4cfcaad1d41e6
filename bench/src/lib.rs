//! # gpuscale-bench
//!
//! Benchmarks, the scenario generator and the trace-driven simulator that back
//! every performance claim gpuscale makes.
//!
//! Status: an empty shell until the packer and autoscaler benchmarks land.
