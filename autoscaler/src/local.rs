//! The local backend: each replica is a simulated model server process
//! (`gpuscale sim-server`) on a free loopback port, registered with the
//! gateway once its start-up delay has passed, and on removal deregistered
//! and stopped once its requests are done (the gateway lists it, draining,
//! until then), or at `drainTime`. What the embedded default runs on a
//! laptop.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use gpuscale_policies::Model;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::sync::{Notify, oneshot, watch};
use tokio::task::JoinHandle;

use crate::config::LocalSpec;
use crate::observe::GatewayClient;

/// First pause after a failed registration; doubled per failure up to
/// [`REGISTER_BACKOFF_MAX`].
pub const REGISTER_BACKOFF: Duration = Duration::from_millis(250);
/// Longest pause between registration attempts.
pub const REGISTER_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// What a replica's task and the reconciler share.
#[derive(Default)]
struct Link {
    /// `http://127.0.0.1:PORT` once the server has said where it listens.
    endpoint: std::sync::Mutex<Option<String>>,
    /// The gateway has taken it (as far as this process knows).
    registered: AtomicBool,
    /// Wakes the task to register again (the gateway lost it).
    reregister: Notify,
}

struct Replica {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    link: Arc<Link>,
    /// The speed it was last given (none: its profile's own).
    speed: Option<f64>,
    /// Tells its task a new speed, which it passes to the server.
    retune: watch::Sender<Option<f64>>,
}

#[derive(Default)]
struct Pool {
    replicas: Vec<Replica>,
    /// The count asked for (capped).
    wanted: u32,
    /// Spare replicas run beside them (`gpuscale_packer::spare`).
    spares: u32,
}

/// What one reconciliation found and did, per policy name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Repairs {
    /// Replica processes found dead and started again.
    pub replaced: BTreeMap<String, u32>,
    /// Replicas the gateway had lost, registered again.
    pub reregistered: BTreeMap<String, u32>,
    /// Registrations no replica owned, removed from the gateway.
    pub removed: BTreeMap<String, u32>,
}

/// Runs replicas as local processes.
pub struct LocalBackend {
    exe: PathBuf,
    gateway: GatewayClient,
    spec: LocalSpec,
    pools: BTreeMap<String, Pool>,
    /// Per model, the plan's speed of each replica (H100 units).
    speeds: BTreeMap<String, Vec<f64>>,
    /// Replicas stopped and still draining: their tasks deregister them
    /// and stop their servers once their requests are done, and
    /// [`LocalBackend::shutdown`] waits for them.
    draining: Vec<JoinHandle<()>>,
    /// Set at shutdown when the only gateway runs in this process and
    /// has stopped first: replicas then stop without deregistering (its
    /// list is gone with it) or waiting for it.
    exiting: Option<Arc<AtomicBool>>,
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
            speeds: BTreeMap::new(),
            draining: Vec::new(),
            exiting: None,
        }
    }

    /// The gateway it registers with runs in this process, alone, and
    /// stops before it: at [`LocalBackend::shutdown`] replicas stop at
    /// once, without deregistering from a gateway already gone (every
    /// attempt was a connection refused, logged per replica).
    pub fn with_embedded_gateway(mut self) -> Self {
        self.exiting = Some(Arc::new(AtomicBool::new(false)));
        self
    }

    /// The speeds of the packer's replicas, per model
    /// ([`crate::controller::speeds`]). The local backend has no
    /// placements, so a plan's move is a change of speed in place: each
    /// model's replicas are given the plan's speeds, those already at one
    /// of them keeping it ([`match_speeds`]), and a running server takes
    /// its new speed at once (a `speed S` line on its standard input). A
    /// replica started later takes one of the speeds left over
    /// (`sim-server --speed`; 1 is the profile's own).
    pub fn set_speeds(&mut self, speeds: BTreeMap<String, Vec<f64>>) {
        self.speeds = speeds;
        for (name, pool) in &mut self.pools {
            let wanted = self.speeds.get(name).map_or(&[][..], Vec::as_slice);
            retune(pool, wanted, 0);
        }
    }

    /// The speed each replica of `model` was last given, in start order
    /// (none: its profile's own).
    pub fn replica_speeds(&self, model: &str) -> Vec<Option<f64>> {
        self.pools
            .get(model)
            .map(|p| p.replicas.iter().map(|r| r.speed).collect())
            .unwrap_or_default()
    }

    /// The most replicas this backend runs per model
    /// (`local.maxReplicasPerModel`).
    pub fn cap(&self) -> u32 {
        self.spec.max_replicas_per_model
    }

    /// Replicas asked for, per policy name (starting ones included).
    pub fn desired(&self) -> BTreeMap<String, u32> {
        self.pools
            .iter()
            .map(|(k, p)| (k.clone(), p.wanted))
            .collect()
    }

    /// Replicas registered and serving, per policy name.
    pub fn ready(&self) -> BTreeMap<String, u32> {
        self.pools
            .iter()
            .map(|(k, p)| {
                let n = p
                    .replicas
                    .iter()
                    .filter(|r| r.link.registered.load(Ordering::Relaxed))
                    .count();
                (k.clone(), n as u32)
            })
            .collect()
    }

    /// The replicas the backend starts with: as [`LocalBackend::scale`],
    /// without the start-up delay when `local.warmStart` is set.
    pub fn scale_initial(&mut self, model: &Model, replicas: u32) {
        self.scale_with(model, replicas, self.spec.warm_start);
    }

    /// Brings a model to `replicas` (capped at `maxReplicasPerModel`):
    /// starts new ones (they register when started), or stops the newest.
    pub fn scale(&mut self, model: &Model, replicas: u32) {
        self.scale_with(model, replicas, false);
    }

    /// Brings a model to `replicas` wanted and `spares` more (spare
    /// replicas last, so a scale-down stops them first), all capped at
    /// `maxReplicasPerModel`; [`LocalBackend::desired`] stays `replicas`.
    pub fn scale_with_spares(&mut self, model: &Model, replicas: u32, spares: u32) {
        self.pools.entry(model.name.clone()).or_default().spares = spares;
        self.scale_with(model, replicas, false);
    }

    fn scale_with(&mut self, model: &Model, replicas: u32, warm: bool) {
        let wanted = replicas.min(self.spec.max_replicas_per_model);
        let pool = self.pools.entry(model.name.clone()).or_default();
        pool.wanted = wanted;
        let replicas = wanted
            .saturating_add(pool.spares)
            .min(self.spec.max_replicas_per_model);
        // A replica whose process is gone goes first (the reconciler has
        // not replaced it yet): stopping a healthy one in its place would
        // leave the model a replica short until the replacement starts.
        while pool.replicas.len() > replicas as usize
            && let Some(k) = pool.replicas.iter().position(|r| r.task.is_finished())
        {
            pool.replicas.remove(k);
        }
        while pool.replicas.len() > replicas as usize {
            if let Some(mut r) = pool.replicas.pop() {
                if let Some(stop) = r.stop.take() {
                    let _ = stop.send(());
                }
                self.draining.push(r.task);
            }
        }
        let add = (replicas as usize).saturating_sub(pool.replicas.len());
        let wanted = self.speeds.get(&model.name).map_or(&[][..], Vec::as_slice);
        for speed in retune(pool, wanted, add) {
            let (stop, stopped) = oneshot::channel();
            let (retune, speeds) = watch::channel(speed);
            let link = Arc::new(Link::default());
            let task = tokio::spawn(run_replica(
                self.exe.clone(),
                self.gateway.clone(),
                self.spec.clone(),
                model.clone(),
                Start {
                    speeds,
                    warm,
                    exiting: self.exiting.clone(),
                },
                link.clone(),
                stopped,
            ));
            pool.replicas.push(Replica {
                stop: Some(stop),
                task,
                link,
                speed,
                retune,
            });
        }
        self.draining.retain(|t| !t.is_finished());
    }

    /// One reconciliation: what runs against what was asked for, and what
    /// the gateway lists against what was registered. A replica whose
    /// process has died is started again; one the gateway no longer
    /// lists (it restarted, or someone removed it) registers again. When
    /// the gateway cannot be read, registrations are left as they are
    /// (each replica's own task retries its registration with backoff).
    pub async fn reconcile(&mut self, models: &[Model]) -> Repairs {
        let mut repairs = Repairs::default();
        for m in models {
            let Some(pool) = self.pools.get_mut(&m.name) else {
                continue;
            };
            let before = pool.replicas.len();
            pool.replicas.retain(|r| !r.task.is_finished());
            let dead = (before - pool.replicas.len()) as u32;
            if dead > 0 {
                tracing::warn!(model = %m.name, dead, "replica process(es) gone; starting replacements");
                repairs.replaced.insert(m.name.clone(), dead);
                let wanted = pool.wanted;
                self.scale(m, wanted);
            }
        }
        // Which replicas were registered *before* the list is read: one
        // that registers while the list is in flight is not on it, and is
        // not lost.
        let registered_before: Vec<Vec<bool>> = models
            .iter()
            .map(|m| {
                self.pools.get(&m.name).map_or_else(Vec::new, |p| {
                    p.replicas
                        .iter()
                        .map(|r| r.link.registered.load(Ordering::Relaxed))
                        .collect()
                })
            })
            .collect();
        let Ok(lists) = self.gateway.replica_lists().await else {
            return repairs;
        };
        let listed = &lists.everywhere;
        for (m, before) in models.iter().zip(&registered_before) {
            let Some(pool) = self.pools.get(&m.name) else {
                continue;
            };
            // Registered through the gateway's API, not draining, and no
            // replica's of this backend: left by a replica whose removal
            // failed, or by an earlier run. Removed.
            let owned: BTreeSet<String> = pool
                .replicas
                .iter()
                .filter_map(|r| {
                    r.link
                        .endpoint
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone()
                })
                .collect();
            let stale: Vec<String> = lists
                .registered
                .get(&m.served_name)
                .map(|r| r.difference(&owned).cloned().collect())
                .unwrap_or_default();
            for e in &stale {
                match self.gateway.replica(false, &m.served_name, e, None).await {
                    Ok(()) => {
                        tracing::warn!(model = %m.name, endpoint = %e, "a registration no replica owns: removed");
                        *repairs.removed.entry(m.name.clone()).or_default() += 1;
                    }
                    Err(err) => {
                        tracing::warn!(model = %m.name, endpoint = %e, "removing a registration no replica owns: {err}")
                    }
                }
            }
            let known: BTreeSet<&str> = listed
                .get(&m.served_name)
                .map(|v| v.iter().map(String::as_str).collect())
                .unwrap_or_default();
            let mut lost = 0;
            for (k, r) in pool.replicas.iter().enumerate() {
                let endpoint = r
                    .link
                    .endpoint
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                if let Some(e) = endpoint
                    && before.get(k).copied().unwrap_or(false)
                    && r.link.registered.load(Ordering::Relaxed)
                    && !known.contains(e.as_str())
                {
                    r.link.registered.store(false, Ordering::Relaxed);
                    r.link.reregister.notify_one();
                    lost += 1;
                }
            }
            if lost > 0 {
                tracing::warn!(model = %m.name, lost, "the gateway lost replica(s); registering them again");
                repairs.reregistered.insert(m.name.clone(), lost);
            }
        }
        repairs
    }

    /// Replicas stopped whose requests are still draining.
    pub fn draining(&self) -> usize {
        self.draining.iter().filter(|t| !t.is_finished()).count()
    }

    /// Stops every replica and waits for them, and for those already
    /// stopping (deregistered, drained: each within `drainTime`).
    pub async fn shutdown(mut self) {
        if let Some(e) = &self.exiting {
            e.store(true, Ordering::Relaxed);
        }
        let mut tasks = std::mem::take(&mut self.draining);
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

/// Gives `pool`'s replicas the plan's speeds `wanted` ([`match_speeds`])
/// and returns the speeds of `add` replicas about to start after them.
/// A running replica whose speed changes is told.
fn retune(pool: &mut Pool, wanted: &[f64], add: usize) -> Vec<Option<f64>> {
    let mut current: Vec<Option<f64>> = pool.replicas.iter().map(|r| r.speed).collect();
    current.extend(std::iter::repeat_n(None, add));
    let mut given = match_speeds(&current, wanted);
    let new = given.split_off(pool.replicas.len());
    for (r, s) in pool.replicas.iter_mut().zip(given) {
        if r.speed != s {
            r.speed = s;
            r.retune.send_replace(s);
        }
    }
    new
}

/// Which of the plan's speeds `wanted` each replica runs at, given the
/// speeds `current` they run at (none: not given one). A replica at one
/// of the wanted speeds keeps it, each wanted speed going to one replica;
/// the others take the speeds left, in order; when none is left a
/// replica keeps its own. So a re-plan that only reorders a model's
/// replicas changes no speed, and one that moves one replica changes
/// one.
pub fn match_speeds(current: &[Option<f64>], wanted: &[f64]) -> Vec<Option<f64>> {
    const SAME: f64 = 1e-6;
    let mut left: Vec<Option<f64>> = wanted.iter().copied().map(Some).collect();
    let mut out: Vec<Option<f64>> = vec![None; current.len()];
    let mut kept = vec![false; current.len()];
    for (k, c) in current.iter().enumerate() {
        let Some(c) = c else { continue };
        if let Some(slot) = left
            .iter_mut()
            .find(|w| w.is_some_and(|w| (w - c).abs() <= SAME))
        {
            out[k] = slot.take();
            kept[k] = true;
        }
    }
    let mut rest = left.into_iter().flatten();
    for k in 0..current.len() {
        if !kept[k] {
            out[k] = rest.next().or(current[k]);
        }
    }
    out
}

/// How a replica starts.
struct Start {
    /// Its speed (`sim-server --speed`; none: the profile's own), and
    /// every later one, passed to the server as it changes.
    speeds: watch::Receiver<Option<f64>>,
    /// Without the start-up delay.
    warm: bool,
    /// Set: the process is exiting and its gateway is gone
    /// ([`LocalBackend::with_embedded_gateway`]).
    exiting: Option<Arc<AtomicBool>>,
}

/// One replica's life: start the process, wait out the start-up delay,
/// register (again after every failure, with backoff, and whenever the
/// reconciler finds the gateway has lost it), serve until stopped or the
/// process dies, deregister, drain, stop.
async fn run_replica(
    exe: PathBuf,
    gateway: GatewayClient,
    spec: LocalSpec,
    model: Model,
    start: Start,
    link: Arc<Link>,
    mut stopped: oneshot::Receiver<()>,
) {
    let started = tokio::time::Instant::now();
    let mut speeds = start.speeds;
    let mut command = Command::new(&exe);
    command.args(["sim-server", "--port", "0", "--profile", &spec.profile]);
    if let Some(s) = speed_arg(*speeds.borrow_and_update()) {
        command.args(["--speed", &s]);
    }
    let mut child = match command
        .args(["--model", &model.served_name])
        .args(model.adapters.iter().flat_map(|a| ["--lora", a.as_str()]))
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
            // Not at once again: the reconciler's next tick retries.
            let _ = tokio::time::timeout(REGISTER_BACKOFF_MAX, &mut stopped).await;
            return;
        }
    };
    // Held here, not in `child`: `Child::wait` closes the child's stdin.
    // Speed changes are written to it.
    let mut lifeline = child.stdin.take();
    let Some(stdout) = child.stdout.take() else {
        return;
    };
    let mut lines = BufReader::new(stdout).lines();
    // A server that never says where it listens is stopped (and the
    // reconciler starts another).
    let endpoint = tokio::select! {
        line = lines.next_line() => match line {
            Ok(Some(l)) => l.rsplit(' ').next().map(str::to_string),
            _ => None,
        },
        _ = tokio::time::sleep(LISTEN_LIMIT) => {
            tracing::warn!(model = %model.name, "replica did not say where it listens within {LISTEN_LIMIT:?}; stopped");
            None
        }
        _ = &mut stopped => None,
    };
    let Some(endpoint) = endpoint else {
        let _ = child.kill().await;
        return;
    };
    *link.endpoint.lock().unwrap_or_else(|e| e.into_inner()) = Some(endpoint.clone());
    let startup = if start.warm {
        Duration::ZERO
    } else {
        spec.startup_time.unwrap_or(model.scaling.startup_time)
    };
    tokio::select! {
        _ = tokio::time::sleep_until(started + startup) => {}
        _ = &mut stopped => {
            let _ = child.kill().await;
            return;
        }
        // Gone while starting: the task ends, and the reconciler starts
        // another (it used to be noticed only after its start-up time).
        _ = child.wait() => {
            tracing::warn!(model = %model.name, %endpoint, "replica exited while starting");
            return;
        }
    }
    let mut backoff = REGISTER_BACKOFF;
    let mut ever = false;
    let mut died = false;
    // A registration was asked for: one that failed on one gateway
    // instance, or timed out after the gateway took it, may stand there.
    let mut asked = false;
    // Health checks failed in a row.
    let mut unhealthy = 0;
    let checks = !spec.health_check_every.is_zero();
    let mut check = tokio::time::interval(if checks {
        spec.health_check_every
    } else {
        Duration::from_secs(3600)
    });
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    check.reset();
    loop {
        if !link.registered.load(Ordering::Relaxed) {
            asked = true;
            match gateway
                .replica(
                    true,
                    &model.served_name,
                    &endpoint,
                    Some(model.max_concurrency),
                )
                .await
            {
                Ok(()) => {
                    link.registered.store(true, Ordering::Relaxed);
                    backoff = REGISTER_BACKOFF;
                    if ever {
                        tracing::info!(model = %model.name, %endpoint, "replica registered again");
                    } else {
                        tracing::info!(model = %model.name, %endpoint, "replica ready");
                    }
                    ever = true;
                }
                Err(e) => {
                    tracing::warn!(model = %model.name, "registering {endpoint} (retry in {backoff:?}): {e}");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = &mut stopped => break,
                        _ = child.wait() => {
                            tracing::warn!(model = %model.name, %endpoint, "replica exited");
                            died = true;
                            break;
                        }
                    }
                    backoff = (backoff * 2).min(REGISTER_BACKOFF_MAX);
                    continue;
                }
            }
        }
        tokio::select! {
            _ = &mut stopped => break,
            _ = child.wait() => {
                tracing::warn!(model = %model.name, %endpoint, "replica exited");
                died = true;
                break;
            }
            () = link.reregister.notified() => {}
            Ok(()) = speeds.changed() => {
                let s = speed_arg(*speeds.borrow_and_update());
                if let (Some(s), Some(pipe)) = (s, lifeline.as_mut()) {
                    use tokio::io::AsyncWriteExt;
                    if let Err(e) = pipe.write_all(format!("speed {s}\n").as_bytes()).await {
                        tracing::warn!(model = %model.name, %endpoint, "telling the replica its speed: {e}");
                    } else {
                        tracing::info!(model = %model.name, %endpoint, speed = %s, "replica's speed changed");
                    }
                }
            }
            _ = check.tick(), if checks => {
                let health = answers_health(&endpoint).await;
                if health == Health::Unknown {
                    // This process is out of sockets: nothing is known
                    // of the replica, and a replacement could not start.
                    tracing::warn!(model = %model.name, %endpoint, "health check not made: this process is out of file descriptors or memory");
                } else if health == Health::Answers {
                    unhealthy = 0;
                } else {
                    unhealthy += 1;
                    if unhealthy >= HEALTH_FAILURES {
                        // It runs and takes connections, and answers none:
                        // its requests would each wait out the gateway's
                        // timeout. Stopped; the reconciler replaces it.
                        tracing::warn!(model = %model.name, %endpoint, "replica failed {HEALTH_FAILURES} health checks in a row; stopped, to be replaced");
                        let _ = child.kill().await;
                        died = true;
                        break;
                    }
                }
            }
        }
    }
    let was = link.registered.swap(false, Ordering::Relaxed);
    let gone = start
        .exiting
        .as_ref()
        .is_some_and(|e| e.load(Ordering::Relaxed));
    if gone {
        let _ = child.kill().await;
        tracing::info!(model = %model.name, %endpoint, "replica stopped");
        return;
    }
    if was || ever || asked {
        // Tried a few times: a registration left behind keeps a dead
        // address in the gateway's rotation.
        for attempt in 0..DEREGISTER_TRIES {
            match gateway
                .replica(false, &model.served_name, &endpoint, None)
                .await
            {
                Ok(()) => break,
                Err(e) if attempt + 1 == DEREGISTER_TRIES => {
                    tracing::warn!(model = %model.name, %endpoint, "deregistering: {e}");
                }
                Err(_) => tokio::time::sleep(REGISTER_BACKOFF).await,
            }
        }
    }
    if !died {
        // Requests in flight finish before the server stops: the gateway
        // lists a deregistered replica (draining) until its last request
        // has ended, and the server stops then, or at `drainTime`. A
        // gateway that cannot be read sends it nothing more.
        let until = tokio::time::Instant::now() + spec.drain_time;
        loop {
            let listed = match gateway.replica_lists().await {
                Ok(l) => l
                    .anywhere
                    .get(&model.served_name)
                    .is_some_and(|e| e.contains(&endpoint)),
                Err(_) => false,
            };
            let now = tokio::time::Instant::now();
            if !listed || now >= until {
                break;
            }
            tokio::time::sleep(DRAIN_POLL.min(until - now)).await;
        }
        let _ = child.kill().await;
    }
    tracing::info!(model = %model.name, %endpoint, "replica stopped");
}

/// A speed as `sim-server` takes it: finite, positive, within [0.01, 1],
/// four decimals.
fn speed_arg(speed: Option<f64>) -> Option<String> {
    speed
        .filter(|s| s.is_finite() && *s > 0.0)
        .map(|s| format!("{:.4}", s.clamp(0.01, 1.0)))
}

/// Health checks failed in a row that stop a replica.
const HEALTH_FAILURES: u32 = 3;

/// How long a health check waits for its answer.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(2);

/// What a health check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    /// `GET /health` answered 200 in time.
    Answers,
    /// Anything else from the replica (refused, an error, silence).
    Fails,
    /// The check could not be made here: this process is out of file
    /// descriptors or memory (`EMFILE`, `ENFILE`, `ENOMEM`, `ENOBUFS`),
    /// which says nothing of the replica.
    Unknown,
}

/// Whether the server at `endpoint` (`http://IP:PORT`) answers `GET
/// /health` with 200 within [`HEALTH_TIMEOUT`].
async fn answers_health(endpoint: &str) -> Health {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Some(authority) = endpoint.strip_prefix("http://") else {
        return Health::Fails;
    };
    let ask = async {
        let mut s = match tokio::net::TcpStream::connect(authority).await {
            Ok(s) => s,
            Err(e) if local_shortage(&e) => return Health::Unknown,
            Err(_) => return Health::Fails,
        };
        let asked = s
            .write_all(
                format!("GET /health HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await;
        let mut head = [0u8; 12];
        if asked.is_err() || s.read_exact(&mut head).await.is_err() {
            return Health::Fails;
        }
        if head.starts_with(b"HTTP/1.1 200") || head.starts_with(b"HTTP/1.0 200") {
            Health::Answers
        } else {
            Health::Fails
        }
    };
    tokio::time::timeout(HEALTH_TIMEOUT, ask)
        .await
        .unwrap_or(Health::Fails)
}

/// Whether `e` is this process running out of something (file
/// descriptors, memory, buffers) rather than a peer's answer.
fn local_shortage(e: &std::io::Error) -> bool {
    // EMFILE 24, ENFILE 23, ENOMEM 12, ENOBUFS 105 (Linux), 55 (BSDs).
    matches!(e.raw_os_error(), Some(24 | 23 | 12 | 105 | 55))
        || e.kind() == std::io::ErrorKind::OutOfMemory
}

/// How long a starting server has to say where it listens.
const LISTEN_LIMIT: Duration = Duration::from_secs(60);

/// Attempts at deregistering a stopped replica.
const DEREGISTER_TRIES: u32 = 3;

/// How often a stopping replica asks the gateway whether its requests
/// are done.
const DRAIN_POLL: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::{local_shortage, match_speeds};

    #[test]
    fn running_out_of_sockets_here_says_nothing_of_the_replica() {
        let here = |code| local_shortage(&std::io::Error::from_raw_os_error(code));
        assert!(here(24), "EMFILE");
        assert!(here(23), "ENFILE");
        assert!(!here(111), "ECONNREFUSED is the replica's");
        assert!(!here(110), "ETIMEDOUT is the replica's");
    }

    #[test]
    fn replicas_at_a_wanted_speed_keep_it_and_the_others_take_what_is_left() {
        // A re-plan that only reorders: nothing changes.
        assert_eq!(
            match_speeds(&[Some(0.5), Some(1.0)], &[1.0, 0.5]),
            [Some(0.5), Some(1.0)]
        );
        // One replica moved from a whole GPU to a 3g slice: only it changes.
        assert_eq!(
            match_speeds(&[Some(0.5), Some(1.0), Some(0.5)], &[0.5, 0.5, 3.0 / 7.0]),
            [Some(0.5), Some(3.0 / 7.0), Some(0.5)]
        );
        // Two at one speed, the plan keeps one there.
        assert_eq!(
            match_speeds(&[Some(0.25), Some(0.25)], &[0.25, 1.0]),
            [Some(0.25), Some(1.0)]
        );
        // New replicas (none yet) take the speeds left, in order.
        assert_eq!(
            match_speeds(&[Some(1.0), None, None], &[0.5, 1.0, 0.25]),
            [Some(1.0), Some(0.5), Some(0.25)]
        );
        // Fewer speeds than replicas (a spare the plan does not list):
        // the rest keep their own.
        assert_eq!(
            match_speeds(&[Some(0.5), Some(0.75), None], &[0.75]),
            [Some(0.5), Some(0.75), None]
        );
        assert_eq!(match_speeds(&[], &[1.0]), Vec::<Option<f64>>::new());
    }
}
