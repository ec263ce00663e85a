//! Planned handovers: an operator asks an identity's active process to
//! hand its identity over to a standby now, without waiting for a TTL.
//!
//! The request is the key `handover/<kind>/<identity>`, naming the epoch
//! it is for (a request outlives no takeover: a successor has another
//! epoch) and living on a short lease of its own. The active process
//! watches for it, drains as for a planned stop, releases its lease and
//! starts over as a standby that lets the others claim first.

use std::time::Duration;

use etcd_client::{EventType, PutOptions, WatchOptions};
use serde::{Deserialize, Serialize};

use crate::FleetError;
use crate::coordinator::{Coordinator, Kind};
use crate::records::Member;

/// How long a request stays in etcd if nobody acts on it.
const REQUEST_TTL_SECONDS: i64 = 120;

/// The environment variable a process that handed its identity over leaves
/// for its next image: it lets a standby claim first.
pub const HANDED_OVER_ENV: &str = "TAILFLIGHT_HANDED_OVER";

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Request {
    epoch: i64,
    requested_unix_ms: u64,
}

/// The active process an identity is handed over from.
#[derive(Clone, Debug)]
pub struct Requested {
    pub epoch: i64,
    pub from: Member,
}

/// Asks `identity`'s active process to hand it over. Refused when the
/// identity has no active process, or no other process stands by for it
/// (its active would only take it back) unless `force`.
pub async fn request(
    coordinator: &Coordinator,
    kind: Kind,
    identity: &str,
    force: bool,
) -> Result<Requested, FleetError> {
    let view = crate::view::read(coordinator).await?;
    let conflict = |detail: String| FleetError::Conflict {
        identity: identity.to_string(),
        detail,
    };
    let Some(found) = view.find(kind, identity) else {
        return Err(conflict(format!(
            "no such {} identity in cluster {}",
            kind.singular(),
            view.cluster
        )));
    };
    let Some(active) = &found.active else {
        return Err(conflict(
            "it has no active process to hand over from".into(),
        ));
    };
    let standbys = found
        .members
        .iter()
        .filter(|m| m.role == crate::Role::Standby)
        .count();
    if standbys == 0 && !force {
        return Err(conflict(format!(
            "no process stands by for it (its active is {} pid {}): a handover would only give it \
             back to the same process (--force hands it over anyway)",
            active.member.host, active.member.pid
        )));
    }
    let timeout = coordinator.config().call_timeout();
    let mut client = coordinator.client();
    let lease = tokio::time::timeout(timeout, client.lease_grant(REQUEST_TTL_SECONDS, None))
        .await
        .map_err(|_| coordinator.unreachable("granting the request's lease", "timed out"))?
        .map_err(|e| coordinator.unreachable("granting the request's lease", e))?
        .id();
    let request = Request {
        epoch: active.epoch,
        requested_unix_ms: crate::unix_ms_now(),
    };
    tokio::time::timeout(
        timeout,
        client.put(
            coordinator.handover_key(kind, identity),
            serde_json::to_vec(&request).unwrap_or_default(),
            Some(PutOptions::new().with_lease(lease)),
        ),
    )
    .await
    .map_err(|_| coordinator.unreachable("writing the handover request", "timed out"))?
    .map_err(|e| coordinator.unreachable("writing the handover request", e))?;
    Ok(Requested {
        epoch: active.epoch,
        from: active.member.clone(),
    })
}

/// Resolves once a handover of `identity` at `epoch` is asked for. etcd
/// failures are waited out.
pub async fn requested(coordinator: Coordinator, kind: Kind, identity: String, epoch: i64) {
    let key = coordinator.handover_key(kind, &identity);
    let for_us = |value: &[u8]| {
        serde_json::from_slice::<Request>(value).is_ok_and(|request| request.epoch == epoch)
    };
    loop {
        let (revision, kvs) = match coordinator.get_prefix(&key).await {
            Ok(read) => read,
            Err(_) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if kvs
            .iter()
            .any(|kv| kv.key() == key.as_bytes() && for_us(kv.value()))
        {
            return;
        }
        let mut client = coordinator.client();
        let Ok(mut stream) = client
            .watch(
                key.clone(),
                Some(WatchOptions::new().with_start_revision(revision + 1)),
            )
            .await
        else {
            coordinator.next_member();
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        loop {
            match stream.message().await {
                Ok(Some(response)) if !response.canceled() => {
                    let asked = response.events().iter().any(|event| {
                        event.event_type() == EventType::Put
                            && event.kv().is_some_and(|kv| for_us(kv.value()))
                    });
                    if asked {
                        return;
                    }
                }
                _ => {
                    coordinator.next_member();
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    break;
                }
            }
        }
    }
}

/// Waits, up to `patience`, until another process holds `identity` at an
/// epoch other than `handed_over` (a process that just handed it over lets
/// a standby claim first; its own key, should its release have failed,
/// does not count).
pub async fn wait_for_successor(
    coordinator: &Coordinator,
    kind: Kind,
    identity: &str,
    handed_over: i64,
    patience: Duration,
) {
    let key = coordinator.active_key(kind, identity);
    let waited = async {
        loop {
            if let Ok((_, kvs)) = coordinator.get_prefix(&key).await
                && kvs
                    .iter()
                    .any(|kv| kv.key() == key.as_bytes() && kv.create_revision() != handed_over)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let _ = tokio::time::timeout(patience, waited).await;
}

/// Waits until `identity` is held at an epoch other than `epoch` (and,
/// for a sink, serves at an endpoint): the new active and its epoch.
pub async fn wait_taken_over(
    coordinator: &Coordinator,
    kind: Kind,
    identity: &str,
    epoch: i64,
) -> (Member, i64) {
    let key = coordinator.active_key(kind, identity);
    loop {
        if let Ok((_, kvs)) = coordinator.get_prefix(&key).await
            && let Some(kv) = kvs.iter().find(|kv| kv.key() == key.as_bytes())
            && kv.create_revision() != epoch
            && let Some(member) = Member::decode(kv.value())
            && (kind == Kind::Watcher || member.endpoint.is_some())
        {
            return (member, kv.create_revision());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
