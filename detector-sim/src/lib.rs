//! A writer that behaves like a beamline DAQ (LCLS-II style), for tests, demos and
//! benchmarks of tailflight.
//!
//! Several streams write in parallel, each into a sequence of chunk files that grow by
//! plain sequential writes at a paced rate, live as "<name>.inprogress" while growing and
//! are renamed to "<name>" when full or when the run ends; an end-of-run marker lists
//! every final file. Content is a pure function of (seed, final name, offset) — see
//! [`fill`] — so any receiver can check any byte range it holds.

mod config;
mod content;
pub mod delay_line;
pub mod floor;
mod pacing;
mod stream;

pub use config::SimConfig;
pub use content::{fill, first_mismatch};

use anyhow::{Context, Result, anyhow, bail, ensure};
use serde::{Deserialize, Serialize};
use std::fs;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use stream::{Shared, StreamOutput, WriteLog};

/// What a run produced.
#[derive(Clone, Debug)]
pub struct SimReport {
    /// (final name, size) of every file, sorted by name.
    pub files: Vec<(String, u64)>,
    pub bytes: u64,
    pub elapsed: Duration,
}

/// The end-of-run marker "{run}.end.json", written last (temp file + rename) so its
/// presence means every listed file has its final name and size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EndMarker {
    pub run: String,
    pub seed: u64,
    pub bytes: u64,
    pub files: Vec<EndFile>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EndFile {
    pub name: String,
    pub size: u64,
}

impl EndMarker {
    pub fn file_name(run: &str) -> String {
        format!("{run}.end.json")
    }
}

/// Blocking. Writes until the duration or total is reached or `stop` is set, then
/// renames the last chunks and writes the end-of-run marker.
pub fn run(cfg: &SimConfig, stop: &AtomicBool) -> Result<SimReport> {
    let write_size = validate(cfg)?;
    fs::create_dir_all(&cfg.dir)
        .with_context(|| format!("creating output directory {}", cfg.dir.display()))?;
    let marker_path = cfg.dir.join(EndMarker::file_name(&cfg.run));
    if fs::symlink_metadata(&marker_path).is_ok() {
        bail!(
            "run {:?} already ended in this directory ({} exists)",
            cfg.run,
            marker_path.display()
        );
    }
    let log = cfg.write_log.as_deref().map(WriteLog::open).transpose()?;

    tracing::info!(
        dir = %cfg.dir.display(), run = %cfg.run, streams = cfg.streams,
        rate_hz = cfg.rate_hz, write_bytes = write_size, "simulated run starting"
    );
    let start = Instant::now();
    let abort = AtomicBool::new(false);
    let shared = Shared {
        cfg,
        write_size,
        start,
        end: cfg.duration.and_then(|d| start.checked_add(d)),
        stop,
        abort: &abort,
        log: log.as_ref(),
    };
    let quotas: Vec<Option<u64>> = (0..cfg.streams)
        .map(|i| {
            cfg.total_bytes.map(|t| {
                let n = cfg.streams as u64;
                t / n + u64::from((i as u64) < t % n)
            })
        })
        .collect();

    let threads = cfg.writer_threads.unwrap_or(cfg.streams).min(cfg.streams);
    let groups: Vec<Vec<(usize, Option<u64>)>> = (0..threads)
        .map(|t| {
            (t..cfg.streams)
                .step_by(threads)
                .map(|i| (i, quotas[i]))
                .collect()
        })
        .collect();

    let results: Vec<Result<Vec<StreamOutput>>> = std::thread::scope(|scope| {
        let mut started = Vec::with_capacity(threads);
        for (t, members) in groups.iter().enumerate() {
            let shared = &shared;
            let spawned = std::thread::Builder::new()
                .name(format!("sim-w{t:02}"))
                .spawn_scoped(scope, move || {
                    let r = stream::run_streams(shared, members);
                    if r.is_err() {
                        shared.abort.store(true, Ordering::Relaxed);
                    }
                    r
                });
            match spawned {
                Ok(handle) => started.push(Ok(handle)),
                Err(e) => {
                    abort.store(true, Ordering::Relaxed);
                    started.push(Err(
                        anyhow::Error::new(e).context(format!("starting writer thread {t}"))
                    ));
                    break;
                }
            }
        }
        started
            .into_iter()
            .enumerate()
            .map(|(t, s)| {
                s.and_then(|h| {
                    h.join().unwrap_or_else(|_| {
                        let streams: Vec<usize> = groups[t].iter().map(|&(i, _)| i).collect();
                        Err(anyhow!(
                            "the writer thread of streams {streams:?} of run {} panicked",
                            cfg.run
                        ))
                    })
                })
            })
            .collect()
    });

    let flushed = log.as_ref().map_or(Ok(()), WriteLog::flush);
    let mut files = Vec::new();
    let mut bytes = 0u64;
    let mut first_err = None;
    for r in results {
        match r {
            Ok(outputs) => {
                for out in outputs {
                    files.extend(out.files);
                    bytes += out.bytes;
                }
            }
            Err(e) if first_err.is_none() => first_err = Some(e),
            Err(e) => tracing::error!("{e:#}"),
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    flushed?;
    let elapsed = start.elapsed();
    files.sort();

    let marker = EndMarker {
        run: cfg.run.clone(),
        seed: cfg.seed,
        bytes,
        files: files
            .iter()
            .map(|(name, size)| EndFile {
                name: name.clone(),
                size: *size,
            })
            .collect(),
    };
    write_marker(&marker_path, &marker)?;
    tracing::info!(
        run = %cfg.run, files = files.len(), bytes, elapsed_ms = elapsed.as_millis() as u64,
        "simulated run ended"
    );
    Ok(SimReport {
        files,
        bytes,
        elapsed,
    })
}

/// Checks the config and returns the size of one write.
fn validate(cfg: &SimConfig) -> Result<usize> {
    ensure!(
        (1..=1024).contains(&cfg.streams),
        "streams must be between 1 and 1024, got {}",
        cfg.streams
    );
    ensure!(
        cfg.writer_threads != Some(0),
        "writer_threads must be at least 1 when set"
    );
    // The name ends up in file names and in the space-separated write log.
    ensure!(
        !cfg.run.is_empty()
            && !cfg
                .run
                .contains(|c: char| c == '/' || c.is_whitespace() || c.is_control()),
        "run name {:?} must be non-empty, without '/' or whitespace",
        cfg.run
    );
    ensure!(cfg.frame_bytes > 0, "frame_bytes must be positive");
    ensure!(
        cfg.events_per_write > 0,
        "events_per_write must be positive"
    );
    ensure!(cfg.chunk_bytes > 0, "chunk_bytes must be positive");
    ensure!(
        cfg.rate_hz.is_finite() && cfg.rate_hz >= 0.0,
        "rate_hz must be finite and >= 0, got {}",
        cfg.rate_hz
    );
    match (cfg.burst_every, cfg.burst_len) {
        (None, None) => {}
        (Some(every), Some(_)) => {
            ensure!(!every.is_zero(), "burst_every must be positive");
            ensure!(
                cfg.burst_factor.is_finite() && cfg.burst_factor > 0.0,
                "burst_factor must be finite and > 0, got {}",
                cfg.burst_factor
            );
        }
        _ => bail!("burst_every and burst_len must be set together"),
    }
    cfg.frame_bytes
        .checked_mul(cfg.events_per_write)
        .filter(|&n| isize::try_from(n).is_ok())
        .with_context(|| {
            format!(
                "frame_bytes {} x events_per_write {} is too large",
                cfg.frame_bytes, cfg.events_per_write
            )
        })
}

/// Writes the marker to "<marker>.inprogress", syncs it and renames it into place, so
/// a reader never sees a partial marker.
fn write_marker(path: &std::path::Path, marker: &EndMarker) -> Result<()> {
    let mut tmp_name = path.as_os_str().to_owned();
    tmp_name.push(stream::INPROGRESS);
    let tmp = PathBuf::from(tmp_name);
    let json = serde_json::to_vec_pretty(marker).context("encoding the end-of-run marker")?;
    let mut file = fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    file.write_all(&json)
        .and_then(|()| file.write_all(b"\n"))
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    drop(file);
    fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))
}
