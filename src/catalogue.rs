//! The fleet's members as a sink's Flight catalogue sees them: this sink
//! identity and its endpoint, and the other sink identities and their
//! endpoints, from the cluster's view this process reads every few seconds
//! (see `flight_server::federation`).

use std::sync::Arc;

use flight_server::federation::{Federation, Member, Members, Roster};
use futures::FutureExt;
use futures::future::BoxFuture;

struct FleetMembers {
    own: Member,
    /// The cluster as this process reads it every few seconds (see
    /// `fleet::presence`): a listing never waits on etcd.
    role: fleet::RoleStatus,
    /// Only members reached over TLS, when this sink serves TLS: the
    /// consumer's token is passed on to them.
    tls_only: bool,
}

impl Members for FleetMembers {
    fn own(&self) -> Option<Member> {
        Some(self.own.clone())
    }

    fn others(&self) -> BoxFuture<'_, Roster> {
        let mut roster = Roster::default();
        let Some(view) = self.role.cluster() else {
            return futures::future::ready(roster).boxed();
        };
        for identity in view.identities {
            if identity.kind != fleet::Kind::Sink.singular()
                || identity.identity == self.own.identity
            {
                continue;
            }
            match identity.active.and_then(|active| active.member.endpoint) {
                Some(endpoint) if self.tls_only && !endpoint.starts_with("https://") => {
                    tracing::warn!(identity = %identity.identity, %endpoint, "a member of this TLS fleet serves without TLS: left out of listings (the consumer's token is not sent in clear)");
                    roster.unserved.push(identity.identity);
                }
                Some(endpoint) => roster.served.push(Member {
                    identity: identity.identity,
                    endpoint,
                }),
                None => roster.unserved.push(identity.identity),
            }
        }
        futures::future::ready(roster).boxed()
    }
}

/// The catalogue of sink identity `identity`, served at `advertise`. With
/// TLS the members reach each other as their clients do: the CA of
/// `--client-ca` (a fleet's members share one), this sink's certificate as
/// the client's.
pub fn federation(
    role: &fleet::RoleStatus,
    identity: &str,
    advertise: &str,
    tls: Option<&flight_server::tls::ServerTls>,
) -> Option<Federation> {
    let tls = match tls {
        None => None,
        Some(server) => match &server.client_ca {
            Some(ca) => Some(flight_server::tls::ClientTls {
                ca: ca.clone(),
                cert: Some(server.cert.clone()),
                key: Some(server.key.clone()),
                domain: None,
            }),
            None => {
                tracing::warn!(
                    "TLS without --client-ca: this sink cannot check the other members' \
                     certificates, so its listings name its own files only"
                );
                return None;
            }
        },
    };
    Some(Federation {
        members: Arc::new(FleetMembers {
            own: Member {
                identity: identity.to_string(),
                endpoint: advertise.to_string(),
            },
            role: role.clone(),
            tls_only: tls.is_some(),
        }),
        tls,
    })
}
