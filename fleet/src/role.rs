//! What a process is for its identity now, for status pages and metrics.

use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::coordinator::Kind;
use crate::lease::LeaseClock;
use crate::records::{Member, Role};

/// The role and what goes with it, as status shows it.
#[derive(Clone, Debug, Serialize)]
pub struct RoleReport {
    pub identity: String,
    pub kind: &'static str,
    pub cluster: String,
    pub role: Role,
    /// The identity's epoch while this process holds it (0 otherwise).
    pub epoch: i64,
    /// Time left before this process must have renewed its lease.
    pub lease_left_seconds: Option<f64>,
    /// Times this process became active for the identity (the first start
    /// included), and times an earlier run of it was fenced.
    pub activations: u64,
    pub fenced_before: u64,
    pub last_fence: Option<String>,
    /// The active process, as its key says, while this one is a standby.
    pub active: Option<Member>,
    /// What the role waits for, when it waits.
    pub waiting_for: Option<String>,
}

/// Shared, updated by the campaign and the binary, read by status.
#[derive(Clone)]
pub struct RoleStatus {
    inner: Arc<Mutex<(RoleReport, Option<LeaseClock>)>>,
    /// The cluster as this process last read it (see [`crate::presence`]).
    cluster: Arc<Mutex<Option<crate::ClusterView>>>,
}

impl RoleStatus {
    pub fn new(kind: Kind, identity: &str, cluster: &str) -> Self {
        let (fenced_before, last_fence) = crate::role::fenced_before();
        Self {
            inner: Arc::new(Mutex::new((
                RoleReport {
                    identity: identity.into(),
                    kind: match kind {
                        Kind::Sink => "sink",
                        Kind::Watcher => "watcher",
                    },
                    cluster: cluster.into(),
                    role: Role::Connecting,
                    epoch: 0,
                    lease_left_seconds: None,
                    activations: 0,
                    fenced_before,
                    last_fence,
                    active: None,
                    waiting_for: None,
                },
                None,
            ))),
            cluster: Arc::default(),
        }
    }

    pub fn set_cluster(&self, view: Option<crate::ClusterView>) {
        *self
            .cluster
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = view;
    }

    /// The cluster as this process last read it, once it has.
    pub fn cluster(&self) -> Option<crate::ClusterView> {
        self.cluster
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (RoleReport, Option<LeaseClock>)> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn set(&self, role: Role, waiting_for: Option<String>) {
        let mut inner = self.lock();
        inner.0.role = role;
        inner.0.waiting_for = waiting_for;
    }

    pub fn standby_behind(&self, active: Option<Member>) {
        let mut inner = self.lock();
        inner.0.role = Role::Standby;
        inner.0.epoch = 0;
        inner.0.active = active;
        inner.0.waiting_for = Some("the active process's key to go".into());
        inner.1 = None;
    }

    /// The lease is held (the role is set separately: the lock may still
    /// have to be waited for).
    pub fn holding(&self, epoch: i64, clock: LeaseClock) {
        let mut inner = self.lock();
        inner.0.epoch = epoch;
        inner.0.active = None;
        inner.1 = Some(clock);
    }

    pub fn activated(&self) {
        let mut inner = self.lock();
        inner.0.role = Role::Active;
        inner.0.waiting_for = None;
        inner.0.activations += 1;
    }

    pub fn report(&self) -> RoleReport {
        let inner = self.lock();
        let mut report = inner.0.clone();
        report.lease_left_seconds = inner
            .1
            .as_ref()
            .map(|clock| clock.time_left().as_secs_f64());
        report
    }
}

/// The environment variable a fenced process leaves for its next image:
/// "<times fenced>:<last reason>".
pub const FENCED_ENV: &str = "TAILFLIGHT_FENCED_BEFORE";

fn fenced_before() -> (u64, Option<String>) {
    match std::env::var(FENCED_ENV) {
        Ok(text) => match text.split_once(':') {
            Some((count, reason)) => (count.parse().unwrap_or(0), Some(reason.to_string())),
            None => (0, None),
        },
        Err(_) => (0, None),
    }
}

/// What to put in [`FENCED_ENV`] for the next image after fencing for `reason`.
pub fn next_fenced_env(reason: &str) -> String {
    let (count, _) = fenced_before();
    format!("{}:{reason}", count + 1)
}
