//! The connection to etcd and the keys of a tailflight cluster.
//!
//! Keys (under `/tailflight/<cluster>/`):
//! - `sinks/<identity>`, `watchers/<identity>`: the active process of an
//!   identity, attached to its lease (gone when the lease goes). Its create
//!   revision is the identity's epoch: every takeover makes a larger one.
//! - `identities/sinks/<identity>`, `identities/watchers/<identity>`: what
//!   state the identity owns (see [`crate::registry`]); never leased, so an
//!   identity with no active process is still known.
//! - `members/<kind>/<identity>/<node>:<pid>`: every process started for an
//!   identity, its role and epoch, on a lease of its own (for fleet views).
//! - `activations/<kind>/<identity>`: how often a process became active.
//! - `handover/<kind>/<identity>`: a planned handover asked of the active.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, GetOptions};

use crate::FleetError;

/// The two kinds of identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Sink,
    Watcher,
}

impl Kind {
    pub fn plural(self) -> &'static str {
        match self {
            Kind::Sink => "sinks",
            Kind::Watcher => "watchers",
        }
    }

    pub fn singular(self) -> &'static str {
        match self {
            Kind::Sink => "sink",
            Kind::Watcher => "watcher",
        }
    }

    pub fn from_plural(text: &str) -> Option<Self> {
        match text {
            "sinks" => Some(Kind::Sink),
            "watchers" => Some(Kind::Watcher),
            _ => None,
        }
    }
}

/// TLS towards etcd (PEM files).
#[derive(Clone, Debug)]
pub struct EtcdTls {
    pub ca: PathBuf,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// How to reach the coordinator and how long a lease lives.
#[derive(Clone, Debug)]
pub struct CoordinatorConfig {
    /// etcd client URLs (`http://h1:2379`, or `https://` with `tls`).
    pub endpoints: Vec<String>,
    /// Several tailflight clusters may share one etcd: keys live under
    /// `/tailflight/<cluster>/`.
    pub cluster: String,
    /// A lease's time to live: how long a dead active holds its identity.
    pub ttl: Duration,
    /// etcd authentication (user, password).
    pub user: Option<(String, String)>,
    pub tls: Option<EtcdTls>,
}

impl CoordinatorConfig {
    /// How long each call to etcd may take before it counts as failed: a
    /// third of the TTL, so a renewal that hangs leaves time for two more.
    pub fn call_timeout(&self) -> Duration {
        (self.ttl / 3).max(Duration::from_millis(500))
    }
}

/// `etcd://h1:2379,h2:2379` (or `etcds://` for TLS, or a plain
/// `h1:2379,h2:2379`) as client URLs.
pub fn parse_endpoints(text: &str) -> Result<Vec<String>, FleetError> {
    let (scheme, hosts) = if let Some(rest) = text.strip_prefix("etcd://") {
        ("http", rest)
    } else if let Some(rest) = text.strip_prefix("etcds://") {
        ("https", rest)
    } else if let Some(rest) = text.strip_prefix("http://") {
        ("http", rest)
    } else if let Some(rest) = text.strip_prefix("https://") {
        ("https", rest)
    } else {
        ("http", text)
    };
    let endpoints: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|host| !host.is_empty())
        .map(|host| format!("{scheme}://{}", host.trim_end_matches('/')))
        .collect();
    if endpoints.is_empty() {
        return Err(FleetError::Config(format!(
            "no etcd endpoint in {text:?} (expected etcd://host:port,host:port)"
        )));
    }
    for endpoint in &endpoints {
        let host = endpoint.split("://").nth(1).unwrap_or_default();
        if host.contains('/') || !host.contains(':') {
            return Err(FleetError::Config(format!(
                "etcd endpoint {endpoint:?} is not host:port"
            )));
        }
    }
    Ok(endpoints)
}

/// Clients of the etcd members and the cluster's key layout.
///
/// One client per member, used one at a time: a call that fails moves
/// every later call to the next member. etcd-client's own balancing over
/// several endpoints kept sending requests to a member that had died
/// (each one timing out), long enough to cost a lease.
#[derive(Clone)]
pub struct Coordinator {
    clients: Arc<Vec<Client>>,
    current: Arc<AtomicUsize>,
    config: CoordinatorConfig,
}

impl Coordinator {
    /// Connects and checks that etcd answers (a read of the cluster's
    /// prefix); the error names the endpoints tried.
    pub async fn connect(config: CoordinatorConfig) -> Result<Self, FleetError> {
        if config.cluster.is_empty() || config.cluster.contains('/') {
            return Err(FleetError::Config(format!(
                "cluster name {:?} must be one non-empty path component",
                config.cluster
            )));
        }
        let timeout = config.call_timeout();
        // No per-request timeout here: it becomes the gRPC deadline of
        // watches too, which etcd then ends. Unary calls are bounded where
        // they are made.
        let mut options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_keep_alive(Duration::from_secs(2), timeout)
            .with_keep_alive_while_idle(true)
            // A member cut off from its quorum refuses at once instead of
            // answering from a stale view (or hanging a renewal).
            .with_require_leader(true);
        if let Some((user, password)) = &config.user {
            options = options.with_user(user, password);
        }
        if let Some(tls) = &config.tls {
            options = options.with_tls(load_tls(tls)?);
        }
        let mut clients = Vec::new();
        for endpoint in &config.endpoints {
            let client = tokio::time::timeout(
                timeout * 2,
                Client::connect([endpoint.as_str()], Some(options.clone())),
            )
            .await
            .map_err(|_| FleetError::Unreachable {
                endpoints: endpoint.clone(),
                detail: format!("no answer within {timeout:?}"),
            })?
            .map_err(|e| classify(endpoint, e))?;
            clients.push(client);
        }
        let coordinator = Self {
            clients: Arc::new(clients),
            current: Arc::default(),
            config,
        };
        // Connections are lazy: one read proves a member with a leader
        // answers (each member is tried once).
        let mut last = None;
        for _ in 0..coordinator.clients.len() {
            match coordinator.get_prefix(&coordinator.prefix()).await {
                Ok(_) => return Ok(coordinator),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| FleetError::Config("no etcd endpoint".into())))
    }

    /// Moves later calls to the next member (after a failed call).
    pub fn next_member(&self) {
        self.current.fetch_add(1, Ordering::Relaxed);
    }

    pub fn config(&self) -> &CoordinatorConfig {
        &self.config
    }

    /// The client of the member calls go to now.
    pub fn client(&self) -> Client {
        let at = self.current.load(Ordering::Relaxed) % self.clients.len().max(1);
        self.clients[at].clone()
    }

    /// `/tailflight/<cluster>/`.
    pub fn prefix(&self) -> String {
        format!("/tailflight/{}/", self.config.cluster)
    }

    /// The key the active process of an identity holds.
    pub fn active_key(&self, kind: Kind, identity: &str) -> String {
        format!("{}{}/{identity}", self.prefix(), kind.plural())
    }

    /// The key recording what state an identity owns.
    pub fn registry_key(&self, kind: Kind, identity: &str) -> String {
        format!("{}identities/{}/{identity}", self.prefix(), kind.plural())
    }

    /// A process's announcement for an identity (see [`crate::presence`]).
    pub fn member_key(&self, kind: Kind, identity: &str, process: &str) -> String {
        format!(
            "{}members/{}/{identity}/{process}",
            self.prefix(),
            kind.plural()
        )
    }

    /// How often an identity became active (see [`crate::view`]).
    pub fn activations_key(&self, kind: Kind, identity: &str) -> String {
        format!("{}activations/{}/{identity}", self.prefix(), kind.plural())
    }

    /// A planned handover's request (see [`crate::handover`]).
    pub fn handover_key(&self, kind: Kind, identity: &str) -> String {
        format!("{}handover/{}/{identity}", self.prefix(), kind.plural())
    }

    pub fn endpoints_text(&self) -> String {
        self.config.endpoints.join(",")
    }

    /// The error of a failed call; later calls go to the next member.
    pub(crate) fn unreachable(&self, what: &str, e: impl std::fmt::Display) -> FleetError {
        self.next_member();
        FleetError::Unreachable {
            endpoints: self.endpoints_text(),
            detail: format!("{what}: {e}"),
        }
    }

    /// Every key and value under `prefix`, with the revision read at.
    pub async fn get_prefix(
        &self,
        prefix: &str,
    ) -> Result<(i64, Vec<etcd_client::KeyValue>), FleetError> {
        let mut client = self.client();
        let mut response = tokio::time::timeout(
            self.config.call_timeout(),
            client.get(prefix, Some(GetOptions::new().with_prefix())),
        )
        .await
        .map_err(|_| self.unreachable(&format!("reading {prefix}"), "timed out"))?
        .map_err(|e| self.unreachable(&format!("reading {prefix}"), e))?;
        let revision = response.header().map_or(0, |h| h.revision());
        Ok((revision, response.take_kvs()))
    }
}

/// A refusal (authentication, permission) apart from a failure to reach.
fn classify(endpoint: &str, error: etcd_client::Error) -> FleetError {
    let refused = matches!(
        &error,
        etcd_client::Error::GRpcStatus(status) if matches!(
            status.code(),
            tonic::Code::InvalidArgument | tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
        )
    );
    if refused {
        FleetError::Refused {
            endpoints: endpoint.to_string(),
            detail: error.to_string(),
        }
    } else {
        FleetError::Unreachable {
            endpoints: endpoint.to_string(),
            detail: error.to_string(),
        }
    }
}

fn load_tls(tls: &EtcdTls) -> Result<etcd_client::TlsOptions, FleetError> {
    let read = |path: &PathBuf| {
        std::fs::read(path).map_err(|e| {
            FleetError::Config(format!("cannot read etcd TLS file {}: {e}", path.display()))
        })
    };
    let mut options = etcd_client::TlsOptions::new()
        .ca_certificate(etcd_client::Certificate::from_pem(read(&tls.ca)?));
    match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            options = options.identity(etcd_client::Identity::from_pem(read(cert)?, read(key)?));
        }
        (None, None) => {}
        _ => {
            return Err(FleetError::Config(
                "an etcd client certificate needs its key, and the key its certificate".into(),
            ));
        }
    }
    Ok(options)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinator_urls_become_client_urls() {
        assert_eq!(
            parse_endpoints("etcd://h1:2379,h2:2379").unwrap(),
            ["http://h1:2379", "http://h2:2379"]
        );
        assert_eq!(
            parse_endpoints("etcds://h1:2379").unwrap(),
            ["https://h1:2379"]
        );
        assert_eq!(
            parse_endpoints("127.0.0.1:2379").unwrap(),
            ["http://127.0.0.1:2379"]
        );
        assert!(parse_endpoints("etcd://").is_err());
        assert!(parse_endpoints("etcd://h1").is_err());
        assert!(parse_endpoints("etcd://h1:2379/path").is_err());
    }
}
