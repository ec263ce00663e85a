//! The whole cluster as etcd records it, for operators: every identity,
//! its active process and epoch, every process announced for it with its
//! role, and how often it was taken over.

use std::collections::BTreeMap;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use crate::FleetError;
use crate::coordinator::{Coordinator, Kind};
use crate::records::{Announced, Member};

/// The cluster at one etcd revision.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ClusterView {
    pub cluster: String,
    pub revision: i64,
    pub read_unix_ms: u64,
    pub identities: Vec<IdentityView>,
}

/// One identity.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct IdentityView {
    /// `sink` or `watcher`.
    pub kind: String,
    pub identity: String,
    /// Its active process, if one holds the lease now.
    pub active: Option<ActiveView>,
    /// Every process announced for it (the active one too).
    pub members: Vec<Announced>,
    /// Times a process became active for it, and of those the ones after
    /// the first (takeovers, handovers and restarts alike).
    pub activations: u64,
    pub takeovers: u64,
    pub last_activation_unix_ms: Option<u64>,
    /// How long it has gone without an active process, as the process
    /// reading the view saw it (0 while it has one).
    #[serde(default)]
    pub inactive_seconds: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ActiveView {
    pub epoch: i64,
    #[serde(flatten)]
    pub member: Member,
}

impl ClusterView {
    pub fn find(&self, kind: Kind, identity: &str) -> Option<&IdentityView> {
        self.identities
            .iter()
            .find(|view| view.kind == kind.singular() && view.identity == identity)
    }
}

/// What `activations/<kind>/<identity>` holds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Activations {
    count: u64,
    last_unix_ms: u64,
    host: String,
    pid: u32,
    epoch: i64,
}

/// Reads the whole cluster in one request.
pub async fn read(coordinator: &Coordinator) -> Result<ClusterView, FleetError> {
    let prefix = coordinator.prefix();
    let (revision, kvs) = coordinator.get_prefix(&prefix).await?;
    let mut identities: BTreeMap<(String, String), IdentityView> = BTreeMap::new();
    for kv in &kvs {
        let Ok(key) = std::str::from_utf8(kv.key()) else {
            continue;
        };
        let Some(rest) = key.strip_prefix(&prefix) else {
            continue;
        };
        let parts: Vec<&str> = rest.split('/').collect();
        let (kind, identity) = match parts.as_slice() {
            [plural, identity]
            | ["identities", plural, identity]
            | ["activations", plural, identity]
            | ["members", plural, identity, _] => match Kind::from_plural(plural) {
                Some(kind) => (kind, *identity),
                None => continue,
            },
            _ => continue,
        };
        let view = identities
            .entry((kind.singular().to_string(), identity.to_string()))
            .or_insert_with(|| IdentityView {
                kind: kind.singular().into(),
                identity: identity.into(),
                active: None,
                members: Vec::new(),
                activations: 0,
                takeovers: 0,
                last_activation_unix_ms: None,
                inactive_seconds: 0.0,
            });
        match parts.as_slice() {
            [_, _] => {
                if let Some(member) = Member::decode(kv.value()) {
                    view.active = Some(ActiveView {
                        epoch: kv.create_revision(),
                        member,
                    });
                }
            }
            ["activations", ..] => {
                if let Ok(activations) = serde_json::from_slice::<Activations>(kv.value()) {
                    view.activations = activations.count;
                    view.takeovers = activations.count.saturating_sub(1);
                    view.last_activation_unix_ms = Some(activations.last_unix_ms);
                }
            }
            ["members", ..] => {
                if let Ok(announced) = serde_json::from_slice::<Announced>(kv.value()) {
                    view.members.push(announced);
                }
            }
            _ => {}
        }
    }
    Ok(ClusterView {
        cluster: coordinator.config().cluster.clone(),
        revision,
        read_unix_ms: crate::unix_ms_now(),
        identities: identities.into_values().collect(),
    })
}

/// Counts an activation of `identity` (by `member`, at `epoch`).
pub async fn record_activation(
    coordinator: &Coordinator,
    kind: Kind,
    identity: &str,
    member: &Member,
    epoch: i64,
) -> Result<(), FleetError> {
    let key = coordinator.activations_key(kind, identity);
    let timeout = coordinator.config().call_timeout();
    // Compare-and-swap: two identities never share the key, but an
    // operator's tool or a slow predecessor might write it meanwhile.
    for _ in 0..5 {
        let mut client = coordinator.client();
        let current = tokio::time::timeout(timeout, client.get(key.clone(), None))
            .await
            .map_err(|_| coordinator.unreachable("reading the activations", "timed out"))?
            .map_err(|e| coordinator.unreachable("reading the activations", e))?;
        let (known, mod_revision) = match current.kvs().first() {
            Some(kv) => (
                serde_json::from_slice::<Activations>(kv.value()).unwrap_or_default(),
                kv.mod_revision(),
            ),
            None => (Activations::default(), 0),
        };
        if known.epoch == epoch && mod_revision != 0 {
            return Ok(());
        }
        let next = Activations {
            count: known.count + 1,
            last_unix_ms: crate::unix_ms_now(),
            host: member.host.clone(),
            pid: member.pid,
            epoch,
        };
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                mod_revision,
            )])
            .and_then([TxnOp::put(
                key.clone(),
                serde_json::to_vec(&next).unwrap_or_default(),
                None,
            )]);
        let response = tokio::time::timeout(timeout, client.txn(txn))
            .await
            .map_err(|_| coordinator.unreachable("counting the activation", "timed out"))?
            .map_err(|e| coordinator.unreachable("counting the activation", e))?;
        if response.succeeded() {
            return Ok(());
        }
    }
    Err(FleetError::Conflict {
        identity: identity.to_string(),
        detail: "its activation count kept changing under this process".into(),
    })
}
