//! Requests that leaned on ranges another batch was writing (duplicates in
//! flight): answered once those are recorded, failed if their batch failed.

use super::queued::Queued;
use crate::error::SinkError;
use crate::state::{CommitRequest, lock};

/// How long a batch may wait for the bytes before a range it sent (held in
/// memory until they arrive) before it is failed and sent again. A stream
/// is read on while its batches wait, and the watcher sends a file's ranges
/// in order, so the bytes before arrive unless their batch is lost; this is
/// the way out should they not, long enough for a slow link to bring them.
pub(crate) const HOLD_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How often waiting requests are looked at when no round runs.
pub(super) const HOLD_RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Answers every request whose dependencies are now recorded; returns the rest.
pub(super) fn answer_ready(waiting: Vec<Queued>) -> Vec<Queued> {
    let mut still_waiting = Vec::new();
    for queued in waiting {
        match verdict(&queued.request) {
            Verdict::Ready => {
                let _ = queued.reply.send(Ok(()));
            }
            Verdict::Wait => {
                if !queued.reply.is_closed() {
                    still_waiting.push(queued);
                }
            }
            Verdict::Fail(reason) => {
                // Retryable: the watcher sends the batch again.
                let _ = queued.reply.send(Err(SinkError::Storage(reason)));
            }
        }
    }
    still_waiting
}

pub(super) enum Verdict {
    Ready,
    Wait,
    Fail(String),
}

pub(super) fn verdict(request: &CommitRequest) -> Verdict {
    let mut verdict = Verdict::Ready;
    for dependency in &request.dependencies {
        let state = lock(&dependency.slot.state);
        // A superseded generation's ranges are never written, but ranges
        // it still holds may be: its move aside can fail and leave it live.
        let still_held = || {
            state
                .held
                .range(..dependency.end)
                .any(|(&start, held)| start + held.bytes.len() as u64 > dependency.start)
        };
        if (state.record.superseded && !still_held())
            || state.record.placed.covers(dependency.start, dependency.end)
        {
            continue;
        }
        // Not recorded yet: fine while another batch is still writing it.
        let missing = state
            .record
            .placed
            .missing(dependency.start, dependency.end);
        if !missing.iter().all(|&(s, e)| state.pending.covers(s, e)) {
            return Verdict::Fail(format!(
                "range {}..{} of {} was being written by a batch that failed; send it again",
                dependency.start, dependency.end, state.record.dest_path
            ));
        }
        // Held for the bytes before it for too long: the batch that brings
        // them may be lost, or sit unread behind this very batch in a
        // stream whose waiting batches reached their bound. Failing this
        // one ends its stream, and the watcher sends both again, in order;
        // what it held stays, written and recorded by whoever fills the
        // gap, and its copy sent again finds it there.
        let stuck = state.held.range(..dependency.end).any(|(&start, held)| {
            start + held.bytes.len() as u64 > dependency.start && held.since.elapsed() > HOLD_WAIT
        });
        if stuck {
            return Verdict::Fail(format!(
                "range {}..{} of {} waited over {:?} for the bytes before it; send it again",
                dependency.start, dependency.end, state.record.dest_path, HOLD_WAIT
            ));
        }
        verdict = Verdict::Wait;
    }
    verdict
}
