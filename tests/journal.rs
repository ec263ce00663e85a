//! The sink's journal after a machine crash: acknowledged ranges whose files
//! were not flushed yet are gone from the page cache, and the replay at the
//! next start must write them back from the journal file.
//!
//! A machine crash cannot be staged here, so the test stages its effect:
//! it kills the sink while small appends stream in, then damages every
//! range the manifest still lists in the journal, in its destination file,
//! the way a lost page cache could (zeros where the bytes were). The
//! watcher never re-sends acknowledged ranges, so only the replay can
//! repair them; at the end the files must be identical to the source.

mod common;

use std::os::unix::fs::FileExt;
use std::time::Duration;

use common::{Pipeline, PipelineOptions, scratch, simulate_in_background};
use manifest_db::{JournalBytes, SinkManifest};

/// Zeroes, in the destination files, every range the manifest's journal
/// holds; returns how many ranges that was.
fn lose_journaled_ranges(pipeline: &Pipeline) -> usize {
    let manifest = SinkManifest::open(&pipeline.sink_state).expect("open the sink manifest");
    let entries = manifest.journal().expect("read the journal");
    let mut lost = 0;
    for (id, offset, bytes) in entries {
        let JournalBytes::InFile { len, .. } = bytes else {
            panic!("a new sink wrote an inline journal entry for {id:?}");
        };
        let record = manifest
            .get(&id)
            .expect("read a file record")
            .expect("journal entries are written with their record");
        let path = pipeline.dest_root.join(&record.dest_path);
        let Ok(file) = std::fs::OpenOptions::new().write(true).open(&path) else {
            continue;
        };
        file.write_all_at(&vec![0u8; len as usize], offset)
            .expect("damage a journaled range");
        lost += 1;
    }
    lost
}

#[test]
fn replay_restores_acknowledged_ranges_lost_from_the_files() {
    let dir = scratch("journal-replay");
    let mut pipeline = Pipeline::start(&dir, PipelineOptions::default());
    // Many small appends to a few files: every commit round journals.
    let mut sim = simulate_in_background(
        &dir,
        &pipeline.source,
        &[
            "--streams",
            "8",
            "--rate",
            "200",
            "--frame",
            "4KiB",
            "--chunk",
            "64MiB",
            "--duration",
            "600s",
        ],
    );

    let mut lost = 0;
    let mut crashes = 0;
    while crashes < 5 || (lost == 0 && crashes < 30) {
        // Killed while the sink says journaled ranges wait for their
        // files' flush (not after some time and hoping so).
        common::wait_until(
            "journaled ranges waiting for their files' flush",
            Duration::from_secs(60),
            || {
                pipeline
                    .status()
                    .is_some_and(|status| common::status_u64(&status, "journal_backlog_bytes") > 0)
            },
        );
        pipeline.sink.kill9();
        lost += lose_journaled_ranges(&pipeline);
        crashes += 1;
        pipeline.sink.start();
    }
    println!("{crashes} crashes, {lost} journaled ranges damaged in their files");
    assert!(lost > 0, "no crash caught a journaled range");

    pipeline.finish_run(&mut sim, "r0001");
}
