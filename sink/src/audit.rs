//! `tailflight audit`: reads the manifest of a stopped sink and checks that
//! no byte range was ever recorded twice and that every file's record
//! matches its placement log.

use serde::Serialize;

use manifest_db::SinkManifest;

use crate::durability::journal;

/// What `tailflight audit` reports about a manifest.
#[derive(Debug, Serialize)]
pub struct AuditReport {
    pub placed_bytes: u64,
    pub duplicate_bytes: u64,
    pub rewritten_bytes: u64,
    pub files: u64,
    pub sealed_files: u64,
    pub placements: u64,
    /// Placements that overlap an earlier one of the same file: must be 0.
    pub overlapping_placements: u64,
    /// Files whose record disagrees with their audit log: must be 0.
    pub record_mismatches: u64,
    /// Journal rounds whose manifest writes a machine crash had lost, redone
    /// before the audit (as the sink's next start would have).
    pub redone_journal_rounds: usize,
    pub examples: Vec<String>,
    /// Every file record, with `--files`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub records: Vec<(manifest_db::FileId, manifest_db::FileRecord)>,
}

/// Reads a manifest (of a stopped sink) and checks that no byte range was
/// ever recorded twice, and that each file's record matches its audit log.
/// Manifest writes a machine crash lost are redone from the journal first,
/// as the sink's start does: those ranges were acknowledged, and an audit
/// without them would report a manifest the sink never serves.
pub fn audit(state_dir: &std::path::Path, with_records: bool) -> anyhow::Result<AuditReport> {
    let manifest = SinkManifest::open(state_dir)?;
    let redone_journal_rounds =
        journal::redo_lost_rounds(&manifest, &state_dir.join(journal::JOURNAL_FILE_NAME)).map_err(
            |e| {
                anyhow::anyhow!(
                    "redoing lost manifest writes from the journal: {}",
                    e.into_detail()
                )
            },
        )?;
    let counters = manifest.counters()?;
    let files = manifest.all_files()?;
    let mut report = AuditReport {
        placed_bytes: counters.placed_bytes,
        duplicate_bytes: counters.duplicate_bytes,
        rewritten_bytes: counters.rewritten_bytes,
        files: files.len() as u64,
        sealed_files: files.iter().filter(|(_, r)| r.sealed.is_some()).count() as u64,
        placements: 0,
        overlapping_placements: 0,
        record_mismatches: 0,
        redone_journal_rounds,
        examples: Vec::new(),
        records: Vec::new(),
    };
    for (id, record) in &files {
        let placements = manifest.placements(id)?;
        report.placements += placements.len() as u64;
        let mut covered = manifest_db::IntervalSet::new();
        for &(offset, len) in &placements {
            if covered.missing(offset, offset + len) != vec![(offset, offset + len)] {
                report.overlapping_placements += 1;
                if report.examples.len() < 10 {
                    report.examples.push(format!(
                        "{}/{} gen {}: {offset}+{len} recorded twice",
                        id.source, id.key, id.generation
                    ));
                }
            }
            covered.insert(offset, offset + len);
        }
        if covered != record.placed {
            report.examples.push(format!(
                "{}/{} gen {}: record says {:?}, audit log says {:?}",
                id.source,
                id.key,
                id.generation,
                record.placed.ranges(),
                covered.ranges()
            ));
            report.record_mismatches += 1;
        }
    }
    if with_records {
        report.records = files;
    }
    Ok(report)
}
