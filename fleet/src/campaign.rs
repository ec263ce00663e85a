//! Waiting as a standby and claiming an identity.
//!
//! A claim is one etcd transaction: create the identity's key, attached to
//! a fresh lease, only if the key does not exist. Whoever's transaction
//! creates it is the active process; its create revision is the epoch.
//! Everyone else watches the key and tries again once it is deleted (its
//! holder released it, or its lease expired).

use std::time::{Duration, Instant};

use etcd_client::{
    Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};

use crate::coordinator::{Coordinator, Kind};
use crate::lease::HeldLease;
use crate::records::Member;
use crate::role::RoleStatus;

/// Waits until this process holds `identity`'s key, or `stop` resolves
/// (then `None`). Failures to reach etcd are logged and retried: a standby
/// waits out a coordinator outage.
pub async fn campaign(
    coordinator: &Coordinator,
    kind: Kind,
    identity: &str,
    member: &Member,
    role: &RoleStatus,
    stop: impl std::future::Future<Output = ()>,
) -> Option<HeldLease> {
    tokio::pin!(stop);
    let key = coordinator.active_key(kind, identity);
    let ttl = coordinator.config().ttl;
    let mut logged_standby = false;
    loop {
        let attempt = claim_once(coordinator, &key, ttl, member);
        let outcome = tokio::select! {
            outcome = attempt => outcome,
            () = &mut stop => return None,
        };
        match outcome {
            Ok(Claim::Won(lease)) => {
                tracing::info!(%key, epoch = lease.epoch(), "this process is now active for the identity");
                return Some(*lease);
            }
            Ok(Claim::Held { holder, revision }) => {
                if !logged_standby {
                    tracing::info!(%key, active = ?holder, "standby: another process is active for the identity");
                    logged_standby = true;
                }
                role.standby_behind(holder);
                tokio::select! {
                    () = wait_for_delete(coordinator, &key, revision, ttl) => {}
                    () = &mut stop => return None,
                }
            }
            Err(e) => {
                tracing::warn!(%key, error = %e, "cannot reach etcd to claim the identity; retrying");
                role.set(crate::Role::Connecting, Some(format!("etcd: {e}")));
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_secs(1)) => {}
                    () = &mut stop => return None,
                }
            }
        }
    }
}

enum Claim {
    Won(Box<HeldLease>),
    Held {
        holder: Option<Member>,
        revision: i64,
    },
}

async fn claim_once(
    coordinator: &Coordinator,
    key: &str,
    ttl: Duration,
    member: &Member,
) -> Result<Claim, crate::FleetError> {
    let timeout = coordinator.config().call_timeout();
    let mut client = coordinator.client();
    // Counted from before the grant: the lease cannot expire before
    // granted_at + TTL on any clock that runs at the same rate.
    let granted_at = Instant::now();
    let ttl_seconds = ttl.as_secs().max(1) as i64;
    let grant = tokio::time::timeout(timeout, client.lease_grant(ttl_seconds, None))
        .await
        .map_err(|_| coordinator.unreachable("granting a lease", "timed out"))?
        .map_err(|e| coordinator.unreachable("granting a lease", e))?;
    let lease_id = grant.id();
    // etcd may raise a short TTL to its minimum, never lower it.
    let held_ttl = ttl.min(Duration::from_secs(grant.ttl().max(1) as u64));
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key,
            member.encode(),
            Some(PutOptions::new().with_lease(lease_id)),
        )])
        .or_else([TxnOp::get(key, None)]);
    let response = match tokio::time::timeout(timeout, client.txn(txn)).await {
        Ok(Ok(response)) => response,
        failed => {
            // Naming the failure moves on to the next member.
            let error = match failed {
                Ok(Err(e)) => coordinator.unreachable("claiming the identity", e),
                _ => coordinator.unreachable("claiming the identity", "timed out"),
            };
            // Whether or not it went through, a standby must not keep a
            // lease nobody renews attached to the key: revoking deletes it.
            // Through the next member, as the one that failed may not answer.
            let _ =
                tokio::time::timeout(timeout, coordinator.client().lease_revoke(lease_id)).await;
            return Err(error);
        }
    };
    let revision = response.header().map_or(0, |h| h.revision());
    if response.succeeded() {
        return Ok(Claim::Won(Box::new(HeldLease::start(
            coordinator.clone(),
            lease_id,
            held_ttl,
            granted_at,
            key.to_string(),
            revision,
        ))));
    }
    let _ = tokio::time::timeout(timeout, client.lease_revoke(lease_id)).await;
    let holder = response.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(get) => get.kvs().first().and_then(|kv| Member::decode(kv.value())),
        _ => None,
    });
    Ok(Claim::Held { holder, revision })
}

/// Returns once `key` is deleted after `revision`, or after a TTL anyway
/// (the claim is simply tried again), or when the watch fails.
async fn wait_for_delete(coordinator: &Coordinator, key: &str, revision: i64, ttl: Duration) {
    let watching = async {
        let mut client = coordinator.client();
        let Ok(mut stream) = client
            .watch(
                key,
                Some(WatchOptions::new().with_start_revision(revision + 1)),
            )
            .await
        else {
            coordinator.next_member();
            tokio::time::sleep(Duration::from_millis(250)).await;
            return;
        };
        loop {
            match stream.message().await {
                Ok(Some(response)) => {
                    if response.canceled() {
                        return;
                    }
                    if response
                        .events()
                        .iter()
                        .any(|event| event.event_type() == EventType::Delete)
                    {
                        return;
                    }
                }
                _ => {
                    coordinator.next_member();
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    return;
                }
            }
        }
    };
    let _ = tokio::time::timeout(ttl.max(Duration::from_secs(1)), watching).await;
}
