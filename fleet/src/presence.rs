//! Every process of an identity, active or not, announced under a lease of
//! its own, so that a fleet view lists standbys too.
//!
//! The key `members/<kind>/<identity>/<node>:<pid>` says the process's role
//! and epoch. It lives on a lease this task keeps alive: a process that
//! dies leaves the view within a TTL. The announcement is for people and
//! their alerts only: no decision of the fleet is taken from it.

use std::time::{Duration, Instant};

use etcd_client::PutOptions;
use serde::{Deserialize, Serialize};

use crate::coordinator::{Coordinator, Kind};
use crate::role::{Role, RoleStatus};

/// What a process says of itself under `members/`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Announced {
    pub node: String,
    pub pid: u32,
    pub role: Role,
    /// The identity's epoch while this process holds it (0 otherwise).
    pub epoch: i64,
    /// When this process started (Unix ms).
    pub since_unix_ms: u64,
}

/// Keeps this process's announcement in etcd until dropped.
pub struct Presence {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Presence {
    fn drop(&mut self) {
        self.task.abort();
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
            task: tokio::spawn(announce(coordinator, key, announced)),
        }
    }
}

async fn announce(coordinator: Coordinator, key: String, announced: impl Fn() -> Announced) {
    let ttl = coordinator.config().ttl;
    let timeout = coordinator.config().call_timeout();
    let ttl_seconds = ttl.as_secs().max(1) as i64;
    loop {
        let mut client = coordinator.client();
        let lease = match tokio::time::timeout(timeout, client.lease_grant(ttl_seconds, None)).await
        {
            Ok(Ok(grant)) => grant.id(),
            _ => {
                coordinator.next_member();
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
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
