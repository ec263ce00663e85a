//! The sink identities of a cluster and where each is served now.
//!
//! A watcher routes files over identity names (rendezvous hashing), so a
//! file keeps its identity whichever process serves it; each identity's
//! endpoint is followed here and changes at a takeover. With etcd
//! unreachable the last map is kept.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use tokio::sync::watch;

use crate::FleetError;
use crate::coordinator::{Coordinator, Kind};
use crate::records::Member;

/// Sink identities and a live view of each one's endpoint.
pub struct SinkDirectory {
    identities: Vec<String>,
    endpoints: BTreeMap<String, watch::Receiver<Option<String>>>,
    follower: tokio::task::JoinHandle<()>,
}

impl Drop for SinkDirectory {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

impl SinkDirectory {
    /// The identities files are routed over, in a stable order.
    pub fn identities(&self) -> &[String] {
        &self.identities
    }

    /// The endpoint of `identity` now and from now on (`None` while it
    /// has no active process serving).
    pub fn endpoint(&self, identity: &str) -> Option<watch::Receiver<Option<String>>> {
        self.endpoints.get(identity).cloned()
    }
}

fn identity_of<'a>(key: &'a [u8], prefix: &str) -> Option<&'a str> {
    std::str::from_utf8(key).ok()?.strip_prefix(prefix)
}

/// Reads the registered sink identities (waiting, with `patience`, until
/// at least one is registered) and starts following their endpoints.
pub async fn follow_sinks(
    coordinator: &Coordinator,
    patience: Duration,
) -> Result<SinkDirectory, FleetError> {
    let registry_prefix = coordinator.registry_key(Kind::Sink, "");
    let active_prefix = coordinator.active_key(Kind::Sink, "");
    let started = std::time::Instant::now();
    let mut said_unreachable = false;
    let identities: Vec<String> = loop {
        // An outage right after connecting is waited out within the same
        // patience as an empty registry.
        let kvs = match coordinator.get_prefix(&registry_prefix).await {
            Ok((_, kvs)) => kvs,
            Err(e @ FleetError::Unreachable { .. }) if started.elapsed() < patience => {
                if !said_unreachable {
                    tracing::warn!(error = %e, "cannot read the sink identities yet; retrying");
                    said_unreachable = true;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        let names: Vec<String> = kvs
            .iter()
            .filter_map(|kv| identity_of(kv.key(), &registry_prefix).map(String::from))
            .collect();
        if !names.is_empty() {
            break names;
        }
        if started.elapsed() >= patience {
            return Err(FleetError::Config(format!(
                "no sink identity is registered under {registry_prefix} (start a sink with \
                 --identity and this --coordinator and --cluster first)"
            )));
        }
        tracing::info!(prefix = %registry_prefix, "waiting for a sink identity to be registered");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut senders = BTreeMap::new();
    let mut endpoints = BTreeMap::new();
    for identity in &identities {
        let (tx, rx) = watch::channel(None);
        senders.insert(identity.clone(), tx);
        endpoints.insert(identity.clone(), rx);
    }
    let senders = Arc::new(senders);
    let follower = tokio::spawn(follow(coordinator.clone(), active_prefix, senders));
    tracing::info!(
        ?identities,
        "routing files over the cluster's sink identities"
    );
    Ok(SinkDirectory {
        identities,
        endpoints,
        follower,
    })
}

/// Reads the active keys, then watches them; starts over after a failure.
async fn follow(
    coordinator: Coordinator,
    prefix: String,
    senders: Arc<BTreeMap<String, watch::Sender<Option<String>>>>,
) {
    let publish = |identity: &str, endpoint: Option<String>| {
        if let Some(sender) = senders.get(identity) {
            sender.send_if_modified(|current| {
                if *current == endpoint {
                    return false;
                }
                tracing::info!(identity, ?endpoint, "sink identity's endpoint changed");
                *current = endpoint;
                true
            });
        }
    };
    loop {
        let (revision, kvs) = match coordinator.get_prefix(&prefix).await {
            Ok(read) => read,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the sinks' endpoints; keeping the last ones");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut seen = BTreeMap::new();
        for kv in &kvs {
            if let Some(identity) = identity_of(kv.key(), &prefix) {
                seen.insert(
                    identity.to_string(),
                    Member::decode(kv.value()).and_then(|m| m.endpoint),
                );
            }
        }
        for identity in senders.keys() {
            publish(identity, seen.remove(identity).flatten());
        }
        let mut client = coordinator.client();
        let mut stream = match client
            .watch(
                prefix.clone(),
                Some(
                    WatchOptions::new()
                        .with_prefix()
                        .with_start_revision(revision + 1)
                        .with_progress_notify(),
                ),
            )
            .await
        {
            Ok(stream) => stream,
            Err(e) => {
                coordinator.next_member();
                tracing::warn!(error = %e, "cannot watch the sinks' endpoints; keeping the last ones");
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
        };
        loop {
            match stream.message().await {
                Ok(Some(response)) if !response.canceled() => {
                    for event in response.events() {
                        let Some(kv) = event.kv() else { continue };
                        let Some(identity) = identity_of(kv.key(), &prefix) else {
                            continue;
                        };
                        match event.event_type() {
                            EventType::Put => publish(
                                identity,
                                Member::decode(kv.value()).and_then(|m| m.endpoint),
                            ),
                            EventType::Delete => publish(identity, None),
                        }
                    }
                }
                ended => {
                    coordinator.next_member();
                    let why = match ended {
                        Ok(Some(_)) => "cancelled by etcd".to_string(),
                        Ok(None) => "closed".to_string(),
                        Err(e) => e.to_string(),
                    };
                    tracing::warn!(%why, "the watch on the sinks' endpoints ended; reading them again");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    break;
                }
            }
        }
    }
}
