//! Running a sink or a watcher as an identity of a fleet (`--coordinator`):
//! wait as a standby, claim the identity, check and lock its state, act,
//! and stop acting in time when the lease cannot be kept.
//!
//! A process that must stop acting (its fence deadline passed, or etcd
//! says its lease is gone) cannot prove which of its threads still hold
//! state or have work under way, so it does not try to unwind them: it
//! replaces itself with a fresh image of the same program and arguments
//! (`exec`), which ends every thread at once, closes every descriptor (the
//! state directory's lock with them) and starts over as a standby.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use fleet::lease::LeaseClock;
use fleet::{Coordinator, CoordinatorConfig, EtcdTls, HeldLease, Kind, Member, Role, RoleStatus};

use crate::parse::parse_duration;
use crate::process::say;

/// What to do when etcd cannot be reached at startup.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum WhenUnreachable {
    /// Say which endpoints failed and keep trying.
    Wait,
    /// Say which endpoints failed and exit.
    Exit,
}

/// A fleet's coordinator (`[sink]`/`[watch]` keys of the same names).
#[derive(Args, Clone)]
pub struct FleetArgs {
    /// Coordinate through etcd: etcd://h1:2379,h2:2379,h3:2379 (etcds://
    /// for TLS). With --identity this process acts for that identity only
    /// while it holds its lease, and waits as a standby otherwise; a
    /// watcher without --identity only finds its sinks there.
    #[arg(global = true, long)]
    coordinator: Option<String>,
    /// The cluster's name: keys live under /tailflight/<cluster>/.
    #[arg(global = true, long, default_value = "default")]
    cluster: String,
    /// The identity this process acts for. Its --state must be on storage
    /// every candidate host mounts (Lustre, GPFS, NFS): a successor starts
    /// from it.
    #[arg(global = true, long, requires = "coordinator")]
    identity: Option<String>,
    /// The lease's time to live: a dead active process holds its identity
    /// this long at most; it stops acting a fifth of it (at least 0.5 s)
    /// before, by its own clock, when it cannot renew.
    #[arg(global = true, long, default_value = "10s", value_parser = parse_duration)]
    lease_ttl: Duration,
    /// When etcd cannot be reached at startup: wait (retry) or exit.
    #[arg(global = true, long, value_enum, default_value = "wait")]
    coordinator_unreachable: WhenUnreachable,
    /// etcd user (authentication enabled); the password comes from
    /// TAILFLIGHT_ETCD_PASSWORD.
    #[arg(global = true, long, requires = "coordinator")]
    etcd_user: Option<String>,
    #[arg(
        long,
        env = "TAILFLIGHT_ETCD_PASSWORD",
        hide_env_values = true,
        hide = true
    )]
    etcd_password: Option<String>,
    /// CA certificate (PEM) of etcd's TLS (with etcds://).
    #[arg(global = true, long, requires = "coordinator")]
    etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's mutual TLS.
    #[arg(global = true, long, requires = "etcd_ca", requires = "etcd_key")]
    etcd_cert: Option<PathBuf>,
    #[arg(global = true, long, requires = "etcd_cert")]
    etcd_key: Option<PathBuf>,
    /// The name this host goes by in the fleet's views (default: its host name).
    #[arg(global = true, long, env = "TAILFLIGHT_NODE_NAME")]
    node_name: Option<String>,
}

impl FleetArgs {
    pub fn coordinated(&self) -> bool {
        self.coordinator.is_some()
    }

    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    pub fn identity(&self) -> Option<&str> {
        self.identity.as_deref()
    }

    /// The name this host goes by in the fleet's views.
    pub fn node_name(&self) -> String {
        self.node_name.clone().unwrap_or_else(host_name)
    }

    fn config(&self) -> anyhow::Result<CoordinatorConfig> {
        let text = self
            .coordinator
            .as_deref()
            .ok_or_else(|| anyhow::anyhow!("no --coordinator given"))?;
        let endpoints = fleet::parse_endpoints(text)?;
        if let Some(identity) = &self.identity {
            anyhow::ensure!(
                !identity.is_empty()
                    && !identity.contains(['/', '\0'])
                    && identity != "."
                    && identity != "..",
                "identity {identity:?} must be one plain path component"
            );
        }
        anyhow::ensure!(
            self.lease_ttl >= Duration::from_secs(2),
            "--lease-ttl must be at least 2s (etcd counts leases in seconds)"
        );
        let user = match (&self.etcd_user, &self.etcd_password) {
            (Some(user), Some(password)) => Some((user.clone(), password.clone())),
            (Some(_), None) => anyhow::bail!("--etcd-user needs TAILFLIGHT_ETCD_PASSWORD"),
            _ => None,
        };
        Ok(CoordinatorConfig {
            endpoints,
            cluster: self.cluster.clone(),
            ttl: self.lease_ttl,
            user,
            tls: self.etcd_ca.as_ref().map(|ca| EtcdTls {
                ca: ca.clone(),
                cert: self.etcd_cert.clone(),
                key: self.etcd_key.clone(),
            }),
        })
    }

    /// Connects to etcd, retrying or not as `--coordinator-unreachable`
    /// says; `None` if `stop` resolved first.
    pub async fn connect(
        &self,
        role: Option<&RoleStatus>,
        stop: impl std::future::Future<Output = ()>,
    ) -> anyhow::Result<Option<Coordinator>> {
        let config = self.config()?;
        tokio::pin!(stop);
        loop {
            match Coordinator::connect(config.clone()).await {
                Ok(coordinator) => return Ok(Some(coordinator)),
                Err(e @ (fleet::FleetError::Config(_) | fleet::FleetError::Refused { .. })) => {
                    return Err(e.into());
                }
                Err(e) => match self.coordinator_unreachable {
                    WhenUnreachable::Exit => {
                        return Err(anyhow::Error::new(e).context("the coordinator is unreachable"));
                    }
                    WhenUnreachable::Wait => {
                        tracing::warn!(error = %e, "the coordinator is unreachable; retrying");
                        if let Some(role) = role {
                            role.set(Role::Connecting, Some(e.to_string()));
                        }
                        tokio::select! {
                            () = tokio::time::sleep(Duration::from_secs(1)) => {}
                            () = &mut stop => return Ok(None),
                        }
                    }
                },
            }
        }
    }
}

pub(crate) fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// An identity this process holds: its lease, and the thread that stops
/// the process in time if the lease cannot be kept.
pub struct ActiveIdentity {
    lease: HeldLease,
    coordinator: Coordinator,
    member: Member,
    kind: Kind,
    identity: String,
    stopping: Arc<FenceGuard>,
    _presence: fleet::Presence,
    /// A descriptor on the state directory's filesystem, for its syncfs.
    state_fs: std::fs::File,
}

/// What the fence thread does when the lease's clock says stop.
#[derive(Default)]
struct FenceGuard {
    /// A planned stop is under way: exit instead of starting over.
    stopping: AtomicBool,
    /// The lease was given up: nothing left to guard.
    released: AtomicBool,
}

impl ActiveIdentity {
    /// Says where the identity is served (a sink's endpoint, once it listens).
    pub async fn publish_endpoint(&self, endpoint: String) {
        let member = Member {
            endpoint: Some(endpoint),
            ..self.member.clone()
        };
        let value = member.encode();
        let clock = self.lease.clock();
        let mut pause = Duration::from_millis(250);
        let mut said = false;
        // Until it is published: watchers wait for it. A lost lease ends
        // the attempts (and the process acting for the identity).
        while clock.must_fence().is_none() {
            match self.lease.publish(&value).await {
                Ok(()) => {
                    if said {
                        tracing::info!("published this process's endpoint");
                    }
                    return;
                }
                Err(e @ fleet::FleetError::Conflict { .. }) => {
                    tracing::error!(error = %e, "cannot publish this process's endpoint: the identity is no longer this process's");
                    return;
                }
                Err(e) => {
                    if !said {
                        tracing::warn!(error = %e, "cannot publish this process's endpoint yet; clients wait for it; retrying");
                        said = true;
                    }
                }
            }
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                _ = clock.fenced() => return,
            }
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }

    pub fn coordinator(&self) -> &Coordinator {
        &self.coordinator
    }

    /// Resolves once an operator asks for this identity to be handed over
    /// (`tailflight fleet handover`).
    pub fn handover_requested(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        fleet::handover::requested(
            self.coordinator.clone(),
            self.kind,
            self.identity.clone(),
            self.lease.epoch(),
        )
    }

    pub fn epoch(&self) -> i64 {
        self.lease.epoch()
    }

    /// A planned stop: from now on a lost lease ends the process instead
    /// of restarting it; then the lease is released so a standby takes
    /// over at once.
    pub async fn release(self) {
        self.stopping.stopping.store(true, Ordering::SeqCst);
        // A successor must not open the state before this process's writes
        // reach the shared filesystem's server (as the fence does).
        let state_fs = self.state_fs;
        let _ = tokio::task::spawn_blocking(move || rustix::fs::syncfs(&state_fs)).await;
        self.lease.release().await;
        self.stopping.released.store(true, Ordering::SeqCst);
        // Off the fleet's views at once, not a TTL later.
        self._presence.leave().await;
    }
}

/// Waits as a standby until this process holds `identity`, checks that
/// `state_dir` is the identity's and waits for its lock. `None` if `stop`
/// resolved first. From the moment the lease is held, a thread watches its
/// fence deadline (see the module's doc).
pub async fn become_active(
    args: &FleetArgs,
    kind: Kind,
    state_dir: &Path,
    role: &RoleStatus,
    stop: impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
) -> anyhow::Result<Option<ActiveIdentity>> {
    let identity = args
        .identity()
        .ok_or_else(|| anyhow::anyhow!("--identity is needed"))?;
    // Said by this image: the fenced one wrote nothing that could block.
    let report = role.report();
    if let Some(reason) = &report.last_fence {
        tracing::error!(%reason, times = report.fenced_before, "fenced: this process stopped acting for its identity and started over as a standby");
    }
    let Some(coordinator) = args.connect(Some(role), stop()).await? else {
        return Ok(None);
    };
    crate::service_manager::standing_by(identity);
    let host = args.node_name();
    let _presence =
        fleet::Presence::start(coordinator.clone(), kind, identity, &host, role.clone());
    if let Some(epoch) = std::env::var(fleet::handover::HANDED_OVER_ENV)
        .ok()
        .and_then(|text| text.parse::<i64>().ok())
    {
        // This process just handed the identity over: a standby claims first.
        tracing::info!(epoch, "handed the identity over; standing by");
        role.set(
            Role::Standby,
            Some("a standby to take the identity over".into()),
        );
        let patience = coordinator.config().ttl * 2 + Duration::from_secs(2);
        tokio::select! {
            () = fleet::handover::wait_for_successor(&coordinator, kind, identity, epoch, patience) => {}
            () = stop() => return Ok(None),
        }
    }
    let member = Member {
        host: host.clone(),
        pid: std::process::id(),
        endpoint: None,
        state_dir: state_dir.display().to_string(),
        since_unix_ms: fleet::unix_ms_now(),
    };
    role.set(Role::Standby, Some("claiming the identity".into()));
    let Some(lease) = fleet::campaign(&coordinator, kind, identity, &member, role, stop()).await
    else {
        return Ok(None);
    };
    role.holding(lease.epoch(), lease.clock());
    let stopping = Arc::new(FenceGuard::default());
    // A stop heard from now on makes a fence exit instead of starting over
    // (the operator's stop must not be lost to a fence during the drain).
    let hearing = stop();
    let heard = stopping.clone();
    tokio::spawn(async move {
        hearing.await;
        heard.stopping.store(true, Ordering::SeqCst);
    });
    if let Err(e) = guard_fence(lease.clock(), role.clone(), stopping.clone(), state_dir) {
        lease.release().await;
        return Err(e);
    }
    let state_fs = match open_state_filesystem(state_dir) {
        Ok(file) => file,
        Err(e) => {
            lease.release().await;
            return Err(e);
        }
    };
    let active = ActiveIdentity {
        lease,
        coordinator,
        member,
        kind,
        identity: identity.to_string(),
        stopping,
        _presence,
        state_fs,
    };
    if let Err(e) =
        fleet::register_state(&active.coordinator, kind, identity, state_dir, &host).await
    {
        // Let a correctly configured (or better connected) standby have it.
        active.release().await;
        let context = match e {
            fleet::FleetError::Conflict { .. } => format!(
                "the state directory {} is not identity {identity}'s",
                state_dir.display()
            ),
            _ => format!(
                "cannot check the state directory {} against identity {identity}'s record",
                state_dir.display()
            ),
        };
        return Err(anyhow::Error::new(e).context(context));
    }
    {
        let (coordinator, member) = (active.coordinator.clone(), active.member.clone());
        let (identity, epoch) = (identity.to_string(), active.lease.epoch());
        tokio::spawn(async move {
            if let Err(e) =
                fleet::view::record_activation(&coordinator, kind, &identity, &member, epoch).await
            {
                tracing::warn!(error = %e, "cannot count this activation in etcd (the fleet view's takeovers)");
            }
        });
    }
    let mut said = false;
    let mut stopped = stop();
    loop {
        match fleet::state_lock::lock_holder(state_dir) {
            Ok(None) => break,
            Ok(Some(pid)) => {
                if !said {
                    tracing::warn!(pid, dir = %state_dir.display(), "holding the lease; waiting for the previous process to let go of the state directory's lock");
                    said = true;
                }
                role.set(
                    Role::WaitingForLock,
                    Some(format!(
                        "the lock of {} (held by pid {pid})",
                        state_dir.display()
                    )),
                );
            }
            Err(e) => {
                tracing::warn!(error = %e, dir = %state_dir.display(), "cannot check the state directory's lock; retrying");
                role.set(
                    Role::WaitingForLock,
                    Some(format!("checking the lock: {e}")),
                );
            }
        }
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(100)) => {}
            () = &mut stopped => {
                active.release().await;
                return Ok(None);
            }
        }
    }
    Ok(Some(active))
}

/// Starts the thread that stops this process's acting for its identity
/// once the lease's clock says so: by starting over as a standby, or, if
/// the process is stopping anyway, by exiting. It does nothing that could
/// block on the way (its log line is written by the next image), except
/// flushing the state directory's filesystem: on NFS or Lustre, closing
/// the descriptors at `exec` may release the state's lock before the
/// writes of the other descriptors reach the server, and a successor must
/// not open the state before them.
fn guard_fence(
    clock: LeaseClock,
    role: RoleStatus,
    guard: Arc<FenceGuard>,
    state_dir: &Path,
) -> anyhow::Result<()> {
    let state = open_state_filesystem(state_dir)?;
    std::thread::Builder::new()
        .name("fence".into())
        .spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(20));
                if guard.released.load(Ordering::SeqCst) {
                    return;
                }
                let Some(reason) = clock.must_fence() else {
                    continue;
                };
                role.set(Role::Fenced, Some(reason.to_string()));
                let _ = rustix::fs::syncfs(&state);
                if guard.stopping.load(Ordering::SeqCst) {
                    // No atexit handlers or destructors while other threads
                    // still run.
                    // SAFETY: _exit only ends the process.
                    unsafe { libc::_exit(75) };
                }
                let error = this_program_again()
                    .env_remove(fleet::handover::HANDED_OVER_ENV)
                    .env(
                        fleet::role::FENCED_ENV,
                        fleet::role::next_fenced_env(&reason.to_string()),
                    )
                    .exec();
                // Only reached if exec failed: stop acting all the same.
                say!("tailflight: fenced ({reason}) and cannot start over: {error}");
                // SAFETY: as above.
                unsafe { libc::_exit(75) };
            }
        })
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("cannot start the fence thread: {e}"))
}

/// After a planned handover (the identity drained and its lease released):
/// starts over as a standby that lets another process claim first, with a
/// fresh image as a fenced process does (every descriptor closed, the state
/// directory's lock with them).
pub fn start_over_after_handover(epoch: i64) -> anyhow::Error {
    let error = this_program_again()
        .env(fleet::handover::HANDED_OVER_ENV, epoch.to_string())
        .exec();
    anyhow::anyhow!("handed the identity over but cannot start over as a standby: {error}")
}

/// A descriptor on the state directory's filesystem, for syncfs. Any
/// directory of it does: the state directory itself may not exist before
/// its first start.
fn open_state_filesystem(state_dir: &Path) -> anyhow::Result<std::fs::File> {
    let on_state_filesystem = state_dir
        .ancestors()
        .find(|dir| dir.is_dir())
        .unwrap_or(state_dir);
    std::fs::File::open(on_state_filesystem).map_err(|e| {
        anyhow::anyhow!(
            "cannot open {} (the state directory's filesystem) to flush it: {e}",
            on_state_filesystem.display()
        )
    })
}

/// This program with the same arguments, to replace this process with
/// (`/proc/self/exe`: the binary it runs, even if its file was replaced
/// since; the same argv[0] for `ps` and systemd).
fn this_program_again() -> std::process::Command {
    let mut command = std::process::Command::new("/proc/self/exe");
    command
        .arg0(
            std::env::args_os()
                .next()
                .unwrap_or_else(|| "tailflight".into()),
        )
        .args(std::env::args_os().skip(1));
    command
}
