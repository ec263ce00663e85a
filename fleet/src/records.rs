//! What the cluster's keys hold, shared by who writes and who reads them:
//! an identity's active process ([`Member`]), a process's announcement
//! ([`Announced`]) and its [`Role`].

use serde::{Deserialize, Serialize};

/// What an identity's key says of its active process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// The host name the process runs on (for people).
    pub host: String,
    pub pid: u32,
    /// Where clients reach it (a sink's Flight endpoint), once it serves.
    pub endpoint: Option<String>,
    pub state_dir: String,
    /// When it claimed the identity (Unix ms, for people).
    pub since_unix_ms: u64,
}

impl Member {
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }
}

/// A process's role for its identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Reaching etcd (at startup, or after losing it as a standby).
    Connecting,
    /// Another process is active; this one waits for its key to go.
    Standby,
    /// Holds the lease; waits for the previous process to let go of the
    /// state directory's lock (a frozen or dying active still holds it).
    WaitingForLock,
    /// Acts for the identity.
    Active,
    /// Stopped acting because its lease could not be kept; about to start
    /// over as a standby.
    Fenced,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Connecting => "connecting",
            Role::Standby => "standby",
            Role::WaitingForLock => "waiting_for_lock",
            Role::Active => "active",
            Role::Fenced => "fenced",
        }
    }
}

/// What a process says of itself under `members/` (see [`crate::presence`]).
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
