//! What a simulation is told: the streams, their rate and bursts, chunk
//! sizes, and when the run ends.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What to simulate. Partial configs deserialize with the remaining fields defaulted.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(default)]
pub struct SimConfig {
    /// Output directory (created if missing).
    pub dir: PathBuf,
    /// Run name, e.g. "r0001"; files are "{run}-s{stream:02}-c{chunk:03}.xtc2".
    pub run: String,
    /// Files written in parallel.
    pub streams: usize,
    /// Threads that make the writes, each serving every `writer_threads`-th stream;
    /// `None` gives each stream its own thread. Fewer threads wake less often, so a
    /// writer sharing a small machine with what it feeds takes less of its CPU.
    pub writer_threads: Option<usize>,
    /// Writes (frames, or blocks of `events_per_write` events) per second per stream;
    /// 0 writes back to back.
    pub rate_hz: f64,
    /// Bytes per frame, or per event when `events_per_write` > 1.
    pub frame_bytes: usize,
    /// Events batched into one write: each write is `frame_bytes * events_per_write`
    /// bytes (1 MHz of 100 B events is `rate_hz` 1000, `frame_bytes` 100,
    /// `events_per_write` 1000).
    pub events_per_write: usize,
    /// Bursts start every `burst_every` after the run's start and last `burst_len`;
    /// both must be set for bursts to happen.
    pub burst_every: Option<Duration>,
    pub burst_len: Option<Duration>,
    /// Rate multiplier during bursts.
    pub burst_factor: f64,
    /// A chunk file is closed and renamed when it reaches this size.
    pub chunk_bytes: u64,
    /// The run stops at whichever of `duration` and `total_bytes` comes first; with
    /// neither it runs until stopped.
    pub duration: Option<Duration>,
    /// Bytes for the whole run, split evenly across streams.
    pub total_bytes: Option<u64>,
    pub seed: u64,
    /// If set, one line is appended per write():
    /// "file offset len unix_nanos_after_write_returned" (file is the final name).
    pub write_log: Option<PathBuf>,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            dir: PathBuf::from("sim-data"),
            run: "r0001".to_string(),
            streams: 4,
            writer_threads: None,
            rate_hz: 120.0,
            frame_bytes: 1 << 20,
            events_per_write: 1,
            burst_every: None,
            burst_len: None,
            // Only used once bursts are configured; a visible multiplier by default.
            burst_factor: 4.0,
            chunk_bytes: 64 << 20,
            duration: Some(Duration::from_secs(10)),
            total_bytes: None,
            seed: 1,
            write_log: None,
        }
    }
}
