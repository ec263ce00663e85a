//! A failed write against a failed fdatasync: a write
//! that fails leaves nothing the page cache claims, so its batch is refused
//! as retryable and the sink goes on; a flush that fails means the page
//! cache can no longer be trusted (the kernel reports a writeback error
//! once and may already have dropped the pages), so the sink is poisoned
//! until a restart recovers from its manifest and journal. No device here
//! can be made to fail an fdatasync, so the I/O fault points of
//! [`crate::fault`] make one fail with EIO.
//!
//! Each test's sink flushes file by file (`--sync files`): a `syncfs` of
//! the root would cover its files without an fdatasync for the fault to
//! replace.

use super::*;
use crate::durability::journal::JOURNAL_FILE_NAME;

fn open_flushing_files(dir: &std::path::Path) -> Sink {
    std::fs::create_dir_all(dir.join("root")).unwrap();
    Sink::open(&SinkConfig {
        root: dir.join("root"),
        state_dir: dir.join("state"),
        sync: SyncStrategy::Files,
        ..SinkConfig::default()
    })
    .unwrap()
}

/// A file's bytes, different for each file and offset.
fn content(len: usize, salt: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(salt))
        .collect()
}

/// What a watcher sees of an error: whether it sends the batch again.
fn is_retryable(error: &SinkError) -> bool {
    service::status_of(error.clone()).code() == tonic::Code::Unavailable
}

/// Stops a sink and opens it again on the same root and state directory,
/// as a restart does.
async fn restart(sink: Sink, dir: &std::path::Path) -> Sink {
    sink.shutdown().await;
    drop(sink);
    open_flushing_files(dir)
}

/// Asserts that every byte of the files is recorded exactly once, and
/// nothing else.
fn assert_recorded_once(dir: &std::path::Path, bytes: u64) {
    let report = audit(&dir.join("state"), false).unwrap();
    assert_eq!(report.placed_bytes, bytes, "{report:?}");
    assert_eq!(report.overlapping_placements, 0, "{report:?}");
    assert_eq!(report.record_mismatches, 0, "{report:?}");
}

/// Places the first 4 KiB of `file` of `source` (flushed in place with
/// its new directory), arms `point` for the source, then places the next
/// 4 KiB, which is journaled and acknowledged before its file is flushed;
/// returns the reason the background flush then poisons the sink with.
async fn journal_a_range_then_poison(
    sink: &Sink,
    source: &str,
    file: &str,
    whole: &[u8],
    point: crate::fault::Point,
) -> String {
    sink.ingest_batch(Arc::from(source), 1, data_batch(file, 0, &whole[..4096]))
        .await
        .unwrap();
    crate::fault::fail_io(point, source);
    let ack = sink
        .ingest_batch(
            Arc::from(source),
            2,
            data_batch(file, 4096, &whole[4096..8192]),
        )
        .await
        .expect("a journaled range is acknowledged before its file is flushed");
    assert_eq!(ack.placed, 4096);
    assert!(
        sink.status().unwrap().journal_backlog_bytes >= 4096,
        "the range was not journaled: the test proves nothing"
    );
    poisoned_reason(sink).await
}

/// A panic in the asynchronous part of the background flush of journaled
/// files (a bug there, not a disk's failure) poisons the sink with its
/// reason like a failed flush does, instead of being logged by the runtime
/// alone while the sink goes on and the flushed rounds' journal space is
/// never given back; after a restart nothing acknowledged is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_the_background_flush_poisons_the_sink() {
    const SOURCE: &str = "background-flush-panics";
    let dir = test_support::scratch("background-flush-panics");
    let sink = open_flushing_files(&dir);
    let source = || Arc::<str>::from(SOURCE);
    let whole = content(2 * 4096, 5);
    let reason = journal_a_range_then_poison(
        &sink,
        SOURCE,
        "p",
        &whole,
        crate::fault::Point::BackgroundFlush,
    )
    .await;
    assert!(
        reason.contains("background flush") && reason.contains("panicked"),
        "{reason}"
    );
    sink.shutdown().await;
    drop(sink);
    let sink = open_flushing_files(&dir);
    let file = dir.join("root").join(SOURCE).join("p");
    assert!(std::fs::read(&file).unwrap() == whole, "p differs");
    let again = sink
        .ingest_batch(source(), 2, data_batch("p", 4096, &whole[4096..]))
        .await
        .unwrap();
    assert_eq!((again.placed, again.duplicate), (0, 4096), "recorded once");
    sink.shutdown().await;
    drop(sink);
    assert_recorded_once(&dir, whole.len() as u64);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The fdatasync of a round's file fails: that batch is not acknowledged
/// (a retryable refusal naming the poison), the sink is poisoned with the
/// file and the error, `status` says so, every later batch and the
/// watermarks are refused, and after a restart what was acknowledged
/// before is still there and the re-sent batches complete the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fdatasync_poisons_the_sink_and_a_restart_loses_nothing() {
    const SOURCE: &str = "fsync-fails";
    let dir = test_support::scratch("fsync-fails");
    let sink = open_flushing_files(&dir);
    let source = || Arc::<str>::from(SOURCE);
    // Past --journal-max-range: flushed in place by its own round.
    let half = 128 << 10;
    let whole = content(2 * half, 1);
    let first = data_batch("a", 0, &whole[..half]);
    let ack = sink.ingest_batch(source(), 1, first).await.unwrap();
    assert_eq!(ack.placed, half as u64);

    crate::fault::fail_io(crate::fault::Point::FileSync, SOURCE);
    let second = data_batch("a", half as u64, &whole[half..]);
    let refused = sink.ingest_batch(source(), 2, second).await;
    let error = refused.expect_err("a batch whose flush failed was acknowledged");
    assert!(
        matches!(error, SinkError::Poisoned(_)),
        "a failed flush must poison the sink: {error:?}"
    );
    assert!(is_retryable(&error), "the watcher must send it again later");
    let reason = poisoned_reason(&sink).await;
    let file = dir.join("root").join(SOURCE).join("a");
    assert!(
        reason.contains("fdatasync of")
            && reason.contains(&file.display().to_string())
            && reason.contains("Input/output error"),
        "the reason names neither the flush, the file nor the error: {reason}"
    );
    assert_eq!(sink.status().unwrap().poisoned.as_deref(), Some(&*reason));
    let later = sink
        .ingest_batch(source(), 3, data_batch("b", 0, b"after the failure"))
        .await;
    assert!(matches!(later, Err(SinkError::Poisoned(_))), "{later:?}");
    assert!(matches!(
        sink.watermarks(SOURCE),
        Err(SinkError::Poisoned(_))
    ));
    assert!(!dir.join("root").join(SOURCE).join("b").exists());

    let sink = restart(sink, &dir).await;
    assert!(!sink.health().is_poisoned());
    // A watcher sends again everything not acknowledged, and may send
    // again what was (its checkpoint trails the acks).
    let again = sink
        .ingest_batch(source(), 1, data_batch("a", 0, &whole[..half]))
        .await
        .unwrap();
    assert_eq!((again.placed, again.duplicate), (0, half as u64));
    let again = sink
        .ingest_batch(source(), 2, data_batch("a", half as u64, &whole[half..]))
        .await
        .unwrap();
    assert_eq!(again.placed, half as u64);
    sink.ingest_batch(source(), 3, data_batch("b", 0, b"after the failure"))
        .await
        .unwrap();
    assert!(std::fs::read(&file).unwrap() == whole, "a differs");
    assert_eq!(
        std::fs::read(dir.join("root").join(SOURCE).join("b")).unwrap(),
        b"after the failure"
    );
    sink.shutdown().await;
    drop(sink);
    assert_recorded_once(&dir, whole.len() as u64 + 17);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A small range is acknowledged once it is durable in the journal; its
/// file is flushed later, in the background. That flush fails: the sink is
/// poisoned (naming the file), and the acknowledged range survives even
/// if the failed write-back lost it from the file: the restart writes it
/// back from the journal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_flush_of_journaled_files_loses_no_acknowledged_range() {
    const SOURCE: &str = "journaled-flush-fails";
    let dir = test_support::scratch("journaled-flush-fails");
    let sink = open_flushing_files(&dir);
    let source = || Arc::<str>::from(SOURCE);
    let whole = content(3 * 4096, 2);
    let reason =
        journal_a_range_then_poison(&sink, SOURCE, "j", &whole, crate::fault::Point::FileSync)
            .await;
    let file = dir.join("root").join(SOURCE).join("j");
    assert!(
        reason.contains("fdatasync of")
            && reason.contains(&file.display().to_string())
            && reason.contains("Input/output error"),
        "{reason}"
    );
    let later = sink
        .ingest_batch(source(), 3, data_batch("j", 8192, &whole[8192..]))
        .await;
    assert!(matches!(later, Err(SinkError::Poisoned(_))), "{later:?}");
    sink.shutdown().await;
    drop(sink);

    // The failed write-back may have lost the pages: only the journal
    // still holds the acknowledged range.
    {
        use std::os::unix::fs::FileExt;
        let written = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        written.write_all_at(&[0u8; 4096], 4096).unwrap();
    }
    let sink = open_flushing_files(&dir);
    assert!(
        std::fs::read(&file).unwrap()[..8192] == whole[..8192],
        "the restart did not write the journaled range back"
    );
    let again = sink
        .ingest_batch(source(), 2, data_batch("j", 4096, &whole[4096..8192]))
        .await
        .unwrap();
    assert_eq!((again.placed, again.duplicate), (0, 4096), "recorded once");
    sink.ingest_batch(source(), 3, data_batch("j", 8192, &whole[8192..]))
        .await
        .unwrap();
    assert!(std::fs::read(&file).unwrap() == whole, "j differs");
    sink.shutdown().await;
    drop(sink);
    assert_recorded_once(&dir, whole.len() as u64);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The journal's own fdatasync fails: the round's ranges are not
/// acknowledged, the sink is poisoned naming the journal file, and after a
/// restart the re-sent range is recorded once (whether the round's
/// unsynced records survived or not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_journal_fdatasync_poisons_the_sink_before_any_ack() {
    const SOURCE: &str = "journal-sync-fails";
    let dir = test_support::scratch("journal-sync-fails");
    let sink = open_flushing_files(&dir);
    let source = || Arc::<str>::from(SOURCE);
    let whole = content(2 * 4096, 3);
    sink.ingest_batch(source(), 1, data_batch("k", 0, &whole[..4096]))
        .await
        .unwrap();

    let journal = dir.join("state").join(JOURNAL_FILE_NAME);
    crate::fault::fail_io(
        crate::fault::Point::JournalSync,
        journal.display().to_string(),
    );
    let refused = sink
        .ingest_batch(source(), 2, data_batch("k", 4096, &whole[4096..]))
        .await;
    let error = refused.expect_err("a range whose journal round failed was acknowledged");
    assert!(matches!(error, SinkError::Poisoned(_)), "{error:?}");
    assert!(is_retryable(&error));
    let reason = poisoned_reason(&sink).await;
    assert!(
        reason.contains(&journal.display().to_string()) && reason.contains("Input/output error"),
        "{reason}"
    );
    assert_eq!(sink.status().unwrap().poisoned.as_deref(), Some(&*reason));

    let sink = restart(sink, &dir).await;
    let again = sink
        .ingest_batch(source(), 2, data_batch("k", 4096, &whole[4096..]))
        .await
        .unwrap();
    assert_eq!(again.placed + again.duplicate, 4096, "{again:?}");
    let file = dir.join("root").join(SOURCE).join("k");
    assert!(std::fs::read(&file).unwrap() == whole, "k differs");
    sink.shutdown().await;
    drop(sink);
    assert_recorded_once(&dir, whole.len() as u64);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A sink (flushing file by file) whose file `w` of `source` has its first
/// 4 KiB placed, with the 8 KiB the file will hold.
async fn sink_with_first_page(source: &str, salt: u8) -> (std::path::PathBuf, Sink, Vec<u8>) {
    let dir = test_support::scratch(source);
    let sink = open_flushing_files(&dir);
    let whole = content(2 * 4096, salt);
    sink.ingest_batch(Arc::from(source), 1, data_batch("w", 0, &whole[..4096]))
        .await
        .unwrap();
    (dir, sink, whole)
}

/// Sends `w`'s second 4 KiB, journaled (the file exists already).
async fn send_second_page(sink: &Sink, source: &str, whole: &[u8]) -> Result<Ack, SinkError> {
    sink.ingest_batch(Arc::from(source), 2, data_batch("w", 4096, &whole[4096..]))
        .await
}

/// Asserts that `w` holds `whole`, then stops the sink and asserts that
/// every byte is recorded once.
async fn assert_whole_and_recorded_once(
    sink: Sink,
    dir: &std::path::Path,
    source: &str,
    whole: &[u8],
) {
    let file = dir.join("root").join(source).join("w");
    assert!(std::fs::read(&file).unwrap() == whole, "w differs");
    sink.shutdown().await;
    drop(sink);
    assert_recorded_once(dir, whole.len() as u64);
    let _ = std::fs::remove_dir_all(dir);
}

/// A write that fails is only that batch's failure: refused as retryable
/// storage trouble, the sink stays healthy, and the same batch sent again
/// is placed, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_is_retried_without_poisoning_the_sink() {
    const SOURCE: &str = "write-fails";
    let (dir, sink, whole) = sink_with_first_page(SOURCE, 4).await;

    crate::fault::fail_io(crate::fault::Point::FileWrite, SOURCE);
    let refused = send_second_page(&sink, SOURCE, &whole).await;
    let error = refused.expect_err("a batch whose write failed was acknowledged");
    assert!(
        matches!(&error, SinkError::Storage(detail)
            if detail.contains("Input/output error") && detail.contains("write-fails/w")),
        "a failed write is this batch's storage error, naming the file: {error:?}"
    );
    assert!(is_retryable(&error));
    assert!(!sink.health().is_poisoned());
    assert!(sink.status().unwrap().poisoned.is_none());

    let ack = send_second_page(&sink, SOURCE, &whole).await.unwrap();
    assert_eq!(ack.placed, 4096);
    assert_whole_and_recorded_once(sink, &dir, SOURCE, &whole).await;
}

/// A small range's write made after its request was submitted (see
/// `place::beside`) that fails poisons the sink, as its round may have
/// recorded the range already; nothing is acknowledged, and once restarted
/// (the journal's replay puts the range back, if it was recorded) and sent
/// the batch again, the file is whole and every byte recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_write_beside_its_round_poisons_the_sink_and_a_restart_loses_nothing() {
    const SOURCE: &str = "beside-fails";
    let (dir, sink, whole) = sink_with_first_page(SOURCE, 5).await;

    crate::fault::fail_io(crate::fault::Point::DeferredWrite, SOURCE);
    let failed = send_second_page(&sink, SOURCE, &whole).await;
    let error = failed.expect_err("a batch whose write failed was acknowledged");
    assert!(
        matches!(&error, SinkError::Poisoned(reason)
            if reason.contains("Input/output error") && reason.contains("'w'")),
        "the sink stops, naming the file: {error:?}"
    );
    assert!(sink.health().is_poisoned());

    let sink = restart(sink, &dir).await;
    let ack = send_second_page(&sink, SOURCE, &whole).await.unwrap();
    assert_eq!(ack.placed + ack.duplicate, 4096);
    assert_whole_and_recorded_once(sink, &dir, SOURCE, &whole).await;
}
