//! The fleet's members as a sink's Flight catalogue sees them: this sink
//! identity and its endpoint, and the other sink identities and their
//! endpoints, read from the coordinator when a listing asks (see
//! `flight_server::federation`).

use std::sync::{Arc, Mutex};

use flight_server::federation::{Federation, Member, Members, Roster};
use futures::FutureExt;
use futures::future::BoxFuture;

struct FleetMembers {
    own: Member,
    coordinator: fleet::Coordinator,
    /// What etcd said last: kept for while it cannot be read.
    last: Mutex<Roster>,
}

impl Members for FleetMembers {
    fn own(&self) -> Option<Member> {
        Some(self.own.clone())
    }

    fn others(&self) -> BoxFuture<'_, Roster> {
        async move {
            let view = match fleet::view::read(&self.coordinator).await {
                Ok(view) => view,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot read the fleet's members; listing with the last ones known");
                    return self.last.lock().map(|last| last.clone()).unwrap_or_default();
                }
            };
            let mut roster = Roster::default();
            for identity in view.identities {
                if identity.kind != fleet::Kind::Sink.singular()
                    || identity.identity == self.own.identity
                {
                    continue;
                }
                match identity.active.and_then(|active| active.member.endpoint) {
                    Some(endpoint) => roster.served.push(Member {
                        identity: identity.identity,
                        endpoint,
                    }),
                    None => roster.unserved.push(identity.identity),
                }
            }
            if let Ok(mut last) = self.last.lock() {
                *last = roster.clone();
            }
            roster
        }
        .boxed()
    }
}

/// The catalogue of sink identity `identity`, served at `advertise`. With
/// TLS the members reach each other as their clients do: the CA of
/// `--client-ca` (a fleet's members share one), this sink's certificate as
/// the client's.
pub fn federation(
    coordinator: &fleet::Coordinator,
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
            coordinator: coordinator.clone(),
            last: Mutex::default(),
        }),
        tls,
    })
}
