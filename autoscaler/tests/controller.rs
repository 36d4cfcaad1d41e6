//! The controller's async shell over stand-ins: its health endpoints
//! (the control loop alive, metric reads failing), and the local
//! backend's replica cap as a bound the recommender works within. The
//! Kubernetes API is a `tower_test` mock answering every request with
//! 503 (no API server can run where these tests run).

use std::time::Duration;

use gpuscale_autoscaler::kubernetes::{Kube, KubeSpec};
use http::{Request, Response};
use kube::client::Body;

mod common;

fn spec() -> KubeSpec {
    KubeSpec {
        namespace: "inference".into(),
        ..KubeSpec::default()
    }
}

/// A controller over a local backend capped at `cap` replicas per model
/// (replicas are `sleep` processes that never say where they listen:
/// counted, never registered), a policy with `min_replicas`, and a
/// stand-in gateway with `waiting` requests queued; after five ticks, the
/// model's decisions.
async fn capped(
    min_replicas: u32,
    cap: u32,
    waiting: u32,
) -> gpuscale_autoscaler::controller::ModelDecisions {
    capped_report(min_replicas, cap, waiting)
        .await
        .decisions()
        .remove("llama")
        .unwrap()
}

/// As [`capped`], the controller's whole report.
async fn capped_report(
    min_replicas: u32,
    cap: u32,
    waiting: u32,
) -> gpuscale_autoscaler::controller::Report {
    use gpuscale_autoscaler::backend::Backend;
    use gpuscale_autoscaler::controller::Controller;
    use gpuscale_autoscaler::local::LocalBackend;
    // The stand-in reports the cap's replicas ready: none is starting,
    // so the queue is demand (a queue left by replicas still starting
    // holds the count instead).
    let mut queues = common::queues(waiting);
    queues["models"]["meta-llama/Llama-3.1-8B-Instruct"]["replicas"] = cap.into();
    let (gw, _) = common::stand_in_gateway(queues).await;
    let settings = common::settings(
        &gw,
        &format!(
            "  scaling:\n    minReplicas: {min_replicas}\n    maxReplicas: 10\n    targetQueueDepth: 8\n    startupTime: 1h\n"
        ),
        &format!("  local: {{maxReplicasPerModel: {cap}}}\n  tuning: {{panicThreshold: 1000}}\n"),
    );
    let gateway = gpuscale_autoscaler::observe::GatewayClient::new(&gw);
    let local = LocalBackend::new(
        "/bin/sleep".into(),
        gateway.clone(),
        settings.spec.local.clone(),
    );
    let mut controller = Controller::new(settings, gateway, Backend::Local(local));
    let report = controller.report();
    for _ in 0..5 {
        controller.tick().await;
    }
    report
}

/// The cap is the most the model may run, and what the metric and the
/// dashboard say: `GpuscaleReplicasAtMax` (desired ≥ max) fires while a
/// model is held at it.
#[tokio::test]
async fn the_cap_is_the_maximum_the_metrics_and_the_dashboard_show() {
    let report = capped_report(1, 2, 200).await;
    let text = report.metrics();
    assert!(
        text.lines()
            .any(|l| l == "gpuscale_autoscaler_max_replicas{model=\"llama\"} 2"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l == "gpuscale_autoscaler_desired_replicas{model=\"llama\"} 2"),
        "{text}"
    );
    let view = report.dashboard();
    let llama = view.models.iter().find(|m| m.name == "llama").unwrap();
    assert_eq!(llama.max, 2);
}

/// A server for the local backend that says where it "listens" (nothing
/// listens there) and runs until its stdin, the lifeline, closes or it is
/// killed; written into `dir`.
fn fake_server(dir: &std::path::Path) -> std::path::PathBuf {
    executable(
        dir,
        "server",
        "#!/bin/sh\necho \"pid $$ listening on http://127.0.0.1:9\"\nexec cat >/dev/null\n",
    )
}

/// An executable file `name` in `dir` holding `text`.
fn executable(dir: &std::path::Path, name: &str, text: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let exe = dir.join(name);
    std::fs::write(&exe, text).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    exe
}

/// A replica whose server runs and takes connections but answers none
/// (hung) fails its health checks, is stopped and deregistered, and the
/// reconciler starts another in its place.
#[tokio::test]
async fn a_local_replica_that_answers_nothing_is_replaced() {
    use gpuscale_autoscaler::local::LocalBackend;
    let (gw, state) = common::stand_in_gateway(common::quiet()).await;
    let settings = common::settings(
        &gw,
        "",
        "  local: {startupTime: 0s, drainTime: 1s, healthCheckEvery: 100ms}\n",
    );
    // Listens, says where, accepts every connection and answers none.
    let dir = tempfile::tempdir().unwrap();
    let exe = executable(
        dir.path(),
        "hung",
        "#!/usr/bin/env python3\nimport socket, sys, threading\ns = socket.socket()\ns.bind((\"127.0.0.1\", 0))\ns.listen(16)\nprint(f\"listening on http://127.0.0.1:{s.getsockname()[1]}\", flush=True)\nheld = []\ndef take():\n    while True:\n        held.append(s.accept())\nthreading.Thread(target=take, daemon=True).start()\nsys.stdin.read()\n",
    );
    let gateway = gpuscale_autoscaler::observe::GatewayClient::new(&gw);
    let mut local = LocalBackend::new(exe, gateway, settings.spec.local.clone());
    let m = settings.models[0].clone();
    let served = m.served_name.clone();
    let listed = || state.listed(&served);
    local.scale(&m, 1);
    let began = std::time::Instant::now();
    while listed().is_empty() {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "never registered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = listed();
    // Three failed checks (each up to 2 s: the server takes the
    // connection and says nothing), then the reconciler's replacement.
    let began = std::time::Instant::now();
    let mut replaced = 0;
    while replaced == 0 {
        assert!(began.elapsed() < Duration::from_secs(20), "never replaced");
        tokio::time::sleep(Duration::from_millis(100)).await;
        replaced = local
            .reconcile(std::slice::from_ref(&m))
            .await
            .replaced
            .get("llama")
            .copied()
            .unwrap_or(0);
    }
    assert_eq!(replaced, 1);
    let began = std::time::Instant::now();
    while listed().is_empty() || listed() == first {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "the replacement never registered: {:?}",
            listed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(listed().is_disjoint(&first), "the hung one deregistered");
    local.shutdown().await;
}

/// The local reconciler removes a registration the gateway holds that no
/// replica of its owns (left by an earlier run, or by a removal that
/// failed), and keeps its own.
#[tokio::test]
async fn the_local_reconciler_removes_registrations_no_replica_owns() {
    use gpuscale_autoscaler::local::LocalBackend;
    let (gw, state) = common::stand_in_gateway(common::quiet()).await;
    let settings = common::settings(&gw, "", "  local: {startupTime: 0s, drainTime: 1s}\n");
    let dir = tempfile::tempdir().unwrap();
    let gateway = gpuscale_autoscaler::observe::GatewayClient::new(&gw);
    let mut local = LocalBackend::new(
        fake_server(dir.path()),
        gateway,
        settings.spec.local.clone(),
    );
    let m = settings.models[0].clone();
    let served = m.served_name.clone();
    let listed = || state.listed(&served);
    state
        .replicas
        .lock()
        .unwrap()
        .insert(served.clone(), ["http://127.0.0.1:1".to_string()].into());
    local.scale(&m, 1);
    let began = std::time::Instant::now();
    while !listed().contains("http://127.0.0.1:9") {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "never registered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let repairs = local.reconcile(std::slice::from_ref(&m)).await;
    assert_eq!(repairs.removed.get("llama"), Some(&1));
    assert_eq!(listed(), ["http://127.0.0.1:9".to_string()].into());
    local.shutdown().await;
}

/// What the reconciliation repaired reaches the controller's metrics:
/// a stale registration removed on the first tick counts once in
/// `gpuscale_autoscaler_repairs_total{repair="removed"}`, and later ticks
/// with nothing to repair add nothing.
#[tokio::test]
async fn repairs_are_counted_in_the_controllers_metrics() {
    use gpuscale_autoscaler::backend::Backend;
    use gpuscale_autoscaler::controller::Controller;
    use gpuscale_autoscaler::local::LocalBackend;
    let (gw, state) = common::stand_in_gateway(common::quiet()).await;
    let settings = common::settings(&gw, "", "  local: {startupTime: 0s, drainTime: 1s}\n");
    let dir = tempfile::tempdir().unwrap();
    let gateway = gpuscale_autoscaler::observe::GatewayClient::new(&gw);
    let local = LocalBackend::new(
        fake_server(dir.path()),
        gateway.clone(),
        settings.spec.local.clone(),
    );
    let served = settings.models[0].served_name.clone();
    state
        .replicas
        .lock()
        .unwrap()
        .insert(served.clone(), ["http://127.0.0.1:1".to_string()].into());
    let mut controller = Controller::new(settings, gateway, Backend::Local(local));
    let report = controller.report();
    let removed = || {
        report.metrics().lines().find_map(|l| {
            l.strip_prefix("gpuscale_autoscaler_repairs_total{model=\"llama\",repair=\"removed\"} ")
                .map(str::to_string)
        })
    };
    // At zero from the start, so the first repair shows in `increase()`.
    assert_eq!(removed().as_deref(), Some("0"));
    controller.tick().await;
    assert_eq!(removed().as_deref(), Some("1"));
    assert!(!state.listed(&served).contains("http://127.0.0.1:1"));
    for _ in 0..3 {
        controller.tick().await;
    }
    assert_eq!(removed().as_deref(), Some("1"));
}

/// A local backend (drain time 30 s, a stand-in gateway that keeps a
/// removed replica draining until the test empties its list) with one
/// replica of a fake server, registered; the backend, the stand-in, the
/// model and the directory holding the server.
async fn one_registered_replica() -> (
    gpuscale_autoscaler::local::LocalBackend,
    common::StandIn,
    gpuscale_policies::Model,
    tempfile::TempDir,
) {
    use std::sync::atomic::Ordering;
    let (gw, state) = common::stand_in_gateway(common::quiet()).await;
    state.drain.store(true, Ordering::SeqCst);
    let settings = common::settings(&gw, "", "  local: {startupTime: 0s, drainTime: 30s}\n");
    let dir = tempfile::tempdir().unwrap();
    let exe = fake_server(dir.path());
    let gateway = gpuscale_autoscaler::observe::GatewayClient::new(&gw);
    let mut local =
        gpuscale_autoscaler::local::LocalBackend::new(exe, gateway, settings.spec.local.clone());
    let m = settings.models[0].clone();
    local.scale(&m, 1);
    let began = std::time::Instant::now();
    while state.listed(&m.served_name).is_empty() {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "never registered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (local, state, m, dir)
}

/// A replica the local backend removes is deregistered and stops once
/// the gateway no longer lists it (its last request done), not at a fixed
/// drain time that cut long requests: here it still runs while the
/// gateway lists it draining, past what the old 5 s would have allowed
/// at this test's scale, and stops soon after the gateway lets it go.
#[tokio::test]
async fn a_removed_local_replica_stops_once_its_requests_are_done() {
    let (mut local, state, m, _dir) = one_registered_replica().await;
    let served = m.served_name.clone();
    // Which process is the replica: the one whose stdout named it.
    let pid_of_replica = || -> Option<u32> {
        let pids = std::fs::read_dir("/proc").ok()?;
        pids.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .find(|pid| {
                std::fs::read_to_string(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                    c.split('\0').next() == Some("cat")
                        && std::fs::read_to_string(format!("/proc/{pid}/status"))
                            .is_ok_and(|s| s.contains(&format!("PPid:\t{}", std::process::id())))
                })
            })
    };
    let pid = pid_of_replica().expect("the replica's process");
    local.scale(&m, 0);
    let alive = |pid: u32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.split(' ').nth(2).is_none_or(|st| st != "Z"))
    };
    // Deregistered, and draining at the gateway: it runs on.
    let began = std::time::Instant::now();
    while state.draining_of(&served).is_empty() {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "never deregistered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        alive(pid),
        "stopped while the gateway still lists it draining"
    );
    // Its last request ends: it stops within a few polls, long before
    // the 30 s drain time.
    state.draining.lock().unwrap().clear();
    let began = std::time::Instant::now();
    while alive(pid) {
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "still running after the gateway let it go"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A plan that moves a local replica changes its speed in place: the
/// running server is told on its standard input (`speed S`), a replica
/// already at one of the plan's speeds keeps it, a re-plan that only
/// reorders tells nobody anything, and a new replica starts at a speed
/// left over (`--speed`).
#[tokio::test]
async fn a_plan_changes_running_local_replicas_speeds_in_place() {
    use gpuscale_autoscaler::local::LocalBackend;
    use std::collections::BTreeMap;
    let (gw, state) = common::stand_in_gateway(common::quiet()).await;
    let settings = common::settings(
        &gw,
        "",
        "  local: {startupTime: 0s, drainTime: 1s, healthCheckEvery: 0s}\n",
    );
    // Says where it "listens" (a port per process; nothing listens),
    // writes its arguments and then its standard input to files.
    let dir = tempfile::tempdir().unwrap();
    let exe = executable(
        dir.path(),
        "server",
        "#!/bin/sh\necho \"$@\" > \"$0.$$.args\"\necho \"listening on http://127.0.0.1:$((20000 + $$ % 20000))\"\nexec cat > \"$0.$$.stdin\"\n",
    );
    let files = |ext: &str| -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|e| {
                let p = e.ok()?.path();
                p.to_str()?
                    .ends_with(ext)
                    .then(|| std::fs::read_to_string(&p).unwrap_or_default())
            })
            .collect();
        v.sort();
        v
    };
    let gateway = gpuscale_autoscaler::observe::GatewayClient::new(&gw);
    let mut local = LocalBackend::new(exe, gateway, settings.spec.local.clone());
    let m = settings.models[0].clone();
    let served = m.served_name.clone();
    let plan = |v: &[f64]| BTreeMap::from([("llama".to_string(), v.to_vec())]);
    local.set_speeds(plan(&[0.5, 1.0]));
    local.scale(&m, 2);
    assert_eq!(local.replica_speeds("llama"), [Some(0.5), Some(1.0)]);
    let began = std::time::Instant::now();
    while state.listed(&served).len() < 2 {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "never registered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let args = files(".args");
    assert_eq!(args.len(), 2);
    assert!(
        args.iter().any(|a| a.contains("--speed 0.5000")),
        "{args:?}"
    );
    assert!(
        args.iter().any(|a| a.contains("--speed 1.0000")),
        "{args:?}"
    );
    // Reordered: nobody is told anything.
    local.set_speeds(plan(&[1.0, 0.5]));
    assert_eq!(local.replica_speeds("llama"), [Some(0.5), Some(1.0)]);
    // The whole-GPU replica moves to a 3g slice: it alone is told.
    local.set_speeds(plan(&[0.5, 3.0 / 7.0]));
    assert_eq!(local.replica_speeds("llama"), [Some(0.5), Some(3.0 / 7.0)]);
    let began = std::time::Instant::now();
    while files(".stdin").concat() != "speed 0.4286\n" {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "told: {:?}",
            files(".stdin")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A third replica takes the speed the plan has left.
    local.set_speeds(plan(&[0.5, 3.0 / 7.0, 0.25]));
    local.scale(&m, 3);
    assert_eq!(
        local.replica_speeds("llama"),
        [Some(0.5), Some(3.0 / 7.0), Some(0.25)]
    );
    let began = std::time::Instant::now();
    while !files(".args").iter().any(|a| a.contains("--speed 0.2500")) {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "{:?}",
            files(".args")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(files(".stdin").concat(), "speed 0.4286\n");
    local.shutdown().await;
}

/// Exiting waits for replicas already stopping: one scaled away and
/// still draining at the gateway is waited for (deregistered, its
/// server stopped) instead of being killed with the process.
#[tokio::test]
async fn shutdown_waits_for_replicas_still_draining() {
    let (mut local, state, m, _dir) = one_registered_replica().await;
    let served = m.served_name.clone();
    local.scale(&m, 0);
    let began = std::time::Instant::now();
    while state.draining_of(&served).is_empty() {
        assert!(
            began.elapsed() < Duration::from_secs(10),
            "never deregistered"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(local.draining(), 1);
    let shut = tokio::spawn(local.shutdown());
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(!shut.is_finished(), "exited while a replica still drains");
    state.draining.lock().unwrap().clear();
    tokio::time::timeout(Duration::from_secs(5), shut)
        .await
        .expect("shutdown ends once the replica has drained")
        .unwrap();
}

/// A Kubernetes controller whose plans come from the nodes' inventory
/// makes no decision before the first inventory arrives: with no plan, a
/// change would move every replica to a whole-GPU variant. Here the API
/// server answers nothing (503), so no inventory comes, and a queue that
/// asks for five replicas decides nothing and writes no scale; the same
/// controller not planning from the nodes decides at once.
#[tokio::test]
async fn no_decision_before_the_first_inventory_when_plans_come_from_the_nodes() {
    use gpuscale_autoscaler::backend::{Backend, KubeBackend};
    use gpuscale_autoscaler::controller::Controller;
    let (gw, state) = common::stand_in_gateway(common::queues(40)).await;
    let controller_over = |from_nodes: bool| {
        let settings = common::settings(&gw, "", "  tuning: {panicThreshold: 1000}\n");
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let seen = sent.clone();
        tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                seen.lock()
                    .unwrap()
                    .push(format!("{} {}", req.method(), req.uri().path()));
                send.send_response(
                    Response::builder()
                        .status(503)
                        .header("content-type", "application/json")
                        .body(Body::from(
                            br#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":503}"#
                                .to_vec(),
                        ))
                        .unwrap(),
                );
            }
        });
        let client = kube::Client::new(mock, "inference");
        let k = Kube::new(client, spec(), "gpuscale-1".into(), false);
        let gateway = gpuscale_autoscaler::observe::GatewayClient::new(&gw);
        let mut backend = KubeBackend::new(k, gateway.clone());
        if from_nodes {
            backend = backend.inventory_from_nodes();
        }
        (
            Controller::new(settings, gateway, Backend::Kube(backend)),
            sent,
        )
    };
    let (mut waiting, sent) = controller_over(true);
    let report = waiting.report();
    for _ in 0..3 {
        waiting.tick().await;
    }
    assert!(
        report.decisions().is_empty(),
        "{:?}",
        report.decisions().keys()
    );
    assert!(
        !sent.lock().unwrap().iter().any(|r| r.ends_with("/scale")),
        "{:?}",
        sent.lock().unwrap()
    );
    assert!(state.seen.lock().unwrap().is_empty());
    let (mut deciding, _) = controller_over(false);
    let report = deciding.report();
    deciding.tick().await;
    let decided = report.decisions();
    assert_eq!(
        decided
            .get("llama")
            .and_then(|d| d.latest.as_ref())
            .map(|v| v.desired),
        Some(5),
        "{decided:?}"
    );
}

/// Capped at 2 under a queue that asks for 5: the decision says the cap,
/// and the count it works from is the capped one, so the next ticks are no
/// change (the bug: every tick was a change towards 5).
#[tokio::test]
async fn the_local_cap_bounds_the_decision_and_is_not_a_change_every_tick() {
    let d = capped(1, 2, 40).await;
    let latest = d.latest.as_ref().unwrap();
    assert_eq!(latest.desired, 2, "{}", latest.reason);
    assert!(
        latest
            .reason
            .contains("capped at 2 by local.maxReplicasPerModel"),
        "{}",
        latest.reason
    );
    // One change (1 → 2), not one per tick.
    assert_eq!(d.history.len(), 1, "{:?}", d.history);
}

/// A cap below minReplicas wins too: the model runs at the cap from the
/// start and no tick counts as a change.
#[tokio::test]
async fn a_cap_below_min_replicas_is_the_count_from_the_start() {
    let d = capped(3, 2, 0).await;
    let latest = d.latest.as_ref().unwrap();
    assert_eq!(latest.desired, 2, "{}", latest.reason);
    assert!(d.history.is_empty(), "{:?}", d.history);
}

/// `/readyz` fails once metric reads have failed as often as the fallback
/// threshold; `/healthz` fails once the control loop has ended.
#[tokio::test]
async fn readiness_follows_failed_reads_and_liveness_the_control_loop() {
    use gpuscale_autoscaler::backend::{Backend, KubeBackend};
    use gpuscale_autoscaler::controller::Controller;
    // Nothing listens on this port: every read of the gateway fails.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gw = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    let settings = common::settings(&gw, "", "  interval: 100ms\n  tuning: {fallbackAfter: 3}\n");
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    // The API server is down too: every request gets a 503.
    tokio::spawn(async move {
        while let Some((_, send)) = handle.next_request().await {
            send.send_response(
                Response::builder()
                    .status(503)
                    .header("content-type", "application/json")
                    .body(Body::from(
                        br#"{"kind":"Status","apiVersion":"v1","status":"Failure","code":503}"#
                            .to_vec(),
                    ))
                    .unwrap(),
            );
        }
    });
    let client = kube::Client::new(mock, "inference");
    let k = Kube::new(client, spec(), "gpuscale-1".into(), false);
    let gateway = gpuscale_autoscaler::observe::GatewayClient::new(&gw);
    let backend = Backend::Kube(KubeBackend::new(k, gateway.clone()));
    let mut controller = Controller::new(settings, gateway, backend);
    let report = controller.report();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (_admin_stop, admin_stopped) = tokio::sync::watch::channel(false);
    let (admin, _task) = gpuscale_autoscaler::admin::serve(
        "127.0.0.1:0".parse().unwrap(),
        report.clone(),
        admin_stopped,
    )
    .await
    .unwrap();
    assert_eq!(common::admin_get(admin, "/readyz").await.0, 200);
    for failed in 1..=3 {
        assert!(
            report.ready().is_ok(),
            "not ready after {} failure(s)",
            failed - 1
        );
        controller.tick().await;
    }
    let (status, body) = common::admin_get(admin, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("3 metric reads in a row failed"), "{body}");
    assert_eq!(common::admin_get(admin, "/healthz").await.0, 200);
    // The loop ends (here: asked to stop): not alive any more.
    let run = tokio::spawn(controller.run(stopped));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(common::admin_get(admin, "/healthz").await.0, 200);
    stop.send(true).unwrap();
    run.await.unwrap();
    let (status, body) = common::admin_get(admin, "/healthz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("stopped"), "{body}");
}
