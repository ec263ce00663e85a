//! Which state an identity owns.
//!
//! At its first start an identity records in etcd the id of its state
//! directory (a random id written into the directory itself). Every later
//! process for the identity, on any host, must find the same id in the
//! state directory it was given: a different one (another directory) or
//! none (the shared directory is not mounted there, or is another one) is
//! refused before anything is opened, let alone created.

use std::path::Path;

use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};

use crate::FleetError;
use crate::coordinator::{Coordinator, Kind};

/// The file in a state directory that names it.
pub const STATE_ID_FILE: &str = "tailflight-state-id";

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Registered {
    state_id: String,
    /// Where it was first started, for the error message.
    state_dir: String,
    host: String,
}

fn read_state_id(dir: &Path) -> Result<Option<String>, FleetError> {
    match std::fs::read_to_string(dir.join(STATE_ID_FILE)) {
        Ok(text) => Ok(Some(text.trim().to_string())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(FleetError::Config(format!(
            "cannot read {}: {e}",
            dir.join(STATE_ID_FILE).display()
        ))),
    }
}

fn new_state_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    hasher.write_u32(std::process::id());
    format!("{:016x}", hasher.finish())
}

/// Checks `dir` against what etcd records for `identity`, recording it at
/// the identity's first start. Call it while holding the identity's lease
/// and before opening the state.
pub async fn register_state(
    coordinator: &Coordinator,
    kind: Kind,
    identity: &str,
    dir: &Path,
    host: &str,
) -> Result<(), FleetError> {
    let key = coordinator.registry_key(kind, identity);
    let timeout = coordinator.config().call_timeout();
    let mut client = coordinator.client();
    let current = tokio::time::timeout(timeout, client.get(key.clone(), None))
        .await
        .map_err(|_| coordinator.unreachable("reading the identity's record", "timed out"))?
        .map_err(|e| coordinator.unreachable("reading the identity's record", e))?;
    let registered = current
        .kvs()
        .first()
        .and_then(|kv| serde_json::from_slice::<Registered>(kv.value()).ok());
    let local = read_state_id(dir)?;
    let conflict = |detail: String| FleetError::Conflict {
        identity: identity.to_string(),
        detail,
    };
    match (registered, local) {
        (Some(registered), Some(local)) if registered.state_id == local => Ok(()),
        (Some(registered), Some(local)) => Err(conflict(format!(
            "its state directory was first started at {} on {} (state id {}), but {} holds state \
             id {local}: this is another identity's or another copy's state; give --state the \
             identity's shared directory",
            registered.state_dir,
            registered.host,
            registered.state_id,
            dir.display()
        ))),
        (Some(registered), None) => Err(conflict(format!(
            "its state directory was first started at {} on {} (state id {}), but {} holds no \
             state id: is the shared state directory mounted here? Nothing was opened or created",
            registered.state_dir,
            registered.host,
            registered.state_id,
            dir.display()
        ))),
        (None, local) => {
            std::fs::create_dir_all(dir).map_err(|e| {
                FleetError::Config(format!(
                    "cannot create the state directory {}: {e}",
                    dir.display()
                ))
            })?;
            let state_id = match local {
                Some(id) => id,
                None => {
                    let id = new_state_id();
                    write_state_id(dir, &id)?;
                    id
                }
            };
            let record = Registered {
                state_id: state_id.clone(),
                state_dir: dir.display().to_string(),
                host: host.to_string(),
            };
            let txn = Txn::new()
                .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                .and_then([TxnOp::put(
                    key.clone(),
                    serde_json::to_vec(&record).unwrap_or_default(),
                    None,
                )])
                .or_else([TxnOp::get(key.clone(), None)]);
            let response = tokio::time::timeout(timeout, client.txn(txn))
                .await
                .map_err(|_| coordinator.unreachable("recording the identity", "timed out"))?
                .map_err(|e| coordinator.unreachable("recording the identity", e))?;
            if response.succeeded() {
                tracing::info!(identity, state_id, dir = %dir.display(), "recorded the identity's state directory in etcd");
                return Ok(());
            }
            // Another process recorded it meanwhile: it must be this one.
            let theirs = response.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(get) => get
                    .kvs()
                    .first()
                    .and_then(|kv| serde_json::from_slice::<Registered>(kv.value()).ok()),
                _ => None,
            });
            match theirs {
                Some(theirs) if theirs.state_id == state_id => Ok(()),
                Some(theirs) => Err(conflict(format!(
                    "{} recorded state id {} for it first, but {} holds {state_id}",
                    theirs.host,
                    theirs.state_id,
                    dir.display()
                ))),
                None => Err(conflict("its record in etcd is unreadable".into())),
            }
        }
    }
}

fn write_state_id(dir: &Path, id: &str) -> Result<(), FleetError> {
    let path = dir.join(STATE_ID_FILE);
    let temporary = dir.join(format!("{STATE_ID_FILE}.new"));
    let failed =
        |e: std::io::Error| FleetError::Config(format!("cannot write {}: {e}", path.display()));
    std::fs::write(&temporary, format!("{id}\n")).map_err(failed)?;
    std::fs::File::open(&temporary)
        .and_then(|file| file.sync_all())
        .map_err(failed)?;
    std::fs::rename(&temporary, &path).map_err(failed)?;
    std::fs::File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(failed)
}
