//! What operators see of a process's place in a fleet: its role for its
//! identity as metrics (beside the sink's or the watcher's own), and the
//! whole view of a sink or watcher that is not active, which has nothing
//! else to show.

use std::time::Instant;

use fleet::{Role, RoleReport, RoleStatus};
use serde_json::json;

use super::metrics::Families;
use super::{Observed, RecentProblems, Snapshot};

const ROLES: [Role; 5] = [
    Role::Connecting,
    Role::Standby,
    Role::WaitingForLock,
    Role::Active,
    Role::Fenced,
];

/// `tailflight_fleet_*`: the role (one series per role, 1 for the current
/// one), epoch, lease time left, activations and fences of an identity.
pub fn role_metrics(m: &Families, report: &RoleReport) {
    let identity = report.identity.as_str();
    let roles = m.gauges(
        "fleet_role",
        "1 for this process's role for its identity (connecting, standby, waiting_for_lock, active, fenced), 0 for the others.",
        &["identity", "role"],
    );
    for role in ROLES {
        roles
            .with_label_values(&[identity, role.as_str()])
            .set(f64::from(u8::from(role == report.role)));
    }
    m.gauges(
        "fleet_epoch",
        "The identity's epoch while this process holds its lease (the create revision of its key in etcd; larger at every takeover), 0 otherwise.",
        &["identity"],
    )
    .with_label_values(&[identity])
    .set(report.epoch as f64);
    m.gauges(
        "fleet_lease_left_seconds",
        "Time left before this process must have renewed its lease, or stop acting for its identity (absent while it holds none).",
        &["identity"],
    )
    .with_label_values(&[identity])
    .set(report.lease_left_seconds.unwrap_or(0.0));
    m.counters(
        "fleet_activations_total",
        "Times this process became active for its identity.",
        &["identity"],
    )
    .with_label_values(&[identity])
    .inc_by(report.activations as f64);
    m.counters(
        "fleet_fenced_total",
        "Times this process stopped acting for its identity because its lease could not be kept (it then starts over as a standby).",
        &["identity"],
    )
    .with_label_values(&[identity])
    .inc_by(report.fenced_before as f64);
}

/// A sink process while it is not active for its identity.
pub struct StandbyObserved {
    role: RoleStatus,
    problems: RecentProblems,
    started: Instant,
}

impl StandbyObserved {
    pub fn new(role: RoleStatus, problems: RecentProblems) -> Self {
        Self {
            role,
            problems,
            started: Instant::now(),
        }
    }
}

impl Observed for StandbyObserved {
    fn snapshot(&self) -> Snapshot {
        not_active_snapshot("sink", &self.role.report(), &self.problems, self.started)
    }
}

/// The whole view of a `kind` process (sink or watcher) that is not active
/// for its identity: its role, who is active instead, and its problems. A
/// standby has no files, connections or rates of its own to show, and
/// showing the empty ones would read as a stalled process.
pub fn not_active_snapshot(
    kind: &str,
    report: &RoleReport,
    problems: &RecentProblems,
    started: Instant,
) -> Snapshot {
    let m = Families::new();
    m.build_info(kind);
    m.process();
    role_metrics(&m, report);
    let not_ready = format!("{} for identity {}", report.role.as_str(), report.identity);
    Snapshot {
        status: json!({
            "role": kind,
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_seconds": started.elapsed().as_secs_f64(),
            "phase": report.role.as_str(),
            "ready": false,
            "fleet": report,
            "problems": problems.list(),
        }),
        metrics: m.gather(),
        not_ready: Some(not_ready),
    }
}
