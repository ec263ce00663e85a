//! `tailflight sink --feed-log FILE`: a listener of the sink's commit feed
//! that appends what the manifest holds at the start as one JSON line
//! (`{"start": [files], "sequence": the last round they include}`), then
//! one line per later commit round as the feed tells it. Tests read it to check that the feed tells each durable byte exactly
//! once across crashes; a person can `tail -f` it to watch commits land.

use std::io::Write;
use std::path::Path;

use anyhow::Context;

/// Writes the start line, then follows the feed on a thread of its own,
/// which ends once the sink's committer stops (its feed closes); join it then.
pub fn attach(sink: &sink::Sink, path: &Path) -> anyhow::Result<std::thread::JoinHandle<()>> {
    // Subscribed before the manifest is read: no round falls in between.
    let mut feed = sink
        .feed()
        .subscribe()
        .context("the sink's committer has stopped")?;
    let snapshot = sink
        .durable_files()
        .context("reading the manifest for the feed log")?;
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("cannot open the feed log {}", path.display()))?;
    write_line(
        &mut out,
        &serde_json::json!({ "start": snapshot.files, "sequence": snapshot.sequence }),
    )
    .with_context(|| format!("writing the feed log {}", path.display()))?;
    let path = path.to_path_buf();
    let thread = std::thread::Builder::new()
        .name("feed-log".into())
        .spawn(move || {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                let written = match feed.blocking_recv() {
                    // Already in the start line.
                    Ok(round) if round.sequence <= snapshot.sequence => Ok(()),
                    Ok(round) => write_line(&mut out, &*round),
                    // Said in the log, so that a reader checking it knows
                    // what it holds is incomplete.
                    Err(RecvError::Lagged(missed)) => {
                        write_line(&mut out, &serde_json::json!({ "missed": missed }))
                    }
                    Err(RecvError::Closed) => return,
                };
                if let Err(error) = written {
                    tracing::warn!(path = %path.display(), %error, "cannot write the feed log; it stops here");
                    return;
                }
            }
        })?;
    Ok(thread)
}

/// One line per write, so a kill leaves at most the last line cut short.
fn write_line(out: &mut std::fs::File, value: &impl serde::Serialize) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(value)?;
    line.push(b'\n');
    out.write_all(&line)
}
