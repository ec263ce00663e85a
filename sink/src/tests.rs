//! Tests of the sink as a whole: placement threads, failures that poison
//! it, shutdown, the commit feed and watermarks.

use super::*;
use flight_server::BatchBuilder;

mod io_faults;

/// Many batches arriving at once are all placed and acknowledged, never
/// more of them at once than the placement threads allow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placements_beyond_the_thread_limit_wait_their_turn() {
    let dir = test_support::scratch("placement-threads");
    std::fs::create_dir_all(dir.join("root")).unwrap();
    let sink = Sink::open(&SinkConfig {
        root: dir.join("root"),
        state_dir: dir.join("state"),
        placement_threads: Some(2),
        ..SinkConfig::default()
    })
    .unwrap();
    let content =
        |file: u64| -> Vec<u8> { (0..256 << 10).map(|i: u64| (i * 31 + file) as u8).collect() };
    let placing: Vec<_> = (1..=24u64)
        .map(|file| {
            let sink = sink.clone();
            let mut builder = BatchBuilder::with_capacity(1, 256 << 10);
            builder.push_data(&format!("f{file}.dat"), 1, 0, &content(file));
            let batch = RangeBatch::validate(builder.finish()).unwrap();
            tokio::spawn(async move { sink.ingest_batch(Arc::from("s"), file, batch).await })
        })
        .collect();
    for (file, placed) in (1..=24u64).zip(placing) {
        let ack = placed.await.unwrap().unwrap();
        assert_eq!(ack.seq, file);
    }
    for file in 1..=24u64 {
        let written = std::fs::read(dir.join(format!("root/s/f{file}.dat"))).unwrap();
        assert!(
            written == content(file),
            "file {file} differs from what was sent"
        );
    }
    let status = sink.status().unwrap();
    assert_eq!(status.placement_threads, 2);
    assert!(
        (1..=2).contains(&status.placements_running_peak),
        "{} placements ran at once",
        status.placements_running_peak
    );
    assert_eq!(status.placements_running, 0);
    assert_eq!(status.placements_waiting, 0);
    drop(sink);
    let _ = std::fs::remove_dir_all(&dir);
}

fn open_sink(dir: &std::path::Path) -> Sink {
    std::fs::create_dir_all(dir.join("root")).unwrap();
    Sink::open(&SinkConfig {
        root: dir.join("root"),
        state_dir: dir.join("state"),
        ..SinkConfig::default()
    })
    .unwrap()
}

fn data_batch(key: &str, offset: u64, bytes: &[u8]) -> RangeBatch {
    let mut builder = BatchBuilder::with_capacity(1, bytes.len());
    builder.push_data(key, 1, offset, bytes);
    RangeBatch::validate(builder.finish()).unwrap()
}

/// A range that ends at the largest offset a file can have, placed where
/// it lands (no hold budget) through the journal: the room taken ahead of
/// it would pass that offset. The sink answers the batch (placed, or the
/// filesystem's refusal) and stays healthy. (The wire refuses ranges that
/// end past it: one near `u64::MAX` once overflowed that room's end.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_at_the_largest_file_offset_is_answered_without_harm() {
    let dir = test_support::scratch("largest-offset");
    std::fs::create_dir_all(dir.join("root")).unwrap();
    let sink = Sink::open(&SinkConfig {
        root: dir.join("root"),
        state_dir: dir.join("state"),
        hold_limit: 0,
        ..SinkConfig::default()
    })
    .unwrap();
    let far = flight_server::wire::MAX_FILE_END - 87;
    let answer = sink
        .ingest_batch(Arc::from("far"), 1, data_batch("f", far, &[7u8; 87]))
        .await;
    assert!(
        !matches!(answer, Err(SinkError::Internal(_))),
        "not the sink's bug: {answer:?}"
    );
    assert!(sink.health().reason().is_none(), "{answer:?}");
    let next = sink
        .ingest_batch(Arc::from("far"), 2, data_batch("g", 0, b"after"))
        .await;
    assert!(next.is_ok(), "{next:?}");
    sink.shutdown().await;
    drop(sink);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Waits (bounded) until the sink reports itself poisoned.
async fn poisoned_reason(sink: &Sink) -> String {
    tokio::time::timeout(std::time::Duration::from_secs(30), sink.health().poisoned())
        .await
        .expect("the sink never reported the failure")
        .to_string()
}

/// A panic while placing is the sink's bug: reported as internal (never
/// as the peer's bad input), it poisons the sink (its slots may be half
/// updated), and a re-sent batch leaning on the ranges the panicked one
/// had claimed gets an answer instead of waiting for them forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_while_placing_poisons_the_sink_and_strands_no_batch() {
    let dir = test_support::scratch("placement-panic");
    let sink = open_sink(&dir);
    fault::arm(fault::Point::AfterPlacement, "panicky");
    let bytes = vec![42u8; 4096];
    let first = sink
        .ingest_batch(Arc::from("panicky"), 1, data_batch("f", 0, &bytes))
        .await;
    assert!(
        matches!(first, Err(SinkError::Internal(_))),
        "a panic must be an internal error: {first:?}"
    );
    assert!(poisoned_reason(&sink).await.contains("panicked"));
    assert!(sink.status().unwrap().poisoned.is_some());
    let again = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        sink.ingest_batch(Arc::from("panicky"), 2, data_batch("f", 0, &bytes)),
    )
    .await
    .expect("the re-sent batch waited forever for ranges a panicked batch had claimed");
    assert!(
        matches!(again, Err(SinkError::Poisoned(_))),
        "a poisoned sink refuses work until restarted: {again:?}"
    );
    sink.shutdown().await;
    drop(sink);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A committer thread that dies poisons the sink, visibly in `status`,
/// instead of leaving it healthy while nothing commits; shutdown still
/// joins everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_committer_poisons_the_sink() {
    let dir = test_support::scratch("committer-dies");
    let sink = open_sink(&dir);
    fault::arm(fault::Point::CommitterLoop, "doomed");
    let first = sink
        .ingest_batch(Arc::from("doomed"), 1, data_batch("f", 0, b"0123456789"))
        .await;
    assert!(first.is_err(), "nothing may be acknowledged: {first:?}");
    let reason = poisoned_reason(&sink).await;
    assert!(reason.contains("committer"), "{reason}");
    assert_eq!(
        sink.status().unwrap().poisoned.as_deref(),
        Some(reason.as_str())
    );
    let later = sink
        .ingest_batch(Arc::from("other"), 1, data_batch("g", 0, b"abc"))
        .await;
    assert!(matches!(later, Err(SinkError::Poisoned(_))), "{later:?}");
    sink.shutdown().await;
    drop(sink);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Shutdown finishes the rounds of what was queued: every batch
/// acknowledged before it is in the manifest after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_and_joins_the_committer() {
    let dir = test_support::scratch("shutdown-drains");
    let sink = open_sink(&dir);
    for seq in 0..8u64 {
        let ack = sink
            .ingest_batch(
                Arc::from("s"),
                seq,
                data_batch("f", seq * 10, b"0123456789"),
            )
            .await
            .unwrap();
        assert_eq!(ack.placed, 10);
    }
    sink.shutdown().await;
    let after = sink
        .ingest_batch(Arc::from("s"), 9, data_batch("f", 80, b"0123456789"))
        .await;
    assert!(after.is_err(), "a stopped committer takes no more work");
    drop(sink);
    let report = audit(&dir.join("state"), false).unwrap();
    assert_eq!(report.placed_bytes, 80);
    assert_eq!(report.overlapping_placements, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A rename waiting for its intent to be recorded holds up no other
/// source's commits (it once held the commit gate across a synced
/// manifest write and flushes, which every round needs), and the feed
/// tells of the rename once, after the file has moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rename_waiting_for_its_intent_holds_up_no_other_commit() {
    let dir = test_support::scratch("rename-intent");
    let sink = open_sink(&dir);
    let mut feed = sink.feed().subscribe().unwrap();
    sink.ingest_batch(Arc::from("movers"), 1, data_batch("a", 0, b"moved bytes"))
        .await
        .unwrap();
    let paused = fault::pause(fault::Point::MoveIntent, "movers");
    let mut builder = BatchBuilder::with_capacity(1, 0);
    builder.push_rename("a", 1, "b");
    let rename = RangeBatch::validate(builder.finish()).unwrap();
    let renaming = {
        let sink = sink.clone();
        tokio::spawn(async move { sink.ingest_batch(Arc::from("movers"), 2, rename).await })
    };
    let waiting = tokio::task::spawn_blocking(move || {
        paused.reached();
        paused
    });
    let paused = waiting.await.unwrap();
    let other = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        sink.ingest_batch(Arc::from("others"), 1, data_batch("c", 0, b"not held up")),
    )
    .await
    .expect("a rename on its way to its intent held up another source's commit");
    assert_eq!(other.unwrap().placed, 11);
    tokio::task::spawn_blocking(move || paused.release())
        .await
        .unwrap();
    renaming.await.unwrap().unwrap();
    assert_eq!(
        std::fs::read(dir.join("root/movers/b")).unwrap(),
        b"moved bytes"
    );
    assert!(!dir.join("root/movers/a").exists());
    sink.shutdown().await;
    let mut renames = Vec::new();
    while let Ok(round) = feed.try_recv() {
        for file in &round.files {
            for change in &file.changes {
                if let FileChange::Renamed { from } = change {
                    renames.push((from.clone(), file.path.clone()));
                }
            }
        }
    }
    assert_eq!(
        renames,
        [("movers/a".to_string(), "movers/b".to_string())],
        "the feed tells of the rename once, made"
    );
    drop(sink);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The commit feed's listener sees each durable byte exactly once: the
/// ranges it is told of per file never overlap and add up to what the
/// manifest holds, whatever order and however often batches arrive, and
/// each file is opened once, with a watermark that only grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_feed_tells_each_durable_range_once() {
    let dir = test_support::scratch("feed-once");
    let sink = open_sink(&dir);
    let mut feed = sink.feed().subscribe().unwrap();
    let content: Vec<u8> = (0..64 * 1024u32).map(|i| (i * 7) as u8).collect();
    // Pieces of two files, overlapping and repeated, out of order.
    let mut pieces = Vec::new();
    for (i, key) in ["a", "b"].iter().enumerate() {
        for start in (0..64u64).rev().step_by(3) {
            let end = (start + 1 + (start + i as u64) % 5).min(64);
            pieces.push((*key, start * 1024, end * 1024));
        }
        pieces.push((*key, 0, 64 * 1024));
    }
    let placing: Vec<_> = pieces
        .iter()
        .enumerate()
        .map(|(seq, &(key, start, end))| {
            let sink = sink.clone();
            let batch = data_batch(key, start, &content[start as usize..end as usize]);
            tokio::spawn(async move { sink.ingest_batch(Arc::from("s"), seq as u64, batch).await })
        })
        .collect();
    for placed in placing {
        placed.await.unwrap().unwrap();
    }
    sink.shutdown().await;
    let mut told: std::collections::HashMap<String, manifest_db::IntervalSet> = Default::default();
    let mut opened: std::collections::HashMap<String, usize> = Default::default();
    let mut watermark: std::collections::HashMap<String, u64> = Default::default();
    let mut last_sequence = 0;
    while let Ok(round) = feed.try_recv() {
        assert_eq!(round.sequence, last_sequence + 1, "no round is missed");
        last_sequence = round.sequence;
        for file in &round.files {
            let key = file.id.key.clone();
            let set = told.entry(key.clone()).or_default();
            for &(start, end) in &file.ranges {
                assert_eq!(
                    set.missing(start, end),
                    vec![(start, end)],
                    "{key}: {start}..{end} told twice"
                );
                set.insert(start, end);
            }
            *opened.entry(key.clone()).or_default() += file
                .changes
                .iter()
                .filter(|c| **c == FileChange::Opened)
                .count();
            let mark = watermark.entry(key.clone()).or_default();
            assert!(
                file.contiguous_end >= *mark,
                "{key}: the watermark went back"
            );
            *mark = file.contiguous_end;
            assert_eq!(file.path, format!("s/{key}"));
        }
    }
    for key in ["a", "b"] {
        assert_eq!(
            told[key].ranges(),
            [(0, 64 * 1024)],
            "{key}: every byte told"
        );
        assert_eq!(opened[key], 1, "{key} opened once");
        assert_eq!(watermark[key], 64 * 1024);
    }
    drop(sink);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A recorded file whose head cannot be read is left out of the
/// watermarks (the watcher sends it again, and the manifest recognises
/// it), instead of being vouched for with a checksum of 0, a value a
/// real CRC takes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watermarks_leave_out_files_whose_head_cannot_be_read() {
    let dir = test_support::scratch("watermarks-unreadable");
    let sink = open_sink(&dir);
    for key in ["kept", "lost"] {
        sink.ingest_batch(Arc::from("s"), 1, data_batch(key, 0, b"head bytes"))
            .await
            .unwrap();
    }
    std::fs::remove_file(dir.join("root/s/lost")).unwrap();
    let marks = sink.watermarks("s").unwrap();
    let keys: Vec<&str> = marks.iter().map(|m| m.key.as_str()).collect();
    assert_eq!(keys, ["kept"]);
    assert_eq!(
        marks[0].head_crc32c,
        flight_server::checksum::crc32c(b"head bytes")
    );
    sink.shutdown().await;
    drop(sink);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The rows a subscription stream carries: (kind, path, from_path), data
/// rows left out, until `until` of them came.
async fn subscription_rows(
    stream: &mut futures::stream::BoxStream<'static, Result<arrow_flight::FlightData, SinkError>>,
    until: usize,
) -> Vec<(String, String, Option<String>)> {
    use arrow_array::Array;
    use arrow_array::cast::AsArray;
    use futures::StreamExt;
    let mut rows = Vec::new();
    while rows.len() < until {
        let message = tokio::time::timeout(std::time::Duration::from_secs(30), stream.next())
            .await
            .expect("a deadlock guard: the subscription sent nothing more")
            .expect("the stream goes on")
            .expect("no error");
        // Every batch carries its cursor update; the schema message does not.
        if message.app_metadata.is_empty() {
            continue;
        }
        let batch = arrow_flight::utils::flight_data_to_arrow_batch(
            &message,
            flight_server::subscription::consumer_schema(),
            &Default::default(),
        )
        .expect("a consumer batch");
        let kind = batch.column_by_name("kind").unwrap().as_string::<i32>();
        let path = batch.column_by_name("path").unwrap().as_string::<i32>();
        let from = batch
            .column_by_name("from_path")
            .unwrap()
            .as_string::<i32>();
        for i in 0..batch.num_rows() {
            if kind.value(i) == "data" {
                continue;
            }
            rows.push((
                kind.value(i).to_string(),
                path.value(i).to_string(),
                from.is_valid(i).then(|| from.value(i).to_string()),
            ));
        }
    }
    rows
}

/// A file sealed under a name the globs do not match, and renamed to one
/// they match afterwards, reaches a subscriber whole: opened, its bytes,
/// and its seal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_renamed_into_the_globs_after_its_seal_is_sealed_for_a_subscriber() {
    let dir = test_support::scratch("subscribe-seal-then-rename");
    let sink = open_sink(&dir);
    let ticket = flight_server::subscription::Ticket::decode(
        br#"{"source":"s","globs":["s/*.xtc2"],"follow":true}"#,
    )
    .unwrap();
    // The source must be known before it can be subscribed to.
    sink.ingest_batch(Arc::from("s"), 1, data_batch("other.dat", 0, b"x"))
        .await
        .unwrap();
    let mut stream = sink.subscribe(ticket, "test".into()).await.unwrap();
    let content = b"a whole run";
    let digest = {
        let mut hasher = flight_server::SealDigest::Crc64Nvme.hasher();
        hasher.update(content);
        hasher.finish()
    };
    sink.ingest_batch(
        Arc::from("s"),
        2,
        data_batch("r.xtc2.inprogress", 0, content),
    )
    .await
    .unwrap();
    // A seal is sent once its bytes are acknowledged, as a watcher does.
    let mut builder = BatchBuilder::with_capacity(1, 64);
    builder.push_seal("r.xtc2.inprogress", 1, content.len() as u64, &digest);
    let ack = sink
        .ingest_batch(
            Arc::from("s"),
            3,
            RangeBatch::validate(builder.finish()).unwrap(),
        )
        .await
        .unwrap();
    assert!(ack.rejected.is_empty(), "{ack:?}");
    let mut builder = BatchBuilder::with_capacity(1, 64);
    builder.push_rename("r.xtc2.inprogress", 1, "r.xtc2");
    sink.ingest_batch(
        Arc::from("s"),
        4,
        RangeBatch::validate(builder.finish()).unwrap(),
    )
    .await
    .unwrap();
    let rows = subscription_rows(&mut stream, 2).await;
    assert_eq!(
        rows,
        vec![
            ("opened".into(), "r.xtc2".into(), None),
            ("sealed".into(), "r.xtc2".into(), None),
        ]
    );
    drop(stream);
    drop(sink);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `mv b c; mv a b` in one batch reaches a subscriber in that order, so a
/// consumer applying the renames one by one never puts a's file over b's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renames_reach_a_subscriber_in_the_order_they_were_made() {
    let dir = test_support::scratch("subscribe-rename-order");
    let sink = open_sink(&dir);
    sink.ingest_batch(Arc::from("s"), 1, data_batch("a", 0, b"file a"))
        .await
        .unwrap();
    sink.ingest_batch(Arc::from("s"), 2, data_batch("b", 0, b"file b"))
        .await
        .unwrap();
    let ticket =
        flight_server::subscription::Ticket::decode(br#"{"source":"s","follow":true}"#).unwrap();
    let mut stream = sink.subscribe(ticket, "test".into()).await.unwrap();
    let opened = subscription_rows(&mut stream, 2).await;
    assert_eq!(opened.len(), 2, "{opened:?}");
    let mut builder = BatchBuilder::with_capacity(2, 64);
    builder.push_rename("b", 1, "c");
    builder.push_rename("a", 1, "b");
    sink.ingest_batch(
        Arc::from("s"),
        3,
        RangeBatch::validate(builder.finish()).unwrap(),
    )
    .await
    .unwrap();
    let renamed = subscription_rows(&mut stream, 2).await;
    assert_eq!(
        renamed,
        vec![
            ("renamed".into(), "c".into(), Some("b".into())),
            ("renamed".into(), "b".into(), Some("a".into())),
        ]
    );
    drop(stream);
    drop(sink);
    let _ = std::fs::remove_dir_all(&dir);
}
