//! `tailflight sink --commit-log FILE` (built with the `bench` feature): a
//! listener of the commit feed that appends one tab-separated line per
//! range a round made durable: source, key, generation, offset, length, the
//! round's commit time and the time its last batch of that file reached
//! the sink, both in unix nanoseconds. The benchmarks read it to measure
//! append-to-durable latency; it is not meant for production.

use std::io::Write;
use std::path::Path;
use std::time::SystemTime;

use anyhow::Context;

/// Follows the feed on a thread of its own, which ends once the sink's
/// committer stops (its feed closes); join it then.
pub fn attach(sink: &sink::Sink, path: &Path) -> anyhow::Result<std::thread::JoinHandle<()>> {
    let mut feed = sink
        .feed()
        .subscribe()
        .context("the sink's committer has stopped")?;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open the commit log {}", path.display()))?;
    let path = path.to_path_buf();
    let thread = std::thread::Builder::new()
        .name("commit-log".into())
        .spawn(move || {
            use tokio::sync::broadcast::error::RecvError;
            let mut out = std::io::BufWriter::new(out);
            loop {
                let written = match feed.blocking_recv() {
                    Ok(round) => write_round(&mut out, &round),
                    Err(RecvError::Lagged(missed)) => {
                        tracing::warn!(missed, "the commit log fell behind the feed; it misses rounds");
                        Ok(())
                    }
                    Err(RecvError::Closed) => return,
                };
                if let Err(error) = written {
                    tracing::warn!(path = %path.display(), %error, "cannot write the commit log; it stops here");
                    return;
                }
            }
        })?;
    Ok(thread)
}

fn write_round(out: &mut impl Write, round: &sink::CommitRound) -> std::io::Result<()> {
    let committed = unix_nanos(round.committed_at);
    for file in &round.files {
        let received = file.received.map_or(0, unix_nanos);
        for &(start, end) in &file.ranges {
            writeln!(
                out,
                "{}\t{}\t{}\t{start}\t{}\t{committed}\t{received}",
                file.id.source,
                file.id.key,
                file.id.generation,
                end - start
            )?;
        }
    }
    out.flush()
}

fn unix_nanos(time: SystemTime) -> u128 {
    time.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
