//! What operators see of a process's place in a fleet: its role for its
//! identity as metrics (beside the sink's or the watcher's own), and the
//! whole view of a sink or watcher that is not active, which has nothing
//! else to show.

use std::time::Instant;

use fleet::{ClusterView, Role, RoleReport, RoleStatus};
use serde_json::json;

use super::metrics::Families;
use super::recent::RecentProblems;
use super::snapshot::{Observed, Snapshot};

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

/// `tailflight_cluster_*`: the whole cluster as this process last read it
/// from etcd (every process of a fleet says the same: alert on the `max`).
pub fn cluster_metrics(m: &Families, view: &ClusterView) {
    let labels = ["cluster", "kind", "identity"];
    let active = m.gauges(
        "cluster_identity_active",
        "1 if the identity has an active process (holding its lease), 0 if none does.",
        &labels,
    );
    let processes = m.gauges(
        "cluster_identity_processes",
        "Processes announced for the identity, by role (standbys on other hosts included).",
        &["cluster", "kind", "identity", "role"],
    );
    let takeovers = m.counters(
        "cluster_takeovers_total",
        "Times the identity changed process: every activation but the first (takeovers after a death or a fence, handovers, restarts).",
        &labels,
    );
    let inactive = m.gauges(
        "cluster_identity_inactive_seconds",
        "How long the identity has gone without an active process, as this process saw it (0 while it has one).",
        &labels,
    );
    let read_ms = view.read_unix_ms as f64;
    let now_ms = fleet::unix_ms_now() as f64;
    m.gauges(
        "cluster_view_age_seconds",
        "How long ago this process last read the cluster's view from etcd (it keeps the last one while etcd is out of reach).",
        &["cluster"],
    )
    .with_label_values(&[view.cluster.as_str()])
    .set(((now_ms - read_ms) / 1000.0).max(0.0));
    for identity in &view.identities {
        let values = [
            view.cluster.as_str(),
            identity.kind.as_str(),
            identity.identity.as_str(),
        ];
        active
            .with_label_values(&values)
            .set(f64::from(u8::from(identity.active.is_some())));
        for role in ROLES {
            let count = identity
                .members
                .iter()
                .filter(|member| member.role == role)
                .count();
            processes
                .with_label_values(&[values[0], values[1], values[2], role.as_str()])
                .set(count as f64);
        }
        takeovers
            .with_label_values(&values)
            .inc_by(identity.takeovers as f64);
        inactive
            .with_label_values(&values)
            .set(identity.inactive_seconds);
    }
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
        not_active_snapshot("sink", &self.role, &self.problems, self.started)
    }
}

/// The whole view of a `kind` process (sink or watcher) that is not active
/// for its identity: its role, who is active instead, and its problems. A
/// standby has no files, connections or rates of its own to show, and
/// showing the empty ones would read as a stalled process.
pub fn not_active_snapshot(
    kind: &str,
    role: &RoleStatus,
    problems: &RecentProblems,
    started: Instant,
) -> Snapshot {
    let report = &role.report();
    let cluster = role.cluster();
    let m = Families::new();
    m.build_info(kind);
    m.process();
    role_metrics(&m, report);
    if let Some(view) = &cluster {
        cluster_metrics(&m, view);
    }
    let not_ready = format!("{} for identity {}", report.role.as_str(), report.identity);
    Snapshot {
        status: json!({
            "role": kind,
            "version": env!("CARGO_PKG_VERSION"),
            "uptime_seconds": started.elapsed().as_secs_f64(),
            "phase": report.role.as_str(),
            "ready": false,
            "fleet": report,
            "cluster": cluster,
            "problems": problems.list(),
        }),
        metrics: m.gather(),
        not_ready: Some(not_ready),
    }
}
