//! Writing in order: a destination file never grows past a hole, whatever
//! order its ranges arrive in, and what arrives ahead waits in bounded
//! memory.

use super::*;

/// Distinct non-zero bytes, so a hole (zeros) never passes for content.
fn content(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251 + 1) as u8).collect()
}

fn data_batch(key: &str, offset: u64, bytes: &[u8]) -> RangeBatch {
    let mut builder = BatchBuilder::with_capacity(1, bytes.len() + 64);
    builder.push_data(key, 1, offset, bytes);
    RangeBatch::validate(builder.finish()).unwrap()
}

/// Whatever lies below the file's size is the source's bytes.
fn assert_no_hole(path: &std::path::Path, source: &[u8], what: &str) {
    let on_disk = std::fs::read(path).unwrap_or_default();
    assert!(
        on_disk.len() <= source.len(),
        "{what}: the file is longer than the source"
    );
    if let Some(at) = on_disk.iter().zip(source).position(|(a, b)| a != b) {
        panic!(
            "{what}: byte {at} of {} reads {} where the source has {}",
            on_disk.len(),
            on_disk[at],
            source[at]
        );
    }
}

/// Five ranges of one file (journaled, with a direct middle, tiny, at the
/// journal's limit, large) in all 120 orders, one batch each, each batch
/// recorded as its round would: after every batch the file holds only the
/// source's bytes below its size, and in the end all of them, with nothing
/// left held.
#[test]
fn ranges_in_every_order_leave_no_hole_below_the_size() {
    let fixture = Fixture::new("order");
    let placer = fixture.placer().with_direct_writes(4096);
    let source = placer.source("s").unwrap();
    let cuts = [
        0u64,
        3_000,
        3_000 + (1 << 20) + 777,
        3_100 + (1 << 20) + 777,
    ];
    let mut bounds = cuts.to_vec();
    bounds.push(bounds[3] + (64 << 10));
    bounds.push(bounds[4] + (200 << 10));
    let ranges: Vec<(u64, u64)> = bounds.windows(2).map(|w| (w[0], w[1])).collect();
    let total = *bounds.last().unwrap();
    let bytes = content(total as usize);
    let mut orders = vec![Vec::new()];
    for _ in 0..ranges.len() {
        orders = orders
            .into_iter()
            .flat_map(|order: Vec<usize>| {
                (0..ranges.len())
                    .filter(|i| !order.contains(i))
                    .map(|i| {
                        let mut next = order.clone();
                        next.push(i);
                        next
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
    }
    assert_eq!(orders.len(), 120);
    for (n, order) in orders.iter().enumerate() {
        let key = format!("f{n}.dat");
        let path = fixture.dest(&format!("s/{key}"));
        for (seq, &i) in order.iter().enumerate() {
            let (start, end) = ranges[i];
            let batch = data_batch(&key, start, &bytes[start as usize..end as usize]);
            let (request, ack) = placer.place(&source, seq as u64, &batch).unwrap();
            assert_eq!(
                ack.placed,
                end - start,
                "order {order:?}: every byte is taken"
            );
            record_placed(&request);
            assert_no_hole(&path, &bytes, &format!("order {order:?} after range {i}"));
        }
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "order {order:?}");
        assert_eq!(placer.held_bytes(), 0, "order {order:?}: nothing left held");
    }
}

/// A batch ahead of the file's end waits for the bytes before it: its ack
/// depends on them, and the batch that fills the gap writes and records it.
#[test]
fn a_range_ahead_of_the_file_is_written_and_recorded_by_the_batch_filling_the_gap() {
    let fixture = Fixture::new("held");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let bytes = content(300);
    place_and_record(&placer, &source, 1, &data_batch("a", 0, &bytes[..100]));
    let (ahead, ack) = placer
        .place(&source, 2, &data_batch("a", 200, &bytes[200..]))
        .unwrap();
    assert_eq!(ack.placed, 100);
    assert!(ahead.placed.is_empty(), "nothing written yet");
    assert_eq!(ahead.dependencies.len(), 1, "its ack waits for the range");
    assert_eq!(placer.held_bytes(), 100);
    assert_eq!(std::fs::read(fixture.dest("s/a")).unwrap(), &bytes[..100]);
    let (filler, _) = placer
        .place(&source, 3, &data_batch("a", 100, &bytes[100..200]))
        .unwrap();
    assert_eq!(
        filler.placed[0].1,
        [(100, 200), (200, 300)],
        "the filler records what it drained"
    );
    let journaled: Vec<(u64, u32)> = filler
        .journal
        .iter()
        .map(|range| (range.offset, range.crc32c))
        .collect();
    assert_eq!(
        journaled,
        [
            (100, checksum::crc32c(&bytes[100..200])),
            (200, checksum::crc32c(&bytes[200..]))
        ],
        "both journaled with their CRC: the row's, and the drained range's computed"
    );
    assert_eq!(placer.held_bytes(), 0);
    assert_eq!(std::fs::read(fixture.dest("s/a")).unwrap(), bytes);
}

/// Holding is bounded for the whole sink: past the limit a batch is
/// refused as retryable and leaves nothing behind, while the batch that
/// fills the gap is never held and gets through.
#[test]
fn holding_past_the_limit_refuses_the_batch_and_leaves_nothing_held() {
    let fixture = Fixture::new("hold-limit");
    let placer = fixture.placer().with_hold_limit(150);
    let source = placer.source("s").unwrap();
    let bytes = content(400);
    place_and_record(&placer, &source, 1, &data_batch("a", 0, &bytes[..100]));
    let (first, _) = placer
        .place(&source, 2, &data_batch("a", 200, &bytes[200..300]))
        .unwrap();
    record_placed(&first);
    let refused = placer.place(&source, 3, &data_batch("a", 300, &bytes[300..]));
    match refused {
        Err(SinkError::Storage(reason)) => assert!(reason.contains("ahead"), "{reason}"),
        other => panic!(
            "expected a retryable refusal, got {:?}",
            other.map(|(_, a)| a)
        ),
    }
    assert_eq!(placer.held_bytes(), 100, "the refused batch holds nothing");
    place_and_record(&placer, &source, 4, &data_batch("a", 100, &bytes[100..200]));
    place_and_record(&placer, &source, 5, &data_batch("a", 300, &bytes[300..]));
    assert_eq!(placer.held_bytes(), 0);
    assert_eq!(std::fs::read(fixture.dest("s/a")).unwrap(), bytes);
}

/// Makes every range held now look as if it had waited past the hold wait.
fn age_holds(placer: &Placer) {
    let aged = std::time::Instant::now()
        .checked_sub(crate::commit::HOLD_WAIT + std::time::Duration::from_secs(1))
        .expect("a clock older than the hold wait");
    for slot in placer.holds.holders() {
        for held in lock(&slot.state).held.values_mut() {
            held.since = aged;
        }
    }
}

/// A range held for bytes that never come (its peer went away, or never
/// meant to send them) gives its room back once it has waited past the
/// hold wait: abandoned holds do not refuse every other stream's ranges
/// for as long as the sink runs.
#[test]
fn ranges_held_for_a_gap_nobody_fills_give_their_room_back() {
    let fixture = Fixture::new("hold-abandoned");
    let placer = fixture.placer().with_hold_limit(150);
    let source = placer.source("s").unwrap();
    let bytes = content(400);
    let (abandoned, _) = placer
        .place(&source, 1, &data_batch("gone", 100, &bytes[..100]))
        .unwrap();
    record_placed(&abandoned);
    place_and_record(&placer, &source, 2, &data_batch("b", 0, &bytes[..100]));
    let ahead = data_batch("b", 200, &bytes[200..300]);
    assert!(
        matches!(placer.place(&source, 3, &ahead), Err(SinkError::Storage(_))),
        "a fresh hold keeps its room"
    );
    age_holds(&placer);
    let (held, _) = placer.place(&source, 4, &ahead).unwrap();
    record_placed(&held);
    assert_eq!(
        placer.held_bytes(),
        100,
        "the abandoned range gave its room"
    );
    place_and_record(&placer, &source, 5, &data_batch("b", 100, &bytes[100..200]));
    assert_eq!(placer.held_bytes(), 0);
    assert_eq!(std::fs::read(fixture.dest("s/b")).unwrap(), &bytes[..300]);
    assert!(
        std::fs::read(fixture.dest("s/gone"))
            .unwrap_or_default()
            .is_empty(),
        "the abandoned range was never written"
    );
}

/// A batch that fails after holding a range takes it back: a re-sent copy
/// is not stuck behind bytes nobody will write.
#[test]
fn a_failed_batch_takes_back_what_it_held() {
    let fixture = Fixture::new("held-failed");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let bytes = content(300);
    place_and_record(&placer, &source, 1, &data_batch("a", 0, &bytes[..100]));
    let mut builder = BatchBuilder::with_capacity(2, 256);
    builder.push_data("a", 1, 200, &bytes[200..]);
    builder.push_rename("a", 1, "../outside");
    let failing = RangeBatch::validate(builder.finish()).unwrap();
    assert!(placer.place(&source, 2, &failing).is_err());
    assert_eq!(placer.held_bytes(), 0);
    place_and_record(&placer, &source, 3, &data_batch("a", 100, &bytes[100..200]));
    assert_eq!(
        std::fs::read(fixture.dest("s/a")).unwrap(),
        &bytes[..200],
        "the failed batch's range is not written"
    );
    place_and_record(&placer, &source, 4, &data_batch("a", 200, &bytes[200..]));
    assert_eq!(std::fs::read(fixture.dest("s/a")).unwrap(), bytes);
}

/// Ranges sent twice, two files' ranges interleaved in one batch and
/// reversed, and a restart half way (what was held is lost with the
/// process, and sent again): after every step no file shows a hole below
/// its size, and in the end both are whole.
#[test]
fn duplicated_interleaved_and_restarted_ranges_leave_no_hole() {
    let fixture = Fixture::new("order-mixed");
    let bytes = content(40_000);
    let pieces: Vec<(u64, u64)> = (0..10).map(|i| (i * 4_000, (i + 1) * 4_000)).collect();
    let check = |what: &str| {
        for key in ["x", "y"] {
            assert_no_hole(&fixture.dest(&format!("s/{key}")), &bytes, what);
        }
    };
    let batch_of = |rows: &[(&str, (u64, u64))]| {
        let mut builder = BatchBuilder::with_capacity(rows.len(), 40_000);
        for (key, (start, end)) in rows {
            builder.push_data(key, 1, *start, &bytes[*start as usize..*end as usize]);
        }
        RangeBatch::validate(builder.finish()).unwrap()
    };
    // Both files exist before the rest arrives in reverse, interleaved,
    // every batch twice.
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    place_and_record(
        &placer,
        &source,
        0,
        &batch_of(&[("x", pieces[0]), ("y", pieces[0])]),
    );
    let mut seq = 1;
    for i in (5..10).rev() {
        let batch = batch_of(&[("y", pieces[i]), ("x", pieces[i]), ("x", pieces[10 - i])]);
        for _ in 0..2 {
            place_and_record(&placer, &source, seq, &batch);
            seq += 1;
            check(&format!("batch {seq}"));
        }
    }
    // The sink stops: what it held goes with it, and nothing of it was
    // recorded (the manifest of these tests is never written).
    drop(source);
    drop(placer);
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    check("after the restart");
    for i in (1..10).rev() {
        let batch = batch_of(&[("x", pieces[i]), ("y", pieces[i])]);
        place_and_record(&placer, &source, seq, &batch);
        seq += 1;
        check(&format!("batch {seq}, after the restart"));
    }
    for key in ["x", "y"] {
        assert_eq!(
            std::fs::read(fixture.dest(&format!("s/{key}"))).unwrap(),
            bytes
        );
    }
    assert_eq!(placer.held_bytes(), 0);
}

/// With the hold budget full, a batch whose other rows fill gaps still
/// writes them before it is refused: two batches that each fill the
/// other's gap get through on their next attempts instead of being refused
/// for good.
#[test]
fn a_refused_batch_still_moves_the_files_it_fills_on() {
    let fixture = Fixture::new("hold-progress");
    let placer = fixture.placer().with_hold_limit(100);
    let source = placer.source("s").unwrap();
    let bytes = content(300);
    for (seq, key) in ["f", "g", "h"].iter().enumerate() {
        place_and_record(
            &placer,
            &source,
            seq as u64,
            &data_batch(key, 0, &bytes[..100]),
        );
    }
    // The budget is full with another file's range.
    let (holding, _) = placer
        .place(&source, 3, &data_batch("h", 200, &bytes[200..]))
        .unwrap();
    record_placed(&holding);
    let crossed = |seq: u64, ahead: &str, fills: &str| {
        let mut builder = BatchBuilder::with_capacity(2, 256);
        builder.push_data(ahead, 1, 200, &bytes[200..]);
        builder.push_data(fills, 1, 100, &bytes[100..200]);
        let batch = RangeBatch::validate(builder.finish()).unwrap();
        placer
            .place(&source, seq, &batch)
            .map(|(request, _)| request)
    };
    assert!(crossed(4, "g", "f").is_err(), "g's range cannot be held");
    let request = crossed(5, "f", "g").expect("f reaches 200 now, g is filled");
    record_placed(&request);
    let request = crossed(6, "g", "f").expect("sent again, it goes through");
    record_placed(&request);
    for key in ["f", "g"] {
        assert_eq!(
            std::fs::read(fixture.dest(&format!("s/{key}"))).unwrap(),
            bytes
        );
    }
    assert_eq!(placer.held_bytes(), 100, "only h's range is held");
}

/// A generation replaced while it holds ranges ahead of its file's end:
/// under `keep` it goes aside with only the bytes it had in order, and what
/// it held is let go (never written: its source moved on), once it is
/// aside; the new generation starts from nothing held.
#[test]
fn a_generation_superseded_while_holding_goes_aside_without_a_hole() {
    let fixture = Fixture::new("held-superseded");
    let placer = fixture.placer_with(Layout::PerSource, SupersededPolicy::Keep, 64 << 10);
    let source = placer.source("s").unwrap();
    let old = content(300);
    place_and_record(&placer, &source, 1, &data_batch("a", 0, &old[..100]));
    let (held, _) = placer
        .place(&source, 2, &data_batch("a", 200, &old[200..]))
        .unwrap();
    assert_eq!(placer.held_bytes(), 100);
    let mut builder = BatchBuilder::with_capacity(2, 256);
    builder.push_open("a", 2, "a");
    builder.push_data("a", 2, 0, b"new");
    let (request, ack) = placer
        .place(&source, 3, &RangeBatch::validate(builder.finish()).unwrap())
        .unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    record_placed(&request);
    assert_eq!(
        placer.held_bytes(),
        0,
        "the superseded generation still holds"
    );
    let slot = &held.dependencies[0].slot;
    let state = lock(&slot.state);
    assert!(state.record.superseded && state.held.is_empty());
    drop(state);
    assert_eq!(
        std::fs::read(fixture.dest("s/a.gen1")).unwrap(),
        &old[..100]
    );
    assert_eq!(std::fs::read(fixture.dest("s/a")).unwrap(), b"new");
}
