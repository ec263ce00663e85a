//! Where each file of a send starts: the sink's watermarks say what it
//! holds of every key of the source, so a rerun after an interruption sends
//! only the rest, and a file that changed since it was sent goes as a new
//! generation instead of being patched.

use std::collections::HashMap;
use std::fs::File;
use std::time::{Duration, Instant};

use flight_server::FlightPool;
use flight_server::client::ClientError;
use flight_server::protocol::{ACTION_WATERMARKS, FileWatermark};

use super::plan::Planned;
use super::report::Cut;

/// One watermarks request may take this long before it is tried again: the
/// sink reads the head of every file of the source to answer, which for a
/// large source takes a while.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a file starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Start {
    /// The sink holds it whole, sealed at its size.
    Sealed { generation: u64 },
    /// The sink holds every byte below `from` of this very file.
    Resume { generation: u64, from: u64 },
    /// From the beginning; a generation above 1 replaces what the sink has.
    Fresh { generation: u64 },
    /// The local file cannot be read: the sink's copy is left alone.
    Unreadable { reason: String },
}

/// Why the watermarks could not be had.
#[derive(Debug)]
pub(super) enum Unreachable {
    Cut(Cut),
    Interrupted,
}

impl From<Unreachable> for Cut {
    fn from(why: Unreachable) -> Self {
        match why {
            Unreachable::Cut(cut) => cut,
            Unreachable::Interrupted => Cut::Interrupted,
        }
    }
}

/// Asks the sink what it holds of `source`, retrying while it cannot be
/// reached, for at most `retry_for`. A sink that answers with a refusal
/// (not a transport failure) is not asked again.
pub(super) async fn watermarks(
    pool: &FlightPool,
    source: &str,
    retry_for: Duration,
) -> Result<HashMap<String, FileWatermark>, Unreachable> {
    let body = serde_json::to_vec(&serde_json::json!({ "source": source })).unwrap_or_default();
    let began = Instant::now();
    let mut delay = Duration::from_millis(100);
    loop {
        let left = retry_for.saturating_sub(began.elapsed());
        let attempt = ATTEMPT_TIMEOUT.min(left.max(Duration::from_secs(1)));
        let answer =
            tokio::time::timeout(attempt, pool.action(ACTION_WATERMARKS, body.clone())).await;
        let error = match answer {
            Ok(Ok(reply)) => {
                let marks: Vec<FileWatermark> = serde_json::from_slice(&reply).map_err(|e| {
                    Unreachable::Cut(Cut::Refused {
                        reason: format!("the sink's watermarks are unreadable (its fault): {e}"),
                    })
                })?;
                // A key may be listed once per generation: the newest counts.
                let mut newest: HashMap<String, FileWatermark> = HashMap::new();
                for mark in marks {
                    match newest.get(&mark.key) {
                        Some(seen) if seen.generation >= mark.generation => {}
                        _ => {
                            newest.insert(mark.key.clone(), mark);
                        }
                    }
                }
                return Ok(newest);
            }
            Ok(Err(ClientError::Action { status, .. })) if refusal(status.code()) => {
                return Err(Unreachable::Cut(Cut::Refused {
                    reason: format!("{}: {}", pool.name(), status.message()),
                }));
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("{}: no answer within {attempt:?}", pool.name()),
        };
        if began.elapsed() + delay >= retry_for {
            return Err(Unreachable::Cut(Cut::Unreachable { detail: error }));
        }
        tracing::warn!(%error, retry_in = ?delay, "cannot reach the sink yet");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
    }
}

/// A status that says the sink will not do it, as opposed to one it could
/// not be asked.
fn refusal(code: tonic::Code) -> bool {
    use tonic::Code;
    matches!(
        code,
        Code::InvalidArgument
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::FailedPrecondition
            | Code::NotFound
            | Code::Unimplemented
            | Code::OutOfRange
            | Code::AlreadyExists
    )
}

/// Each planned file's start, from the sink's watermarks (reads the head
/// of every file the sink knows, to tell the same file from another).
pub(super) fn starts(files: &[Planned], marks: &HashMap<String, FileWatermark>) -> Vec<Start> {
    files
        .iter()
        .map(|planned| match marks.get(&planned.key) {
            None => Start::Fresh { generation: 1 },
            Some(mark) => match head_crc(planned, mark.head_len) {
                Ok(head) => start_of(planned, mark, head),
                Err(reason) => Start::Unreadable { reason },
            },
        })
        .collect()
}

/// The crc32c of the local file's first `len` bytes; `None` if it is
/// shorter. A file that cannot be read is an error: it says nothing of
/// whether the sink's copy is this file.
fn head_crc(planned: &Planned, len: u64) -> Result<Option<u32>, String> {
    let read = || -> std::io::Result<Option<u32>> {
        let file = File::open(&planned.local)?;
        if file.metadata()?.len() < len {
            return Ok(None);
        }
        flight_server::checksum::crc32c_of_file_prefix(&file, len).map(Some)
    };
    read().map_err(|e| format!("cannot read {}: {e}", planned.local.display()))
}

/// The start of one file the sink knows, given the crc of the local file's
/// first `mark.head_len` bytes (`None`: it is shorter).
fn start_of(planned: &Planned, mark: &FileWatermark, local_head: Option<u32>) -> Start {
    let same_head = local_head == Some(mark.head_crc32c);
    let replace = Start::Fresh {
        generation: mark.generation.saturating_add(1),
    };
    // Bytes placed past the local size belong to another file.
    if mark.superseded || !same_head || mark.placed_bytes > planned.size {
        return replace;
    }
    match mark.sealed_size {
        Some(size) if size == planned.size => Start::Sealed {
            generation: mark.generation,
        },
        // Sealed at another size: the file changed since it was sent.
        Some(_) => replace,
        None if mark.contiguous_end <= planned.size => Start::Resume {
            generation: mark.generation,
            from: mark.contiguous_end,
        },
        None => replace,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(generation: u64, contiguous_end: u64, sealed: Option<u64>) -> FileWatermark {
        FileWatermark {
            key: "a".into(),
            generation,
            path: "a".into(),
            contiguous_end,
            placed_bytes: contiguous_end,
            sealed_size: sealed,
            superseded: false,
            head_crc32c: 7,
            head_len: contiguous_end.min(4096),
        }
    }

    fn planned(size: u64) -> Planned {
        Planned {
            local: "a".into(),
            key: "a".into(),
            size,
        }
    }

    #[test]
    fn the_same_file_resumes_and_another_replaces() {
        let same = Some(7);
        assert_eq!(
            start_of(&planned(100), &mark(1, 40, None), same),
            Start::Resume {
                generation: 1,
                from: 40
            }
        );
        assert_eq!(
            start_of(&planned(100), &mark(2, 100, Some(100)), same),
            Start::Sealed { generation: 2 }
        );
        // Grown since it was sealed, rewritten, shorter than what the sink has.
        for (size, mark, head) in [
            (150, mark(2, 100, Some(100)), same),
            (100, mark(1, 40, None), Some(8)),
            (30, mark(1, 40, None), None),
        ] {
            assert_eq!(
                start_of(&planned(size), &mark, head),
                Start::Fresh {
                    generation: mark.generation + 1
                }
            );
        }
        // Bytes placed past the local size: another file.
        let mut beyond = mark(1, 40, None);
        beyond.placed_bytes = 140;
        assert_eq!(
            start_of(&planned(100), &beyond, same),
            Start::Fresh { generation: 2 }
        );
        let mut superseded = mark(3, 40, None);
        superseded.superseded = true;
        assert_eq!(
            start_of(&planned(100), &superseded, same),
            Start::Fresh { generation: 4 }
        );
    }

    #[test]
    fn a_file_that_cannot_be_read_leaves_the_sinks_copy_alone() {
        let marks = HashMap::from([("a".to_string(), mark(1, 100, Some(100)))]);
        let missing = Planned {
            local: std::env::temp_dir().join("tailflight-resume-no-such-file"),
            key: "a".into(),
            size: 100,
        };
        let starts = starts(&[missing], &marks);
        assert!(
            matches!(&starts[0], Start::Unreadable { reason } if reason.contains("cannot read")),
            "{starts:?}"
        );
    }
}
