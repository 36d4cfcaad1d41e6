//! The checked-in generated scenarios are what the generator writes: edit
//! the generator, then `cargo run -p gpuscale-bench --bin sim-scenarios`.

use std::path::Path;

use gpuscale_bench::scenario::{default_zoo_path, load_zoo};
use gpuscale_bench::sim_scenarios;

#[test]
fn checked_in_generated_scenarios_are_current() {
    let zoo = load_zoo(&default_zoo_path()).unwrap();
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let files = sim_scenarios::all(&zoo);
    assert_eq!(files.len(), 6);
    for (name, text) in files {
        let path = dir.join(&name);
        let now =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            now == text,
            "{} is stale: run `cargo run -p gpuscale-bench --bin sim-scenarios`",
            path.display()
        );
    }
}
