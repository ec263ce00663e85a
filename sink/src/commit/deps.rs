//! Requests that leaned on ranges another batch was writing (duplicates in
//! flight): answered once those are recorded, failed if their batch failed.

use super::*;

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
                let _ = queued.reply.send(Err(reason));
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
        if state.record.superseded || state.record.placed.covers(dependency.start, dependency.end) {
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
        verdict = Verdict::Wait;
    }
    verdict
}
