//! The training queue simulation: every scheduler runs every job once,
//! gangs never hold idle GPUs, inference's GPUs are never taken, and the
//! interleaved-pods deadlock happens only without gangs.

use gpuscale_bench::training::{
    JobDef, Scenario, Scheduler, fifo_pods, makespan_bound_h, simulate, stream, summary,
};

fn job(name: &str, arrival_s: f64, workers: u32, gpw: u32, hours: f64) -> JobDef {
    JobDef {
        name: name.into(),
        arrival_s,
        workers,
        gpus_per_worker: gpw,
        runtime_s: hours * 3600.0,
        estimate_s: hours * 2.0 * 3600.0,
        account: "t".into(),
    }
}

/// Two nodes of 8 GPUs, no inference.
fn two_nodes() -> Scenario {
    Scenario {
        nodes: 2,
        nodes_per_rack: 2,
        inference_nodes: 0,
        inference_peak_gpus: 0,
        jobs: 2,
        ..Scenario::default()
    }
}

#[test]
fn two_gangs_created_in_the_same_second_deadlock_without_gang_scheduling_only() {
    // Two nodes, both busy with `x` for an hour; two 2 × 8 jobs created in
    // the same second wait. When `x` ends, pod by pod, their first workers
    // take a node each and their second workers wait for ever: nothing
    // runs. Gangs start one, then the other.
    let s = two_nodes();
    let jobs = vec![
        job("x", 0.0, 2, 8, 1.0),
        job("a", 100.0, 2, 8, 1.0),
        job("b", 100.0, 2, 8, 1.0),
    ];
    let no_gang = simulate(&s, &jobs, Scheduler::FifoNoGang);
    assert_eq!(no_gang.deadlocks, 1, "{no_gang:?}");
    assert_eq!(no_gang.completed, 3);
    // After the deadlock is broken (the younger job's holds released) the
    // rest runs: 3 h in all, and a node was held idle meanwhile at most
    // for an instant.
    assert!((no_gang.makespan_h - 3.0).abs() < 1e-6, "{no_gang:?}");
    for k in [
        Scheduler::FifoGang,
        Scheduler::EasyBackfill,
        Scheduler::Gpuscale,
    ] {
        let o = simulate(&s, &jobs, k);
        assert_eq!(o.deadlocks, 0, "{k:?}");
        assert_eq!(o.completed, 3, "{k:?}");
        // One after the other: 3 h.
        assert!((o.makespan_h - 3.0).abs() < 1e-6, "{k:?}: {o:?}");
    }
}

#[test]
fn pods_queue_by_refreshed_timestamp_so_a_later_job_waits_behind_an_earlier_one() {
    // As above, but `b` is created a second after `a`: `a`'s pods failed
    // first, so (timestamps refreshed on failure, in the order tried) they
    // stay ahead of `b`'s, take both nodes when `x` ends, and nothing
    // deadlocks.
    let s = two_nodes();
    let jobs = vec![
        job("x", 0.0, 2, 8, 1.0),
        job("a", 100.0, 2, 8, 1.0),
        job("b", 101.0, 2, 8, 1.0),
    ];
    let o = simulate(&s, &jobs, Scheduler::FifoNoGang);
    assert_eq!(o.deadlocks, 0, "{o:?}");
    assert_eq!(o.completed, 3);
    assert!((o.makespan_h - 3.0).abs() < 1e-6, "{o:?}");
    assert_eq!(o.held_idle_gpu_hours, 0.0, "{o:?}");
}

#[test]
fn a_sweeps_pods_come_in_the_job_controllers_slow_start_batches() {
    // The Job controller creates a job's pods in batches of 1, 2, 4, 8
    // (pkg/controller/job: SlowStartInitialBatchSize = 1, doubling); jobs
    // synced together interleave batch by batch.
    let jobs = vec![job("a", 0.0, 8, 8, 1.0), job("b", 0.0, 2, 8, 1.0)];
    let order = fifo_pods(&jobs, &[0, 1]);
    // batch 0: a0 b0; batch 1: a1 a2 b1; batch 2: a3..a6; batch 3: a7.
    assert_eq!(order, vec![0, 1, 0, 0, 1, 0, 0, 0, 0, 0]);
}

#[test]
fn every_scheduler_runs_every_job_and_gangs_hold_nothing_idle() {
    let s = Scenario {
        jobs: 80,
        mean_gap_s: 300.0,
        ..Scenario::default()
    };
    let jobs = stream(&s);
    let offered: f64 = jobs.iter().map(|j| f64::from(j.gpus()) * j.runtime_s).sum();
    assert!(jobs.iter().any(|j| j.gpus() == 64) && jobs.iter().any(|j| j.gpus() == 1));
    assert!(jobs.iter().all(|j| j.estimate_s >= j.runtime_s));
    let mut by: std::collections::BTreeMap<String, f64> = Default::default();
    let bound = makespan_bound_h(&s, &jobs);
    assert!(bound > 0.0);
    let mut outcomes = Vec::new();
    for k in Scheduler::ALL {
        let o = simulate(&s, &jobs, k);
        outcomes.push(o.clone());
        assert_eq!(o.completed, jobs.len(), "{k:?}");
        assert_eq!(o.inference_gpus_taken, 0, "{k:?}");
        assert!(o.utilization > 0.0 && o.utilization <= 1.0, "{k:?}: {o:?}");
        if k != Scheduler::FifoNoGang {
            assert_eq!(o.deadlocks, 0, "{k:?}");
            assert_eq!(o.held_idle_gpu_hours, 0.0, "{k:?}");
        }
        by.insert(format!("{k:?}"), o.utilization);
        // No schedule ends before the bound.
        assert!(o.makespan_h >= bound - 1e-9, "{k:?}: {o:?} against {bound}");
        // Reservations are upper bounds: with arrival order and estimates
        // that only overestimate, no head job starts after its first
        // reservation (EASY's one, gpuscale's conservative ones).
        if matches!(k, Scheduler::EasyBackfill | Scheduler::GpuscaleFifo) {
            assert_eq!(o.heads_delayed, 0, "{k:?}");
        }
    }
    assert!(offered > 0.0);
    // The summary across seeds: the baseline's own gain is 0, and a
    // scheduler's median gain is its gain when every seed is the same.
    let two = summary(&[outcomes.clone(), outcomes.clone()]);
    assert!(
        two.contains("| FIFO, no gangs (partial holds) | ")
            && two.contains("| +0.0 % | +0.0 % | +0.0 % | 0 of 2 | "),
        "{two}"
    );
    let gain = 100.0 * (outcomes[3].utilization / outcomes[0].utilization - 1.0);
    assert!(
        two.contains(&format!("| {gain:+.1} % | {gain:+.1} % | {gain:+.1} % |")),
        "{two}"
    );
    // Backfill uses GPUs strict FIFO leaves idle.
    assert!(by["Gpuscale"] >= by["FifoGang"], "{by:?}");
    assert!(by["EasyBackfill"] >= by["FifoGang"], "{by:?}");
}
