//! The commit log: one line per recorded range with the time it became
//! durable, for latency measurements (`--commit-log`).

use super::*;

pub(super) type Placement = (manifest_db::FileId, u64, u64);

/// One line per range: source, key, generation, offset, length, the
/// wall-clock nanoseconds at which it was durable and recorded, and those at
/// which its batch reached the sink (so a latency splits into the way there
/// and the commit).
pub(super) fn write_commit_log(
    log: &mut std::io::BufWriter<File>,
    placements: &[Placement],
    received_at: &[u128],
) -> std::io::Result<()> {
    use std::io::Write;
    let nanos = unix_nanos(std::time::SystemTime::now());
    for ((id, offset, len), received) in placements.iter().zip(received_at) {
        writeln!(
            log,
            "{}\t{}\t{}\t{offset}\t{len}\t{nanos}\t{received}",
            id.source, id.key, id.generation
        )?;
    }
    log.flush()
}

pub(super) fn unix_nanos(time: std::time::SystemTime) -> u128 {
    time.duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
