//! A held lease: renewed in the background, and the moment its holder must
//! stop acting for its identity.
//!
//! An etcd lease alone is not mutual exclusion: the cluster expires it on
//! its own clock, and a holder that is frozen, cut off or slow does not
//! hear of it. So the holder keeps its own deadline on the monotonic clock:
//! the send time of the last renewal etcd confirmed, plus the TTL, less a
//! safety margin. The cluster cannot expire the lease before that renewal
//! arrived, so past the deadline the holder stops (fences) before any
//! standby can have been told the identity is free.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use crate::FleetError;
use crate::coordinator::Coordinator;

/// Why a holder must stop acting for its identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceReason {
    /// No renewal was confirmed for TTL less the margin.
    NotRenewed { for_ms: u64 },
    /// etcd said the lease is gone (expired, or revoked by an operator).
    Expired,
    /// The identity's key is gone or belongs to another epoch.
    KeyLost,
}

impl std::fmt::Display for FenceReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FenceReason::NotRenewed { for_ms } => write!(
                f,
                "the lease was not renewed for {:.1} s (TTL less the safety margin)",
                *for_ms as f64 / 1000.0
            ),
            FenceReason::Expired => write!(f, "etcd says the lease is gone"),
            FenceReason::KeyLost => write!(f, "the identity's key is gone or another process's"),
        }
    }
}

/// The clock side of a lease, shared with whoever must stop in time.
#[derive(Clone)]
pub struct LeaseClock {
    inner: Arc<ClockInner>,
}

struct ClockInner {
    ttl: Duration,
    margin: Duration,
    state: Mutex<ClockState>,
}

struct ClockState {
    renewed_at: Instant,
    lost: Option<FenceReason>,
}

impl LeaseClock {
    fn new(ttl: Duration, granted_at: Instant) -> Self {
        Self {
            inner: Arc::new(ClockInner {
                ttl,
                margin: safety_margin(ttl),
                state: Mutex::new(ClockState {
                    renewed_at: granted_at,
                    lost: None,
                }),
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ClockState> {
        self.inner
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// When the holder must have stopped, unless a renewal is confirmed first.
    pub fn deadline(&self) -> Instant {
        self.state().renewed_at + self.inner.ttl - self.inner.margin
    }

    /// Time left before the deadline (zero once past it).
    pub fn time_left(&self) -> Duration {
        self.deadline().saturating_duration_since(Instant::now())
    }

    /// Why the holder must stop now, if it must.
    pub fn must_fence(&self) -> Option<FenceReason> {
        let state = self.state();
        if let Some(lost) = &state.lost {
            return Some(lost.clone());
        }
        let now = Instant::now();
        let deadline = state.renewed_at + self.inner.ttl - self.inner.margin;
        (now >= deadline).then(|| FenceReason::NotRenewed {
            for_ms: now.duration_since(state.renewed_at).as_millis() as u64,
        })
    }

    fn renewed(&self, sent_at: Instant) {
        let mut state = self.state();
        if state.lost.is_none() && sent_at > state.renewed_at {
            state.renewed_at = sent_at;
        }
    }

    fn lose(&self, reason: FenceReason) {
        let mut state = self.state();
        if state.lost.is_none() {
            state.lost = Some(reason);
        }
    }

    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// Resolves once the holder must stop.
    pub async fn fenced(&self) -> FenceReason {
        loop {
            if let Some(reason) = self.must_fence() {
                return reason;
            }
            let wait = self.time_left().min(Duration::from_millis(50));
            tokio::time::sleep(wait.max(Duration::from_millis(1))).await;
        }
    }
}

/// A fifth of the TTL, at least half a second: room for a pause between
/// the check and the stop (a scheduling delay, a page fault storm).
pub fn safety_margin(ttl: Duration) -> Duration {
    (ttl / 5).max(Duration::from_millis(500)).min(ttl / 2)
}

/// A lease this process holds, with the identity's key attached to it.
pub struct HeldLease {
    coordinator: Coordinator,
    id: i64,
    key: String,
    epoch: i64,
    clock: LeaseClock,
    renewer: tokio::task::JoinHandle<()>,
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

impl HeldLease {
    /// Starts renewing a lease granted at `granted_at` whose key `key`
    /// was created at revision `epoch`.
    pub(crate) fn start(
        coordinator: Coordinator,
        id: i64,
        ttl: Duration,
        granted_at: Instant,
        key: String,
        epoch: i64,
    ) -> Self {
        let clock = LeaseClock::new(ttl, granted_at);
        let renewer = tokio::spawn(renew(
            coordinator.clone(),
            id,
            key.clone(),
            epoch,
            clock.clone(),
        ));
        Self {
            coordinator,
            id,
            key,
            epoch,
            clock,
            renewer,
        }
    }

    /// The identity's epoch: the create revision of its key, larger at
    /// every takeover.
    pub fn epoch(&self) -> i64 {
        self.epoch
    }

    pub fn id(&self) -> i64 {
        self.id
    }

    pub fn clock(&self) -> LeaseClock {
        self.clock.clone()
    }

    /// Rewrites the identity's key (what it says of the active process:
    /// its endpoint once it serves), only while it is still this epoch's.
    pub async fn publish(&self, value: &[u8]) -> Result<(), FleetError> {
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.key.clone(),
                CompareOp::Equal,
                self.epoch,
            )])
            .and_then([TxnOp::put(
                self.key.clone(),
                value.to_vec(),
                Some(PutOptions::new().with_lease(self.id)),
            )]);
        let mut client = self.coordinator.client();
        let response =
            tokio::time::timeout(self.coordinator.config().call_timeout(), client.txn(txn))
                .await
                .map_err(|_| {
                    self.coordinator
                        .unreachable("publishing the endpoint", "timed out")
                })?
                .map_err(|e| self.coordinator.unreachable("publishing the endpoint", e))?;
        if !response.succeeded() {
            self.clock.lose(FenceReason::KeyLost);
            return Err(FleetError::Conflict {
                identity: self.key.clone(),
                detail: "the key is no longer this process's".into(),
            });
        }
        Ok(())
    }

    /// Gives the identity up at once (revokes the lease, which deletes the
    /// key): a standby takes over without waiting for the TTL.
    pub async fn release(self) {
        self.renewer.abort();
        let mut client = self.coordinator.client();
        match tokio::time::timeout(
            self.coordinator.config().call_timeout(),
            client.lease_revoke(self.id),
        )
        .await
        {
            Ok(Ok(_)) => {
                tracing::info!(key = %self.key, "lease released: a standby may take over now")
            }
            Ok(Err(e)) => {
                tracing::warn!(key = %self.key, error = %e, "could not release the lease; it expires after its TTL")
            }
            Err(_) => {
                tracing::warn!(key = %self.key, "releasing the lease timed out; it expires after its TTL")
            }
        }
    }
}

/// Renews every third of the TTL (sooner after a failure) and checks that
/// the key is still this epoch's.
async fn renew(coordinator: Coordinator, id: i64, key: String, epoch: i64, clock: LeaseClock) {
    let ttl = clock.ttl();
    let every = ttl / 3;
    // Short: a renewal that hangs (a member electing a leader, or cut
    // off) is better abandoned and tried on the next member while the
    // deadline leaves room for several more.
    let timeout = (ttl / 6).max(Duration::from_millis(300));
    let mut wait = every;
    loop {
        tokio::time::sleep(wait).await;
        let sent_at = Instant::now();
        let mut lease = coordinator.client().lease_client();
        match tokio::time::timeout(timeout, lease.keep_alive(id)).await {
            Ok(Ok(_)) => {}
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(detail))) => {
                tracing::error!(%key, %detail, "etcd no longer knows the lease");
                clock.lose(FenceReason::Expired);
                return;
            }
            Ok(Err(e)) if e.to_string().contains("lease not found") => {
                tracing::error!(%key, error = %e, "etcd no longer knows the lease");
                clock.lose(FenceReason::Expired);
                return;
            }
            Ok(Err(e)) => {
                coordinator.next_member();
                tracing::warn!(%key, error = %e, left_ms = clock.time_left().as_millis() as u64, "renewing the lease failed; retrying on the next member");
                wait = Duration::from_millis(100);
                continue;
            }
            Err(_) => {
                coordinator.next_member();
                tracing::warn!(%key, left_ms = clock.time_left().as_millis() as u64, "renewing the lease timed out; retrying on the next member");
                wait = Duration::from_millis(100);
                continue;
            }
        }
        // Renewed: the lease lives at least until sent_at + TTL on the
        // cluster's clock. Is the key still ours (not deleted by hand)?
        let mut kv = coordinator.client().kv_client();
        match tokio::time::timeout(timeout, kv.get(key.clone(), None)).await {
            Ok(Ok(response)) => {
                let ours = response
                    .kvs()
                    .first()
                    .is_some_and(|kv| kv.create_revision() == epoch && kv.lease() == id);
                if !ours {
                    tracing::error!(%key, epoch, "the identity's key is gone or another process's");
                    clock.lose(FenceReason::KeyLost);
                    return;
                }
                clock.renewed(sent_at);
                wait = every;
            }
            _ => {
                // The renewal itself went through; count it and check the
                // key at the next one.
                coordinator.next_member();
                clock.renewed(sent_at);
                wait = Duration::from_millis(100);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_deadline_is_the_last_confirmed_send_plus_ttl_less_the_margin() {
        let ttl = Duration::from_secs(5);
        let start = Instant::now() - Duration::from_secs(10);
        let clock = LeaseClock::new(ttl, start);
        assert_eq!(clock.deadline(), start + ttl - Duration::from_secs(1));
        assert!(matches!(
            clock.must_fence(),
            Some(FenceReason::NotRenewed { .. })
        ));
        clock.renewed(Instant::now());
        assert!(clock.must_fence().is_none());
        assert!(clock.time_left() > Duration::from_secs(3));
        // An older confirmation never moves the deadline back.
        clock.renewed(start);
        assert!(clock.must_fence().is_none());
        clock.lose(FenceReason::Expired);
        assert_eq!(clock.must_fence(), Some(FenceReason::Expired));
        // A renewal confirmed after the loss does not undo it.
        clock.renewed(Instant::now());
        assert_eq!(clock.must_fence(), Some(FenceReason::Expired));
    }

    #[test]
    fn the_margin_leaves_half_the_ttl_at_least() {
        assert_eq!(
            safety_margin(Duration::from_secs(10)),
            Duration::from_secs(2)
        );
        assert_eq!(
            safety_margin(Duration::from_secs(2)),
            Duration::from_millis(500)
        );
        assert_eq!(
            safety_margin(Duration::from_millis(600)),
            Duration::from_millis(300)
        );
    }
}
