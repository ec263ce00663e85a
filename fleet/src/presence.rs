//! A process's presence in its fleet: its announcement, so that a fleet
//! view lists standbys too, and its own view of the cluster, read every
//! few seconds for its status page and metrics.
//!
//! The key `members/<kind>/<identity>/<node>:<pid>` says the process's role
//! and epoch. It lives on a lease this task keeps alive: a process that
//! dies leaves the view within a TTL. The announcement is for people and
//! their alerts only: no decision of the fleet is taken from it.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::PutOptions;

use crate::coordinator::{Coordinator, Kind};
use crate::records::Announced;
use crate::role::RoleStatus;

/// How often a process reads the cluster's view.
const VIEW_EVERY: Duration = Duration::from_secs(2);

/// Keeps this process's announcement in etcd, and its view of the
/// cluster in its [`RoleStatus`], until dropped.
pub struct Presence {
    announcing: tokio::task::JoinHandle<()>,
    viewing: tokio::task::JoinHandle<()>,
    coordinator: Coordinator,
    /// The announcement's lease (0 while none is granted).
    lease: Arc<AtomicI64>,
}

impl Drop for Presence {
    fn drop(&mut self) {
        self.announcing.abort();
        self.viewing.abort();
    }
}

impl Presence {
    /// Announces this process for `identity` on `node` and keeps it in step
    /// with `role`. etcd failures are retried in the background; they never
    /// reach the caller.
    pub fn start(
        coordinator: Coordinator,
        kind: Kind,
        identity: &str,
        node: &str,
        role: RoleStatus,
    ) -> Self {
        let key = coordinator.member_key(kind, identity, &format!("{node}:{}", std::process::id()));
        let since_unix_ms = crate::unix_ms_now();
        let node = node.to_string();
        let viewing = tokio::spawn(view(coordinator.clone(), role.clone()));
        let lease = Arc::new(AtomicI64::new(0));
        let announced = move || {
            let report = role.report();
            Announced {
                node: node.clone(),
                pid: std::process::id(),
                role: report.role,
                epoch: report.epoch,
                since_unix_ms,
            }
        };
        Self {
            announcing: tokio::spawn(announce(coordinator.clone(), key, announced, lease.clone())),
            viewing,
            coordinator,
            lease,
        }
    }

    /// Takes the announcement out of etcd now (a planned stop or handover:
    /// the views must not show this process active for a TTL more).
    pub async fn leave(&self) {
        self.announcing.abort();
        self.viewing.abort();
        let lease = self.lease.load(Ordering::SeqCst);
        if lease != 0 {
            let mut client = self.coordinator.client();
            let _ = tokio::time::timeout(
                self.coordinator.config().call_timeout(),
                client.lease_revoke(lease),
            )
            .await;
        }
    }
}

async fn announce(
    coordinator: Coordinator,
    key: String,
    announced: impl Fn() -> Announced,
    held: Arc<AtomicI64>,
) {
    let mut said_failure = false;
    let ttl = coordinator.config().ttl;
    let timeout = coordinator.config().call_timeout();
    let ttl_seconds = ttl.as_secs().max(1) as i64;
    loop {
        let mut client = coordinator.client();
        let lease = match tokio::time::timeout(timeout, client.lease_grant(ttl_seconds, None)).await
        {
            Ok(Ok(grant)) => grant.id(),
            failed => {
                if !said_failure {
                    let why = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => "timed out".into(),
                    };
                    tracing::warn!(%key, error = %why, "cannot announce this process in etcd (the fleet's views); retrying");
                    said_failure = true;
                }
                coordinator.next_member();
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        held.store(lease, Ordering::SeqCst);
        let mut said: Option<Announced> = None;
        let mut renewed = Instant::now();
        loop {
            let now = announced();
            let failed = if said.as_ref() != Some(&now) {
                let put = client.put(
                    key.clone(),
                    serde_json::to_vec(&now).unwrap_or_default(),
                    Some(PutOptions::new().with_lease(lease)),
                );
                match tokio::time::timeout(timeout, put).await {
                    Ok(Ok(_)) => {
                        said = Some(now);
                        said_failure = false;
                        false
                    }
                    _ => true,
                }
            } else if renewed.elapsed() >= ttl / 3 {
                let mut leases = client.lease_client();
                match tokio::time::timeout(timeout, leases.keep_alive(lease)).await {
                    Ok(Ok(_)) => {
                        renewed = Instant::now();
                        false
                    }
                    _ => true,
                }
            } else {
                false
            };
            if failed {
                // A new lease on the next member: the old one may be gone.
                coordinator.next_member();
                tokio::time::sleep(Duration::from_secs(1)).await;
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Reads the cluster's view into `role` every [`VIEW_EVERY`], with how long
/// each identity has gone without an active process as this process saw it.
async fn view(coordinator: Coordinator, role: RoleStatus) {
    let mut inactive_since: std::collections::BTreeMap<(String, String), Instant> =
        Default::default();
    loop {
        match crate::view::read(&coordinator).await {
            Ok(mut view) => {
                let now = Instant::now();
                for identity in &mut view.identities {
                    let key = (identity.kind.clone(), identity.identity.clone());
                    if identity.active.is_some() {
                        inactive_since.remove(&key);
                    } else {
                        let since = *inactive_since.entry(key).or_insert(now);
                        identity.inactive_seconds = now.duration_since(since).as_secs_f64();
                    }
                }
                role.set_cluster(Some(view));
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the cluster's view; keeping the last one");
            }
        }
        tokio::time::sleep(VIEW_EVERY).await;
    }
}
