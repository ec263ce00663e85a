//! What each size and count flag may be, checked once at startup: a value
//! the wire cannot carry, the memory cannot hold or that would make a loop
//! spin is refused with the flag, the value and the bound named, instead of
//! reaching an `expect` or a silent clamp deep inside a library.

use std::time::Duration;

use crate::args::{SinkArgs, WatchArgs};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A batch's data is addressed with 32-bit signed offsets (Arrow's binary
/// columns), and HTTP/2 windows are at most 2^31 - 1 bytes.
const WIRE_MAX: u64 = (1 << 31) - 1;

/// Smallest message or window worth having: one row's header and a page.
const WIRE_MIN: u64 = 64 * KIB;

/// Room a batch message needs beyond its rows' bytes (columns, IPC and
/// gRPC framing).
const MESSAGE_OVERHEAD: u64 = 64 * KIB;

/// The journal file is 64 MiB; a round's ranges must fit in the quarter
/// its background flush starts at.
const JOURNAL_RANGE_MAX: u64 = 16 * MIB;

/// Bytes held ahead of a gap, or queued for a relay, beyond which a
/// process would more likely be killed for its memory than help anyone.
const MEMORY_MAX: u64 = 64 * GIB;

/// Files a process keeps open, and connections per sink.
const OPEN_FILES_MAX: u64 = 1 << 20;
const CONNECTIONS_MAX: u64 = 256;

/// Every problem with the flags, one line each (empty: all fine).
pub struct Problems(Vec<String>);

impl Problems {
    fn new() -> Self {
        Self(Vec::new())
    }

    fn within(&mut self, flag: &str, value: u64, low: u64, high: u64, why: &str) {
        if value < low || value > high {
            self.0.push(format!(
                "--{flag} {} is outside {}..={} ({why})",
                shown(value),
                shown(low),
                shown(high)
            ));
        }
    }

    /// `--max-message-bytes`: what the wire can carry.
    fn message_size(&mut self, value: u64) {
        self.within(
            "max-message-bytes",
            value,
            WIRE_MIN,
            WIRE_MAX,
            "a batch's data is addressed with 32-bit offsets",
        );
    }

    /// An HTTP/2 flow-control window.
    fn window(&mut self, flag: &str, value: u64) {
        self.within(flag, value, WIRE_MIN, WIRE_MAX, "an HTTP/2 window");
    }

    /// `--max-open-files`.
    fn open_files(&mut self, value: usize) {
        self.within(
            "max-open-files",
            value as u64,
            1,
            OPEN_FILES_MAX,
            "descriptors",
        );
    }

    fn positive(&mut self, flag: &str, value: Duration, why: &str) {
        if value.is_zero() {
            self.0.push(format!("--{flag} must be more than 0 ({why})"));
        }
    }

    fn require(&mut self, holds: bool, problem: impl FnOnce() -> String) {
        if !holds {
            self.0.push(problem());
        }
    }

    /// Ok, or every problem in one error.
    pub fn into_result(self) -> Result<(), FlagsRefused> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(FlagsRefused(self.0))
        }
    }
}

/// Flags refused before anything started: the caller's mistake (exit 2).
#[derive(Debug)]
pub struct FlagsRefused(Vec<String>);

impl std::fmt::Display for FlagsRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "refused flags:")?;
        for problem in &self.0 {
            write!(f, "\n  {problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for FlagsRefused {}

/// A size as people write it: bytes, or KiB/MiB/GiB when exact.
fn shown(value: u64) -> String {
    for (unit, size) in [("TiB", GIB << 10), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)] {
        if value >= size && value.is_multiple_of(size) {
            return format!("{}{unit}", value / size);
        }
    }
    value.to_string()
}

pub fn check_sink(args: &SinkArgs) -> Result<(), FlagsRefused> {
    let mut problems = Problems::new();
    problems.message_size(args.max_message_bytes as u64);
    problems.window("window-bytes", u64::from(args.window_bytes));
    problems.open_files(args.max_open_files);
    problems.within(
        "journal-max-range",
        args.journal_max_range,
        0,
        JOURNAL_RANGE_MAX,
        "a quarter of the 64 MiB journal file; 0 turns the journal off",
    );
    problems.within(
        "hold-limit",
        args.hold_limit,
        0,
        MEMORY_MAX,
        "memory the sink may hold ahead of gaps",
    );
    if let Some(min) = args.direct_min.0 {
        problems.within(
            "direct-min",
            min,
            0,
            WIRE_MAX,
            "a range is never larger than a batch",
        );
    }
    problems.within(
        "kafka-outbox-limit",
        args.events.kafka_outbox_limit,
        1,
        MEMORY_MAX,
        "bytes of events waiting for the relay",
    );
    problems.into_result()
}

pub fn check_watch(args: &WatchArgs) -> Result<(), FlagsRefused> {
    let mut problems = Problems::new();
    let message = args.max_message_bytes as u64;
    problems.message_size(message);
    problems.within(
        "connections",
        args.connections as u64,
        1,
        CONNECTIONS_MAX,
        "TCP connections per sink",
    );
    problems.window("window", args.window);
    problems.within(
        "batch-bytes",
        args.batch_bytes,
        4 * KIB,
        WIRE_MAX,
        "a batch's data is addressed with 32-bit offsets",
    );
    problems.within(
        "max-row-bytes",
        args.max_row_bytes,
        1,
        args.batch_bytes.max(1),
        "a range fits in a batch (--batch-bytes)",
    );
    // A batch is sent once it holds --batch-bytes, so it may hold up to
    // one more row than that.
    let largest_batch = args
        .batch_bytes
        .saturating_add(args.max_row_bytes)
        .saturating_add(MESSAGE_OVERHEAD);
    problems.require(largest_batch <= message, || {
        format!(
            "--max-message-bytes {} cannot carry a batch of --batch-bytes {} plus one row of \
             --max-row-bytes {} ({} with its framing)",
            shown(message),
            shown(args.batch_bytes),
            shown(args.max_row_bytes),
            shown(largest_batch)
        )
    });
    problems.open_files(args.max_open_files);
    problems.within(
        "metrics-top-files",
        args.metrics_top_files as u64,
        0,
        100_000,
        "a series per file and label set",
    );
    problems.positive("poll-min", args.poll_min, "a poll loop would spin");
    problems.positive("rescan", args.rescan, "a rescan loop would spin");
    problems.require(args.poll_min <= args.poll_max, || {
        format!(
            "--poll-min {:?} is longer than --poll-max {:?}",
            args.poll_min, args.poll_max
        )
    });
    problems.into_result()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_shown_as_people_write_them() {
        assert_eq!(shown(64 << 20), "64MiB");
        assert_eq!(shown(3 << 30), "3GiB");
        assert_eq!(shown(WIRE_MAX), "2147483647");
        assert_eq!(shown(1536), "1536");
    }

    #[test]
    fn every_problem_is_said_with_its_flag_and_bounds() {
        let mut problems = Problems::new();
        problems.within("a", 5, 1, 4, "why");
        problems.within("b", 2, 1, 4, "fine");
        problems.positive("c", Duration::ZERO, "spins");
        let text = problems.into_result().unwrap_err().to_string();
        assert_eq!(
            text,
            "refused flags:\n  --a 5 is outside 1..=4 (why)\n  --c must be more than 0 (spins)"
        );
    }
}
