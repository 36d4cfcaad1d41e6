//! The embedded default end to end: `gpuscale autoscaler` runs the gateway
//! in-process and simulated model servers as child processes; under load
//! it scales a model up, after the load it scales it back down, and a
//! model at zero comes up on its first request and goes back to zero.
//! Real processes on loopback ports; bounded to about a minute.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A blocking HTTP/1.1 request with `Connection: close`; (status, body).
fn http(addr: &str, method: &str, path: &str, body: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

fn decisions(admin: &str) -> serde_json::Value {
    let (status, body) = http(admin, "GET", "/v1/decisions", "").expect("admin answers");
    assert_eq!(status, 200);
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn wait_for(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Kills the autoscaler if the test fails half way (its simulated servers
/// follow: their stdin closes).
struct Stop(Option<Child>);

impl Drop for Stop {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Simulated servers of one autoscaler still running: processes in the
/// process group the test started it in (its children inherit the group,
/// and keep it when orphaned), so other `sim-server`s on the machine do
/// not count.
fn test_servers(group: u32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            // pid (comm) state ppid pgrp …: the fields after the last `)`.
            let pgrp = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(2))
                .and_then(|g| g.parse::<u32>().ok());
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            pgrp == Some(group) && String::from_utf8_lossy(&cmdline).contains("sim-server")
        })
        .count()
}

#[test]
fn the_local_backend_scales_simulated_servers_up_and_down_under_load() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("policies.yaml"),
        r#"apiVersion: gpuscale.io/v1alpha1
kind: ModelPolicy
metadata: {name: chat}
spec:
  servedName: test/chat
  resources: {memoryGiB: 18, compute: 0.3, maxConcurrency: 2}
  scaling:
    minReplicas: 1
    maxReplicas: 4
    targetQueueDepth: 2
    startupTime: 500ms
    behavior:
      scaleDown: {stabilizationWindow: 3s}
---
apiVersion: gpuscale.io/v1alpha1
kind: ModelPolicy
metadata: {name: embed}
spec:
  servedName: test/embed
  resources: {memoryGiB: 3, compute: 0.05, maxConcurrency: 8}
  scaling:
    minReplicas: 0
    maxReplicas: 2
    targetQueueDepth: 8
    scaleToZeroAfter: 3s
    startupTime: 200ms
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("gateway.yaml"),
        "apiVersion: gpuscale.io/v1alpha1\nkind: Gateway\nmetadata: {name: t}\nspec:\n  listen: 127.0.0.1:0\n  admin: 127.0.0.1:0\n  policies: [policies.yaml]\n  queue: {maxQueue: 1000, queueTimeout: 60s}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("autoscaler.yaml"),
        "apiVersion: gpuscale.io/v1alpha1\nkind: Autoscaler\nmetadata: {name: t}\nspec:\n  policies: [policies.yaml]\n  gateway: {config: gateway.yaml}\n  interval: 500ms\n  admin: 127.0.0.1:0\n  tuning: {stableWindow: 2s}\n  local: {profile: tiny, drainTime: 500ms}\n",
    )
    .unwrap();
    let (child, mut lines) = autoscaler(&dir.path().join("autoscaler.yaml"));
    let mut stop = Stop(Some(child));
    let first = lines.next().unwrap().unwrap();
    let second = lines.next().unwrap().unwrap();
    let addr_after = |line: &str, marker: &str| -> String {
        let rest = line
            .split(marker)
            .nth(1)
            .unwrap_or_else(|| panic!("{line}"));
        rest.trim_start_matches("http://")
            .split([',', ' '])
            .next()
            .unwrap()
            .to_string()
    };
    let traffic = addr_after(&first, "traffic on ");
    let gw_admin = addr_after(&first, "admin on ");
    let admin = addr_after(&second, "admin on ");

    // minReplicas: one chat replica comes up; embed stays at zero.
    wait_for("the first chat replica", Duration::from_secs(15), || {
        let d = decisions(&admin);
        d["chat"]["ready"] == 1 && d["embed"]["desired"] == 0
    });

    // Load: 12 clients, each request ~0.5 s (100 tokens at 200/s), against
    // one replica that serves 2 at once.
    let until = Instant::now() + Duration::from_secs(8);
    let clients: Vec<_> = (0..12)
        .map(|_| {
            let traffic = traffic.clone();
            std::thread::spawn(move || {
                let mut codes = Vec::new();
                while Instant::now() < until {
                    let body = r#"{"model":"test/chat","max_tokens":100,"messages":[{"role":"user","content":"hi"}]}"#;
                    codes.push(http(&traffic, "POST", "/v1/chat/completions", body).map(|r| r.0).unwrap_or(0));
                }
                codes
            })
        })
        .collect();
    let mut peak_ready = 0;
    wait_for("scale-up under load", Duration::from_secs(8), || {
        let d = decisions(&admin);
        peak_ready = peak_ready.max(d["chat"]["ready"].as_u64().unwrap_or(0));
        peak_ready >= 3
    });
    let d = decisions(&admin);
    assert!(
        d["chat"]["reason"]
            .as_str()
            .unwrap()
            .contains("over target 2/replica"),
        "{d}"
    );
    // The changes so far, oldest first, each at a millisecond RFC 3339
    // time (`2026-12-01T00:59:58.123Z`).
    let history = d["chat"]["history"].as_array().expect("a history");
    assert!(!history.is_empty(), "{d}");
    for h in history {
        let at = h["at"].as_str().unwrap();
        assert!(
            at.len() == 24 && at.ends_with('Z') && at.as_bytes()[19] == b'.',
            "{at}"
        );
    }
    let mut answered = 0;
    for c in clients {
        for code in c.join().unwrap() {
            assert_eq!(code, 200, "every request under load is served");
            answered += 1;
        }
    }
    assert!(answered > 20, "{answered}");
    // The gateway saw the replicas the backend registered.
    let (_, queues) = http(&gw_admin, "GET", "/v1/queues", "").unwrap();
    let queues: serde_json::Value = serde_json::from_str(&queues).unwrap();
    assert!(queues["models"]["test/chat"]["replicas"].as_u64().unwrap() >= 3);

    // After the load: back to minReplicas once the windows pass.
    wait_for("scale-down after the load", Duration::from_secs(20), || {
        let d = decisions(&admin);
        d["chat"]["desired"] == 1 && d["chat"]["ready"] == 1
    });

    // From zero: the first embedding request is held, a replica starts,
    // the request is served; idle for the cooldown, back to zero.
    let (status, body) = http(
        &traffic,
        "POST",
        "/v1/embeddings",
        r#"{"model":"test/embed","input":"hello"}"#,
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"embedding\""));
    let d = decisions(&admin);
    assert_eq!(d["embed"]["desired"], 1, "{d}");
    wait_for(
        "scale to zero after the cooldown",
        Duration::from_secs(15),
        || {
            let d = decisions(&admin);
            d["embed"]["desired"] == 0 && d["embed"]["ready"] == 0
        },
    );

    // SIGTERM: the gateway drains first, while the replicas serve: a
    // request in flight finishes, one sent after the signal gets 503
    // with `Retry-After` at once (not a queue for replicas already gone);
    // then the replicas are drained and stopped; exit 0.
    let long = {
        let traffic = traffic.clone();
        std::thread::spawn(move || {
            let body = r#"{"model":"test/chat","max_tokens":300,"messages":[{"role":"user","content":"hi"}]}"#;
            http(&traffic, "POST", "/v1/chat/completions", body).map(|r| r.0)
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let mut child = stop.0.take().unwrap();
    let term = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    std::thread::sleep(Duration::from_millis(300));
    let sent = Instant::now();
    let (code, body) = http(
        &traffic,
        "POST",
        "/v1/chat/completions",
        r#"{"model":"test/chat","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}"#,
    )
    .unwrap();
    assert_eq!(code, 503, "{body}");
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "{:?}",
        sent.elapsed()
    );
    assert_eq!(long.join().unwrap().unwrap(), 200, "the request in flight");
    let group = child.id();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert_eq!(test_servers(group), 0, "simulated servers left running");

    // A parent killed outright takes its servers with it too.
    let (mut child, mut lines) = autoscaler(&dir.path().join("autoscaler.yaml"));
    let _ = lines.next();
    let second = lines.next().unwrap().unwrap();
    let admin = addr_after(&second, "admin on ");
    wait_for("a chat replica", Duration::from_secs(15), || {
        decisions(&admin)["chat"]["ready"] == 1
    });
    let group = child.id();
    assert_eq!(test_servers(group), 1);
    child.kill().unwrap();
    child.wait().unwrap();
    wait_for(
        "the orphaned server to exit",
        Duration::from_secs(5),
        || test_servers(group) == 0,
    );
}

/// PIDs of the simulated servers in a process group.
fn server_pids(group: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_string_lossy().parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let pgrp = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(2))
                .and_then(|g| g.parse::<u32>().ok());
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            // Zombies (state Z) are dead already.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            pgrp == Some(group)
                && state != Some("Z")
                && String::from_utf8_lossy(&cmdline).contains("sim-server")
        })
        .collect();
    pids.sort();
    pids
}

/// A free port below Linux's ephemeral range (32768–60999), so that no
/// server started later with port 0 (the simulated ones) can take it
/// before the gateway binds it.
fn free_port() -> u16 {
    let seed = std::process::id() as u64
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos() as u64;
    (0..2000u64)
        .map(|i| 20_000 + ((seed.wrapping_mul(2_654_435_761) + i * 7919) % 12_000) as u16)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port in 20000-31999")
}

/// `gpuscale autoscaler --config CONFIG` in a process group of its own
/// (its simulated servers inherit it), and the lines of its stdout.
fn autoscaler(
    config: &std::path::Path,
) -> (Child, std::io::Lines<BufReader<std::process::ChildStdout>>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gpuscale"))
        .args(["autoscaler", "--config"])
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("starts");
    let lines = BufReader::new(child.stdout.take().unwrap()).lines();
    (child, lines)
}

fn start_gateway(config: &std::path::Path) -> Child {
    let mut g = Command::new(env!("CARGO_BIN_EXE_gpuscale"))
        .args(["gateway", "--config"])
        .arg(config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("the gateway starts");
    let mut lines = BufReader::new(g.stdout.take().unwrap()).lines();
    let first = lines
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("the gateway did not start"));
    assert!(first.contains("traffic on"), "{first}");
    g
}

/// Endpoints the gateway lists for a model.
fn listed(gw_admin: &str, model: &str) -> Vec<String> {
    let Ok((200, body)) = http(gw_admin, "GET", "/v1/replicas", "") else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let mut out: Vec<String> = v[model]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|r| r["endpoint"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// Reconciliation with a separate gateway: the autoscaler starts before
/// the gateway (registration retried until it is up); a replica process
/// killed is replaced; the gateway killed and started again gets the
/// running replicas registered again and serves; through it all the count
/// stays what was decided.
#[test]
fn the_local_backend_repairs_dead_replicas_and_a_restarted_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let (traffic, gw_admin) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    std::fs::write(dir.path().join("token"), "a-test-token-of-some-length\n").unwrap();
    std::fs::write(
        dir.path().join("policies.yaml"),
        r#"apiVersion: gpuscale.io/v1alpha1
kind: ModelPolicy
metadata: {name: chat}
spec:
  servedName: test/chat
  resources: {memoryGiB: 18, compute: 0.3, maxConcurrency: 4}
  scaling:
    minReplicas: 2
    maxReplicas: 4
    targetQueueDepth: 4
    startupTime: 200ms
"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("gateway.yaml"),
        format!("apiVersion: gpuscale.io/v1alpha1\nkind: Gateway\nmetadata: {{name: t}}\nspec:\n  listen: {traffic}\n  admin: {gw_admin}\n  adminTokenFile: token\n  policies: [policies.yaml]\n  queue: {{maxQueue: 100, queueTimeout: 30s}}\n"),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("autoscaler.yaml"),
        format!("apiVersion: gpuscale.io/v1alpha1\nkind: Autoscaler\nmetadata: {{name: t}}\nspec:\n  policies: [policies.yaml]\n  gateway: {{admin: \"http://{gw_admin}\", adminTokenFile: token}}\n  interval: 300ms\n  admin: 127.0.0.1:0\n  local: {{profile: tiny, drainTime: 200ms}}\n"),
    )
    .unwrap();

    // The autoscaler first, with no gateway to register with.
    let (child, mut lines) = autoscaler(&dir.path().join("autoscaler.yaml"));
    let group = child.id();
    let _stop = Stop(Some(child));
    let line = lines.next().unwrap().unwrap();
    let admin = line
        .split("admin on http://")
        .nth(1)
        .and_then(|r| r.split([' ', ',']).next())
        .unwrap_or_else(|| panic!("{line}"))
        .to_string();
    wait_for("two servers started", Duration::from_secs(10), || {
        server_pids(group).len() == 2
    });
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(
        decisions(&admin)["chat"]["ready"],
        0,
        "ready with no gateway"
    );

    // The gateway comes up: both replicas registered (retried).
    let mut gateway = Stop(Some(start_gateway(&dir.path().join("gateway.yaml"))));
    wait_for("both replicas registered", Duration::from_secs(15), || {
        listed(&gw_admin, "test/chat").len() == 2 && decisions(&admin)["chat"]["ready"] == 2
    });
    let chat =
        r#"{"model":"test/chat","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}"#;
    assert_eq!(
        http(&traffic, "POST", "/v1/chat/completions", chat)
            .unwrap()
            .0,
        200
    );

    // A replica process dies: another takes its place.
    let before = server_pids(group);
    assert_eq!(before.len(), 2);
    let killed = before[0];
    assert!(
        Command::new("kill")
            .args(["-KILL", &killed.to_string()])
            .status()
            .unwrap()
            .success()
    );
    wait_for("the dead replica replaced", Duration::from_secs(15), || {
        let now = server_pids(group);
        now.len() == 2
            && !now.contains(&killed)
            && listed(&gw_admin, "test/chat").len() == 2
            && decisions(&admin)["chat"]["ready"] == 2
    });
    assert_eq!(decisions(&admin)["chat"]["desired"], 2);

    // The gateway dies and comes back empty: the replicas register again
    // and requests are served.
    let pids = server_pids(group);
    if let Some(mut g) = gateway.0.take() {
        g.kill().unwrap();
        g.wait().unwrap();
    }
    std::thread::sleep(Duration::from_secs(1));
    gateway = Stop(Some(start_gateway(&dir.path().join("gateway.yaml"))));
    wait_for(
        "the replicas registered again",
        Duration::from_secs(15),
        || listed(&gw_admin, "test/chat").len() == 2,
    );
    assert_eq!(
        http(&traffic, "POST", "/v1/chat/completions", chat)
            .unwrap()
            .0,
        200
    );
    // The same processes: nothing was restarted, nothing added.
    assert_eq!(server_pids(group), pids);
    wait_for("ready 2 of 2 again", Duration::from_secs(5), || {
        let d = decisions(&admin);
        d["chat"]["desired"] == 2 && d["chat"]["ready"] == 2
    });
    drop(gateway);
}
