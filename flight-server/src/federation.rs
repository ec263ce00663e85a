//! A fleet's catalogue: ListFlights and GetFlightInfo sent to any member
//! answer for every member, and each FlightEndpoint's location names the
//! member that serves the file now, so a Flight consumer needs nothing but
//! one member's address: it calls DoGet where the endpoint says, and after
//! a takeover it lists again and resumes its cursor at the new location.
//!
//! A member asks the others with the [`SCOPE_HEADER`] set, so that they
//! answer for themselves only, and passes on the consumer's credentials
//! (the members of a fleet share their subscriber tokens).

use std::sync::Arc;
use std::time::Duration;

use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::{Criteria, FlightDescriptor, FlightInfo, Location};
use tonic::Status;
use tonic::metadata::MetadataValue;

use crate::client::ClientConfig;
use crate::tls::ClientTls;

/// Set on a member's requests to another: answer for yourself only.
pub const SCOPE_HEADER: &str = "x-tailflight-scope";
const SCOPE_MEMBER: &str = "member";

/// How long a member waits for the others' answers before leaving out
/// those that have not answered: a listing never hangs on one member.
const MEMBER_TIMEOUT: Duration = Duration::from_secs(3);

/// A member of the fleet as the catalogue sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// The identity it acts for.
    pub identity: String,
    /// Its Flight endpoint (`http://` or `https://`).
    pub endpoint: String,
}

/// The other members as a listing finds them.
#[derive(Clone, Debug, Default)]
pub struct Roster {
    /// The members serving now.
    pub served: Vec<Member>,
    /// Identities that have no member serving now (mid-takeover).
    pub unserved: Vec<String>,
}

/// Who the members are (the binary reads them from the coordinator).
pub trait Members: Send + Sync + 'static {
    /// This process, once it serves.
    fn own(&self) -> Option<Member>;
    /// The others, read when a listing asks.
    fn others(&self) -> futures::future::BoxFuture<'_, Roster>;
}

/// The catalogue's settings: who the members are, and how to reach them.
#[derive(Clone)]
pub struct Federation {
    pub members: Arc<dyn Members>,
    /// TLS towards the other members (their CA; this member's certificate
    /// as the client's where they ask for one).
    pub tls: Option<ClientTls>,
}

impl std::fmt::Debug for Federation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Federation")
            .field("own", &self.members.own())
            .field("tls", &self.tls)
            .finish()
    }
}

/// The Flight location of an endpoint: `grpc+tcp://` for `http://`,
/// `grpc+tls://` for `https://` (what Flight clients, pyarrow's among
/// them, connect to).
pub fn location_of(endpoint: &str) -> String {
    if let Some(rest) = endpoint.strip_prefix("http://") {
        format!("grpc+tcp://{rest}")
    } else if let Some(rest) = endpoint.strip_prefix("https://") {
        format!("grpc+tls://{rest}")
    } else {
        endpoint.to_string()
    }
}

/// What a request says of who asks: a member (answer for yourself), and
/// the consumer's credentials to pass on.
pub struct Asked {
    pub by_member: bool,
    pub authorization: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl Asked {
    pub fn of<T>(request: &tonic::Request<T>) -> Self {
        Self {
            by_member: request
                .metadata()
                .get(SCOPE_HEADER)
                .is_some_and(|value| value == SCOPE_MEMBER),
            authorization: request.metadata().get("authorization").cloned(),
        }
    }
}

impl Federation {
    /// Names this member as the location of its own files, and their
    /// identity in each one's `app_metadata`.
    pub fn stamp_own(&self, infos: &mut [FlightInfo]) {
        let Some(own) = self.members.own() else {
            return;
        };
        let location = location_of(&own.endpoint);
        for info in infos {
            for endpoint in &mut info.endpoint {
                endpoint.location = vec![Location {
                    uri: location.clone(),
                }];
            }
            if let Ok(serde_json::Value::Object(mut metadata)) =
                serde_json::from_slice::<serde_json::Value>(&info.app_metadata)
            {
                metadata.insert("identity".into(), own.identity.clone().into());
                info.app_metadata = serde_json::to_vec(&metadata).unwrap_or_default().into();
            }
        }
    }

    /// Every other member's files matching `criteria`. A member that does
    /// not answer in time is left out (its files come back once it or its
    /// successor serves), and said in the log.
    pub async fn list_others(&self, criteria: &[u8], asked: &Asked) -> Vec<FlightInfo> {
        let roster = self.members.others().await;
        let calls = roster.served.into_iter().map(|member| async move {
            let listed = tokio::time::timeout(
                MEMBER_TIMEOUT,
                self.list_at(&member, criteria.to_vec(), asked),
            )
            .await
            .unwrap_or_else(|_| Err(Status::deadline_exceeded("no answer in time")));
            (member, listed)
        });
        let mut infos = Vec::new();
        for (member, listed) in futures::future::join_all(calls).await {
            match listed {
                Ok(listed) => infos.extend(listed),
                Err(status) => tracing::warn!(
                    identity = %member.identity,
                    endpoint = %member.endpoint,
                    error = %status.message(),
                    "a member of the fleet did not list its files; its files are left out of this listing"
                ),
            }
        }
        for identity in roster.unserved {
            tracing::info!(%identity, "no member serves this identity now; its files are left out of this listing");
        }
        infos
    }

    /// Describes a file another member holds: the first member that knows
    /// it answers. Not found anywhere while an identity has no member
    /// serving, or a member did not answer, is unavailable (ask again),
    /// not missing.
    pub async fn describe_elsewhere(
        &self,
        descriptor: FlightDescriptor,
        asked: &Asked,
    ) -> Result<FlightInfo, Status> {
        let roster = self.members.others().await;
        let mut silent: Vec<String> = roster.unserved;
        // Every member at once; the first that holds the file answers.
        let mut asking: futures::stream::FuturesUnordered<_> = roster
            .served
            .into_iter()
            .map(|member| {
                let descriptor = descriptor.clone();
                async move {
                    let described = tokio::time::timeout(
                        MEMBER_TIMEOUT,
                        self.describe_at(&member, descriptor, asked),
                    )
                    .await
                    .unwrap_or_else(|_| Err(Status::deadline_exceeded("no answer in time")));
                    (member, described)
                }
            })
            .collect();
        while let Some((member, described)) = futures::StreamExt::next(&mut asking).await {
            match described {
                Ok(info) => return Ok(info),
                Err(status) if status.code() == tonic::Code::NotFound => {}
                Err(status) if status.code() == tonic::Code::InvalidArgument => {
                    return Err(Status::invalid_argument(format!(
                        "member {} ({}): {}",
                        member.identity,
                        member.endpoint,
                        status.message()
                    )));
                }
                Err(status) => {
                    tracing::warn!(identity = %member.identity, error = %status.message(), "a member of the fleet did not answer GetFlightInfo");
                    silent.push(member.identity.clone());
                }
            }
        }
        if silent.is_empty() {
            Err(Status::not_found(format!(
                "no member of the fleet holds {:?}",
                descriptor.path
            )))
        } else {
            Err(Status::unavailable(format!(
                "{:?} is not held by the members that answered; identities {} are not served now \
                 (a takeover under way?): ask again",
                descriptor.path,
                silent.join(", ")
            )))
        }
    }

    async fn client(
        &self,
        member: &Member,
    ) -> Result<FlightServiceClient<tonic::transport::Channel>, Status> {
        let config = ClientConfig {
            endpoint: member.endpoint.clone(),
            tls: self.tls.clone(),
            connect_timeout: MEMBER_TIMEOUT,
            ..ClientConfig::default()
        };
        crate::client::connect_plain(&config)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))
    }

    fn request<T>(&self, message: T, asked: &Asked) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request
            .metadata_mut()
            .insert(SCOPE_HEADER, MetadataValue::from_static(SCOPE_MEMBER));
        if let Some(authorization) = &asked.authorization {
            request
                .metadata_mut()
                .insert("authorization", authorization.clone());
        }
        request
    }

    async fn list_at(
        &self,
        member: &Member,
        criteria: Vec<u8>,
        asked: &Asked,
    ) -> Result<Vec<FlightInfo>, Status> {
        let mut client = self.client(member).await?;
        let mut stream = client
            .list_flights(self.request(
                Criteria {
                    expression: criteria.into(),
                },
                asked,
            ))
            .await?
            .into_inner();
        let mut infos = Vec::new();
        while let Some(info) = stream.message().await? {
            infos.push(info);
        }
        Ok(infos)
    }

    async fn describe_at(
        &self,
        member: &Member,
        descriptor: FlightDescriptor,
        asked: &Asked,
    ) -> Result<FlightInfo, Status> {
        let mut client = self.client(member).await?;
        Ok(client
            .get_flight_info(self.request(descriptor, asked))
            .await?
            .into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_become_flight_locations() {
        assert_eq!(location_of("http://h:1"), "grpc+tcp://h:1");
        assert_eq!(location_of("https://h:1"), "grpc+tls://h:1");
        assert_eq!(location_of("grpc+tcp://h:1"), "grpc+tcp://h:1");
    }
}
