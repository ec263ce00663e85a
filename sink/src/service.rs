//! The sink as a Flight service sees it: the [`Ingest`] the wire plugs into.
//! The only module of this crate that makes gRPC statuses: it maps a
//! [`SinkError`] (a placement's, or one that ends a subscription) to the
//! code that tells a peer whether to give up on what it asked (its fault)
//! or to ask again later (everything else).

use std::sync::Arc;

use flight_server::protocol::{ACTION_STATUS, ACTION_WATERMARKS};
use flight_server::{AwaitDurable, Ingest, RangeBatch, subscription};
use futures::StreamExt;
use futures::stream::BoxStream;
use serde::Deserialize;
use tonic::Status;

use crate::{Sink, SinkError, confine};

/// The gRPC status of a sink error. Only a peer's bad input is refused
/// (`InvalidArgument`); storage trouble, a poisoned or stopping sink ask for
/// a retry (`Unavailable`), and a bug in the sink is `Internal`, which the
/// watcher also retries: a sink's own failure never makes it give up on a file.
pub(crate) fn status_of(error: SinkError) -> Status {
    match error {
        SinkError::Peer(detail) => Status::invalid_argument(detail),
        error @ (SinkError::Storage(_) | SinkError::Poisoned(_) | SinkError::Shutdown) => {
            Status::unavailable(error.to_string())
        }
        error @ SinkError::Internal(_) => Status::internal(error.to_string()),
    }
}

impl Ingest for Sink {
    fn accept_source(&self, source: &str) -> Result<(), Status> {
        match confine::components(source) {
            Ok(parts) if parts.len() == 1 => Ok(()),
            _ => Err(Status::invalid_argument(format!(
                "source name {source:?} must be one plain path component (letters, digits, '-', '_', '.')"
            ))),
        }
    }

    async fn ingest(
        &self,
        source: Arc<str>,
        seq: u64,
        batch: RangeBatch,
    ) -> Result<AwaitDurable, Status> {
        let durable = self
            .place_batch(source, seq, batch)
            .await
            .map_err(status_of)?;
        Ok(Box::pin(async move { durable.await.map_err(status_of) }))
    }

    async fn get(
        &self,
        ticket: arrow_flight::Ticket,
        peer: String,
    ) -> Result<BoxStream<'static, Result<arrow_flight::FlightData, Status>>, Status> {
        let ticket = subscription::Ticket::decode(&ticket.ticket)
            .map_err(|e| Status::invalid_argument(format!("peer {peer}: {e}")))?;
        let stream = self.subscribe(ticket, peer).await.map_err(status_of)?;
        Ok(Box::pin(stream.map(|sent| sent.map_err(status_of))))
    }

    async fn list(&self, criteria: Vec<u8>) -> Result<Vec<arrow_flight::FlightInfo>, Status> {
        let criteria = String::from_utf8(criteria).map_err(|_| {
            Status::invalid_argument("the criteria expression must be a UTF-8 glob")
        })?;
        let sink = self.clone();
        tokio::task::spawn_blocking(move || sink.list_files(&criteria))
            .await
            .map_err(|e| Status::internal(format!("listing files: {e}")))?
            .map_err(status_of)
    }

    async fn info(
        &self,
        descriptor: arrow_flight::FlightDescriptor,
    ) -> Result<arrow_flight::FlightInfo, Status> {
        let [source, path] = &descriptor.path[..] else {
            return Err(Status::invalid_argument(
                "GetFlightInfo takes a path descriptor: [source, path of the file in it]",
            ));
        };
        let criteria = subscription::exact_glob(source, path);
        let sink = self.clone();
        let mut infos = tokio::task::spawn_blocking(move || sink.list_files(&criteria))
            .await
            .map_err(|e| Status::internal(format!("describing a file: {e}")))?
            .map_err(status_of)?;
        infos
            .pop()
            .ok_or_else(|| Status::not_found(format!("no file {path:?} in source {source:?}")))
    }

    async fn action(&self, name: &str, body: &[u8]) -> Result<Vec<u8>, Status> {
        let json = |value: serde_json::Result<Vec<u8>>| {
            value.map_err(|e| Status::internal(format!("encoding the {name} answer: {e}")))
        };
        match name {
            ACTION_STATUS => json(serde_json::to_vec(&self.status().map_err(status_of)?)),
            ACTION_WATERMARKS => {
                #[derive(Deserialize)]
                struct Request {
                    source: String,
                }
                let request: Request = serde_json::from_slice(body).map_err(|e| {
                    Status::invalid_argument(format!("watermarks wants {{\"source\": NAME}}: {e}"))
                })?;
                let sink = self.clone();
                // On a placement thread: these too may wait for the commit
                // gate, and peers could ask for many at once.
                let marks = self
                    .placing
                    .run(move || sink.watermarks(&request.source))
                    .await
                    .map_err(|e| {
                        status_of(SinkError::Internal(format!("reading watermarks: {e}")))
                    })?
                    .map_err(status_of)?;
                json(serde_json::to_vec(&marks))
            }
            other => Err(Status::invalid_argument(format!(
                "unknown action {other:?} (known: {ACTION_STATUS}, {ACTION_WATERMARKS})"
            ))),
        }
    }
}
