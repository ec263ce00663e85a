//! A fleet of tailflight processes coordinated through etcd.
//!
//! An *identity* (a sink's or a watcher's) is a name and a state directory
//! on storage every candidate host mounts. At most one process acts for it
//! at a time: the one holding the identity's key under an etcd lease. Any
//! other process started for it is a standby that waits for the key to go.
//!
//! - [`coordinator`]: the connection to etcd and the keys this crate owns;
//! - [`lease`]: a held lease, renewed in the background, and the moment
//!   its holder must stop acting (its fence deadline, on the monotonic clock);
//! - [`campaign`]: waiting as a standby and claiming an identity;
//! - [`registry`]: which state an identity owns (its manifest id), recorded
//!   at its first start, so a process with another state directory is refused;
//! - [`directory`]: the sink identities and their current endpoints, followed
//!   by watchers;
//! - [`role`]: what a process is for its identity now, for status and metrics;
//! - [`state_lock`]: whether another process holds a state directory's lock.
//! - [`records`]: what the cluster's keys hold (an active process, an
//!   announcement, a role);
//! - [`presence`]: every process of an identity announced with its role;
//! - [`view`]: the whole cluster as etcd records it, for operators;
//! - [`handover`]: planned handovers, asked for and heard.
//!
//! The crate knows nothing of sinks or watchers: the binary ties a lease's
//! fence to the work it guards.

pub mod campaign;
pub mod coordinator;
pub mod directory;
pub mod handover;
pub mod lease;
pub mod presence;
pub mod records;
pub mod registry;
pub mod role;
pub mod state_lock;
pub mod view;

pub use campaign::campaign;
pub use coordinator::{Coordinator, CoordinatorConfig, EtcdTls, Kind, parse_endpoints};
pub use directory::{SinkDirectory, follow_sinks};
pub use lease::{FenceReason, HeldLease};
pub use presence::Presence;
pub use records::{Announced, Member, Role};
pub use registry::register_state;
pub use role::{RoleReport, RoleStatus};
pub use view::{ClusterView, IdentityView};

/// Now, in ms since the Unix epoch (for people: never compared across hosts).
pub fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

/// What went wrong with the coordinator, and whose fault it is.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// The configuration is wrong (the operator's fault).
    #[error("coordinator configuration: {0}")]
    Config(String),
    /// etcd could not be reached or answered with an error (the cluster's
    /// or the network's fault); retried by callers that can wait.
    #[error("etcd at {endpoints}: {detail}")]
    Unreachable { endpoints: String, detail: String },
    /// etcd refused this client (wrong user or password, no permission on
    /// the cluster's keys): the operator's fault; retrying cannot help.
    #[error("etcd at {endpoints} refused us: {detail}")]
    Refused { endpoints: String, detail: String },
    /// Two processes disagree about what an identity owns (the operator's
    /// fault: a wrong --state, or a state directory that is not shared).
    #[error("identity {identity}: {detail}")]
    Conflict { identity: String, detail: String },
}
