//! Reconciliation: a watcher without state asks each sink what it holds
//! (its watermarks) before tailing, so that nothing placed is sent again.

use std::sync::Arc;
use std::time::Duration;

use flight_server::FlightPool;
use flight_server::client::ClientError;
use flight_server::protocol::{ACTION_WATERMARKS, FileWatermark};

/// One watermarks request may take this long before it is tried again: a
/// sink that accepts connections but never answers (stopped, hung) must not
/// hold the reconciliation on one attempt forever.
const RECONCILE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);
/// Highest generation a watermark may name (a file truncated or replaced
/// once a second for a hundred years stays far below it).
const MAX_BELIEVABLE_GENERATION: u64 = 1 << 40;
/// Longest wait between reconciliation attempts.
const RECONCILE_MAX_BACKOFF: Duration = Duration::from_secs(5);

/// A watcher without state asks every sink what it already holds, so nothing
/// placed is sent again.
///
/// It waits for every sink to answer, retrying without end (callers cancel
/// it on shutdown). Going on without a sink's watermarks would not be safe:
/// besides sending again everything that sink holds, it would start each
/// file at generation 1, and the sink acknowledges the data of a generation
/// it has seen replaced without placing it.
pub(crate) async fn reconcile(
    source: &str,
    pools: &[Arc<FlightPool>],
) -> Vec<(usize, FileWatermark)> {
    let body = serde_json::to_vec(&serde_json::json!({ "source": source })).unwrap_or_default();
    let mut all = Vec::new();
    for (index, pool) in pools.iter().enumerate() {
        let mut delay = Duration::from_millis(100);
        for attempt in 1u64.. {
            let answer = tokio::time::timeout(
                RECONCILE_ATTEMPT_TIMEOUT,
                pool.action(ACTION_WATERMARKS, body.clone()),
            )
            .await
            .unwrap_or_else(|_| {
                Err(ClientError::Endpoint {
                    endpoint: pool.name().to_owned(),
                    detail: format!("no answer within {RECONCILE_ATTEMPT_TIMEOUT:?}"),
                })
            });
            match answer {
                Ok(reply) => match serde_json::from_slice::<Vec<FileWatermark>>(&reply) {
                    Ok(mut marks) => {
                        // A generation is counted up by one per truncation
                        // or replacement of a file: one near u64::MAX is
                        // not the sink's record of anything, and following
                        // it would leave no generation to count up to.
                        marks.retain(|mark| {
                            let believable = (1..=MAX_BELIEVABLE_GENERATION).contains(&mark.generation);
                            if !believable {
                                tracing::error!(sink = pool.name(), key = %mark.key, generation = mark.generation, "ignoring the sink's watermark: no file has that generation");
                            }
                            believable
                        });
                        tracing::info!(
                            sink = pool.name(),
                            files = marks.len(),
                            "reconciled with the sink"
                        );
                        all.extend(marks.into_iter().map(|m| (index, m)));
                        break;
                    }
                    Err(e) => {
                        tracing::error!(sink = pool.name(), error = %e, "unreadable watermarks; starting from scratch for this sink");
                        break;
                    }
                },
                Err(e) => {
                    tracing::warn!(sink = pool.name(), attempt, error = %e, retry_in = ?delay, "the sink does not give its watermarks; tailing waits until every sink has (Ctrl-C stops)");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RECONCILE_MAX_BACKOFF);
                }
            }
        }
    }
    all
}
