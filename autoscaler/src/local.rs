//! The local backend: each replica is a simulated model server process
//! (`gpuscale sim-server`) on a free loopback port, registered with the
//! gateway once its start-up delay has passed, and on removal deregistered,
//! given `drainTime` to finish its requests, then stopped. What the
//! embedded default runs on a laptop.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use gpuscale_policies::Model;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::LocalSpec;
use crate::observe::GatewayClient;

struct Replica {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

struct Pool {
    replicas: Vec<Replica>,
    ready: Arc<AtomicU32>,
}

/// Runs replicas as local processes.
pub struct LocalBackend {
    exe: PathBuf,
    gateway: GatewayClient,
    spec: LocalSpec,
    pools: BTreeMap<String, Pool>,
}

impl LocalBackend {
    /// A backend that starts `exe sim-server …` and registers with
    /// `gateway`.
    pub fn new(exe: PathBuf, gateway: GatewayClient, spec: LocalSpec) -> Self {
        LocalBackend {
            exe,
            gateway,
            spec,
            pools: BTreeMap::new(),
        }
    }

    /// Replicas asked for, per policy name (starting ones included).
    pub fn desired(&self) -> BTreeMap<String, u32> {
        self.pools
            .iter()
            .map(|(k, p)| (k.clone(), p.replicas.len() as u32))
            .collect()
    }

    /// Replicas registered and serving, per policy name.
    pub fn ready(&self) -> BTreeMap<String, u32> {
        self.pools
            .iter()
            .map(|(k, p)| (k.clone(), p.ready.load(Ordering::Relaxed)))
            .collect()
    }

    /// Brings a model to `replicas` (capped at `maxReplicasPerModel`):
    /// starts new ones (they register when started), or stops the newest.
    pub fn scale(&mut self, model: &Model, replicas: u32) {
        let replicas = replicas.min(self.spec.max_replicas_per_model);
        let pool = self
            .pools
            .entry(model.name.clone())
            .or_insert_with(|| Pool {
                replicas: Vec::new(),
                ready: Arc::new(AtomicU32::new(0)),
            });
        while pool.replicas.len() > replicas as usize {
            if let Some(mut r) = pool.replicas.pop()
                && let Some(stop) = r.stop.take()
            {
                let _ = stop.send(());
            }
        }
        while pool.replicas.len() < replicas as usize {
            let (stop, stopped) = oneshot::channel();
            let task = tokio::spawn(run_replica(
                self.exe.clone(),
                self.gateway.clone(),
                self.spec.clone(),
                model.clone(),
                pool.ready.clone(),
                stopped,
            ));
            pool.replicas.push(Replica {
                stop: Some(stop),
                task,
            });
        }
    }

    /// Stops every replica and waits for them (deregistered, drained).
    pub async fn shutdown(mut self) {
        let mut tasks = Vec::new();
        for pool in self.pools.values_mut() {
            for mut r in pool.replicas.drain(..) {
                if let Some(stop) = r.stop.take() {
                    let _ = stop.send(());
                }
                tasks.push(r.task);
            }
        }
        for t in tasks {
            let _ = t.await;
        }
    }
}

/// One replica's life: start the process, wait out the start-up delay,
/// register, serve until stopped, deregister, drain, stop.
async fn run_replica(
    exe: PathBuf,
    gateway: GatewayClient,
    spec: LocalSpec,
    model: Model,
    ready: Arc<AtomicU32>,
    mut stopped: oneshot::Receiver<()>,
) {
    let started = tokio::time::Instant::now();
    let mut child = match Command::new(&exe)
        .args(["sim-server", "--port", "0", "--profile", &spec.profile])
        .args(["--model", &model.served_name])
        .args(["--max-concurrency", &model.max_concurrency.to_string()])
        // The pipe is the lifeline: if this process dies, however it dies,
        // the server sees its stdin close and exits.
        .arg("--exit-with-stdin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(model = %model.name, "cannot start {}: {e}", exe.display());
            return;
        }
    };
    // Held here, not in `child`: `Child::wait` closes the child's stdin.
    let _lifeline = child.stdin.take();
    let Some(stdout) = child.stdout.take() else {
        return;
    };
    let mut lines = BufReader::new(stdout).lines();
    let endpoint = tokio::select! {
        line = lines.next_line() => match line {
            Ok(Some(l)) => l.rsplit(' ').next().map(str::to_string),
            _ => None,
        },
        _ = &mut stopped => None,
    };
    let Some(endpoint) = endpoint else {
        let _ = child.kill().await;
        return;
    };
    let startup = spec.startup_time.unwrap_or(model.scaling.startup_time);
    tokio::select! {
        _ = tokio::time::sleep_until(started + startup) => {}
        _ = &mut stopped => {
            let _ = child.kill().await;
            return;
        }
    }
    if let Err(e) = gateway
        .replica(
            true,
            &model.served_name,
            &endpoint,
            Some(model.max_concurrency),
        )
        .await
    {
        tracing::error!(model = %model.name, "registering {endpoint}: {e}");
        let _ = child.kill().await;
        return;
    }
    ready.fetch_add(1, Ordering::Relaxed);
    tracing::info!(model = %model.name, %endpoint, "replica ready");
    tokio::select! {
        _ = &mut stopped => {}
        _ = child.wait() => {
            tracing::warn!(model = %model.name, %endpoint, "replica exited");
        }
    }
    ready.fetch_sub(1, Ordering::Relaxed);
    let _ = gateway
        .replica(false, &model.served_name, &endpoint, None)
        .await;
    tokio::time::sleep(spec.drain_time).await;
    let _ = child.kill().await;
    tracing::info!(model = %model.name, %endpoint, "replica stopped");
}
