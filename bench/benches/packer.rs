//! Criterion benchmarks of the packer's solve at each cluster size (load
//! excluded: the scenario is loaded once per size).

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gpuscale_bench::packer_report::write_scenario;
use gpuscale_packer::{PackOptions, pack};
use gpuscale_policies::load_paths;

fn bench_pack(c: &mut Criterion) {
    let dir = std::env::temp_dir().join("gpuscale-criterion");
    let mut group = c.benchmark_group("pack");
    group.sample_size(10);
    for gpus in [100u32, 1000, 10_000] {
        let paths = write_scenario(
            &dir.join(gpus.to_string()),
            gpus,
            40,
            0.9,
            gpuscale_bench::scenario::RuleSet::MigWhole,
        )
        .expect("scenario");
        let bundle = load_paths(&paths).expect("valid scenario");
        let cluster = bundle.cluster.clone().expect("cluster");
        let demand = bundle.demand.clone().unwrap_or_default();
        let options = PackOptions::default();
        group.bench_function(format!("{gpus}-gpus"), |b| {
            b.iter(|| pack(black_box(&cluster), &bundle.models, &demand, &options).expect("packs"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_pack);
criterion_main!(benches);
