//! One sink reached over a connection of its own: how ([`ClientConfig`]),
//! what goes wrong ([`ClientError`]), and the one-off calls: actions,
//! live-tail subscriptions, plain clients for listings. The pool of
//! long-lived DoPut streams is [`crate::client`]'s.

use std::time::Duration;

use arrow_flight::flight_service_client::FlightServiceClient;
use tonic::transport::Endpoint;

use crate::tls::ClientTls;

/// How to reach one sink.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// `http://host:port`, or `https://host:port` with `tls`.
    pub endpoint: String,
    pub source: String,
    /// Separate TCP connections (not HTTP/2 streams on one connection).
    pub connections: usize,
    /// Bytes sent but not yet acknowledged, per connection.
    pub window_bytes: u64,
    pub max_message_bytes: usize,
    pub tls: Option<ClientTls>,
    pub connect_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            endpoint: "http://127.0.0.1:50051".into(),
            source: "default".into(),
            connections: 4,
            window_bytes: 32 << 20,
            max_message_bytes: 64 << 20,
            tls: None,
            connect_timeout: Duration::from_secs(5),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("sink {endpoint}: {detail}")]
    Endpoint { endpoint: String, detail: String },
    #[error("sink {endpoint}: action {action}: {status}")]
    Action {
        endpoint: String,
        action: String,
        status: Box<tonic::Status>,
    },
}

/// Runs one Flight action against a sink without starting a pool.
pub async fn action(
    config: &ClientConfig,
    name: &str,
    body: Vec<u8>,
) -> Result<Vec<u8>, ClientError> {
    run_action(config, &make_endpoint(config)?.1, name, body).await
}

/// A Flight client on a connection of its own, with the message limits.
pub(crate) async fn connect(
    config: &ClientConfig,
    endpoint: &Endpoint,
) -> Result<FlightServiceClient<tonic::transport::Channel>, ClientError> {
    let channel = endpoint
        .connect()
        .await
        .map_err(|e| ClientError::Endpoint {
            endpoint: config.endpoint.clone(),
            detail: format!("cannot connect: {}", error_chain(&e)),
        })?;
    Ok(FlightServiceClient::new(channel)
        .max_decoding_message_size(config.max_message_bytes)
        .max_encoding_message_size(config.max_message_bytes))
}

pub(crate) async fn run_action(
    config: &ClientConfig,
    endpoint: &Endpoint,
    name: &str,
    body: Vec<u8>,
) -> Result<Vec<u8>, ClientError> {
    let url = config.endpoint.clone();
    let mut client = connect(config, endpoint).await?;
    let action_error = |status: tonic::Status| ClientError::Action {
        endpoint: url.clone(),
        action: name.into(),
        status: Box::new(status),
    };
    let mut results = client
        .do_action(arrow_flight::Action {
            r#type: name.into(),
            body: body.into(),
        })
        .await
        .map_err(action_error)?
        .into_inner();
    let mut out = Vec::new();
    while let Some(result) = results.message().await.map_err(action_error)? {
        out.extend_from_slice(&result.body);
    }
    Ok(out)
}

/// One batch of a live-tail subscription, with the cursor update its
/// `app_metadata` carried.
pub struct Consumed {
    pub batch: arrow_array::RecordBatch,
    pub cursor: crate::subscription::CursorUpdate,
}

/// Opens a live-tail subscription (DoGet with `ticket`): its batches in
/// order, until the sink ends the stream (or, with `follow`, forever).
pub async fn subscribe(
    config: &ClientConfig,
    ticket: &crate::subscription::Ticket,
    token: Option<&str>,
) -> Result<futures::stream::BoxStream<'static, Result<Consumed, ClientError>>, ClientError> {
    use arrow_flight::decode::{DecodedPayload, FlightDataDecoder};
    use futures::{StreamExt, TryStreamExt};
    let url = config.endpoint.clone();
    let mut client = connect(config, &make_endpoint(config)?.1).await?;
    let refused = |status: tonic::Status| ClientError::Action {
        endpoint: url.clone(),
        action: "DoGet".into(),
        status: Box::new(status),
    };
    let mut request = tonic::Request::new(arrow_flight::Ticket::new(ticket.encode()));
    if let Some(token) = token {
        let value = format!("Bearer {token}")
            .parse()
            .map_err(|_| ClientError::Endpoint {
                endpoint: url.clone(),
                detail: "the subscriber token holds characters a header cannot carry".into(),
            })?;
        request.metadata_mut().insert("authorization", value);
    }
    let flight = client
        .do_get(request)
        .await
        .map_err(refused)?
        .into_inner()
        .map_err(arrow_flight::error::FlightError::from);
    let batches = FlightDataDecoder::new(flight).filter_map(move |decoded| {
        let url = url.clone();
        async move {
            let failed = |detail: String| ClientError::Endpoint {
                endpoint: url.clone(),
                detail,
            };
            match decoded {
                Err(arrow_flight::error::FlightError::Tonic(status)) => {
                    Some(Err(ClientError::Action {
                        endpoint: url.clone(),
                        action: "DoGet".into(),
                        status,
                    }))
                }
                Err(e) => Some(Err(failed(format!("subscription stream: {e}")))),
                Ok(decoded) => match decoded.payload {
                    DecodedPayload::RecordBatch(batch) => Some(
                        crate::subscription::CursorUpdate::decode(&decoded.inner.app_metadata)
                            .map(|cursor| Consumed { batch, cursor })
                            .map_err(|e| failed(e.to_string())),
                    ),
                    DecodedPayload::Schema(_) | DecodedPayload::None => None,
                },
            }
        }
    });
    Ok(batches.boxed())
}

/// A Flight location (`grpc+tcp://`, `grpc://`, `grpc+tls://`) as the URL
/// tonic connects to; `http(s)://` URLs as they are.
pub fn endpoint_url(location: &str) -> String {
    if let Some(rest) = location
        .strip_prefix("grpc+tcp://")
        .or_else(|| location.strip_prefix("grpc://"))
    {
        format!("http://{rest}")
    } else if let Some(rest) = location.strip_prefix("grpc+tls://") {
        format!("https://{rest}")
    } else {
        location.to_string()
    }
}

/// A Flight client on a connection of its own (listings, descriptions).
pub async fn connect_plain(
    config: &ClientConfig,
) -> Result<FlightServiceClient<tonic::transport::Channel>, ClientError> {
    connect(config, &make_endpoint(config)?.1).await
}

pub(crate) fn make_endpoint(config: &ClientConfig) -> Result<(String, Endpoint), ClientError> {
    let bad = |detail: String| ClientError::Endpoint {
        endpoint: config.endpoint.clone(),
        detail,
    };
    let window = config.window_bytes.clamp(64 << 10, (1 << 31) - 1) as u32;
    let url = endpoint_url(&config.endpoint);
    let mut endpoint = Endpoint::from_shared(url.clone())
        .map_err(|e| bad(format!("not a valid endpoint URL: {e}")))?
        .connect_timeout(config.connect_timeout)
        .tcp_nodelay(true)
        .initial_stream_window_size(window)
        .initial_connection_window_size(window)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(20))
        .keep_alive_while_idle(true);
    if let Some(tls) = &config.tls {
        let tls = tls.load().map_err(|e| bad(e.to_string()))?;
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| bad(format!("TLS configuration refused: {e}")))?;
    } else if url.starts_with("https://") {
        return Err(bad(
            "an https:// endpoint needs TLS settings (a CA certificate at least)".into(),
        ));
    }
    Ok((config.endpoint.clone(), endpoint))
}

/// An error with its sources ("transport error: ... : invalid peer certificate"),
/// since tonic's own message hides the TLS or socket cause.
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
