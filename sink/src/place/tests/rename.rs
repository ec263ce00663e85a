//! Renames, runs of renames and recorded moves.

use super::*;
use crate::place::rename::paths_overlap;

/// Every file under a fixture's root, with its bytes.
fn tree(fixture: &Fixture) -> std::collections::BTreeMap<String, Vec<u8>> {
    fn walk(dir: &Path, prefix: &str, out: &mut std::collections::BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
            if entry.file_type().unwrap().is_dir() {
                walk(&entry.path(), &format!("{name}/"), out);
            } else {
                out.insert(name, std::fs::read(entry.path()).unwrap());
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    walk(&fixture.dir.join("root"), "", &mut out);
    out
}

/// A writer rotating its chunks renames many files in one batch. A run
/// of Rename rows that name no path twice has its plain renames made
/// together, with one manifest write, at the run's place in the batch;
/// one over a live file waits for its row, and so do those after it.
/// Every file ends up where placing the rows one by one puts it, also
/// when the batch comes again.
#[test]
fn a_run_of_renames_is_made_together() {
    enum Step {
        Data(&'static str),
        Rename(&'static str, &'static str),
    }
    use Step::{Data, Rename};
    let steps = [
        Data("x"),
        Rename("a.tmp", "a"),
        Rename("b.tmp", "b"),
        Data("z"),
        Rename("d.tmp", "d"),
        Rename("e.tmp", "e"),
        Rename("c.tmp", "c"),
        Rename("f.tmp", "f"),
    ];
    let batch_of = |steps: &[Step]| {
        let mut builder = BatchBuilder::with_capacity(steps.len(), 256);
        for step in steps {
            match step {
                Data(key) => builder.push_data(key, 1, 0, format!("bytes of {key}").as_bytes()),
                Rename(key, to) => builder.push_rename(key, 1, to),
            }
        }
        RangeBatch::validate(builder.finish()).unwrap()
    };
    let start = |name: &str| {
        let fixture = Fixture::new(name);
        let placer = fixture.placer();
        let source = placer.source("s").unwrap();
        let setup = ["a.tmp", "b.tmp", "c.tmp", "d.tmp", "e.tmp", "f.tmp", "c"].map(Data);
        let (request, ack) = placer.place(&source, 1, &batch_of(&setup)).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        record_placed(&request);
        (fixture, placer, source)
    };

    // One row per batch: the order the batch's rows ask for.
    let (one_by_one, placer, source) = start("renames-one-by-one");
    for (seq, step) in steps.iter().enumerate() {
        let batch = batch_of(std::slice::from_ref(step));
        let (_, ack) = placer.place(&source, seq as u64 + 2, &batch).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    }
    let expected = tree(&one_by_one);
    assert_eq!(
        expected["s/c"], b"bytes of c.tmp",
        "the live c was superseded"
    );
    assert_eq!(expected["s/e"], b"bytes of e.tmp");
    assert!(!expected.contains_key("s/a.tmp"));

    // The whole batch at once.
    let (together, placer, source) = start("renames-together");
    let (request, ack) = placer.place(&source, 2, &batch_of(&steps)).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    assert_eq!(tree(&together), expected);
    // Each moved file waits for its directories to be flushed before any
    // round may write its record: this batch's, or another's first.
    let to_flush: std::collections::HashSet<usize> = request
        .dirs_to_sync
        .iter()
        .map(|dir| Arc::as_ptr(dir) as usize)
        .collect();
    let mut moved = 0;
    for slot in &request.touched {
        let state = lock(&slot.state);
        if state.record.renamed_from.is_none() && slot.id.key.ends_with(".tmp") {
            moved += 1;
            let unsynced = lock(&slot.unsynced);
            assert!(
                !unsynced.is_empty(),
                "{} waits for its directories",
                slot.id.key
            );
            for pending in unsynced.iter() {
                assert!(matches!(pending.target, SyncTarget::Dir(_)));
                assert!(to_flush.contains(&pending.target.address()));
            }
        }
    }
    assert_eq!(moved, 6);

    // The runs alone, then the batch again (as a re-delivery would).
    let (runs, placer, source) = start("renames-runs");
    let batch = batch_of(&steps);
    let mut work = BatchWork::new(0);
    for first in [1, 4] {
        if let Err(e) = placer.rename_run_at(&source, &batch, first, &mut work) {
            panic!("{}", e.into_message());
        }
    }
    let moved = tree(&runs);
    for (key, to) in [
        ("a.tmp", "s/a"),
        ("b.tmp", "s/b"),
        ("d.tmp", "s/d"),
        ("e.tmp", "s/e"),
    ] {
        assert!(
            moved.contains_key(to) && !moved.contains_key(&format!("s/{key}")),
            "{key} moved"
        );
        let id = FileId {
            source: "s".into(),
            key: key.into(),
            generation: 1,
        };
        // Its intent was durable before it moved.
        let recorded = placer.manifest.get(&id).unwrap().unwrap();
        assert_eq!(recorded.dest_path, to);
        assert_eq!(recorded.renamed_from, Some(format!("s/{key}")));
    }
    assert_eq!(
        moved["s/c"], b"bytes of c",
        "the rename over a live file waits for its row"
    );
    assert!(
        moved.contains_key("s/f.tmp"),
        "and so does every rename after it in the run"
    );
    assert!(!moved.contains_key("s/x"), "no other row ran");
    assert_eq!(work.request.touched.len(), 4);
    let (_, ack) = placer.place(&source, 2, &batch).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    assert_eq!(tree(&runs), expected);
}

/// A batch that moved a file and then failed never reaches a round, and
/// its request held the directories to fsync: the file keeps them, and
/// the next round that records it (any batch's) flushes them first.
#[test]
fn a_failed_batchs_move_is_flushed_by_the_next_round_recording_the_file() {
    let fixture = Fixture::new("failed-move");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let place = |seq, build: &dyn Fn(&mut BatchBuilder)| {
        let mut builder = BatchBuilder::with_capacity(2, 64);
        build(&mut builder);
        placer.place(
            &source,
            seq,
            &RangeBatch::validate(builder.finish()).unwrap(),
        )
    };
    let (request, _) = place(1, &|b| b.push_data("a.tmp", 1, 0, b"first")).unwrap();
    record_placed(&request);
    let failed = place(2, &|b| {
        b.push_rename("a.tmp", 1, "a");
        b.push_data("never-opened", 5, 0, b"refused");
    });
    assert!(matches!(failed, Err(SinkError::Peer(_))));
    assert!(
        fixture.dest("s/a").exists(),
        "moved before the batch failed"
    );

    let (request, _) = place(3, &|b| b.push_data("a.tmp", 1, 5, b" more")).unwrap();
    assert!(request.dirs_to_sync.is_empty(), "this batch moved nothing");
    let round = [crate::commit::Queued {
        request,
        queued: std::time::Instant::now(),
        reply: tokio::sync::oneshot::channel().0,
    }];
    let slot = round[0].request.touched[0].clone();
    let waiting: Vec<usize> = lock(&slot.unsynced)
        .iter()
        .map(|pending| pending.target.address())
        .collect();
    assert!(!waiting.is_empty());
    let (targets, _) = crate::commit::sync_targets(&round);
    let targets: std::collections::HashSet<usize> =
        targets.iter().map(SyncTarget::address).collect();
    assert!(
        waiting.iter().all(|w| targets.contains(w)),
        "the round flushes the move"
    );

    // A later change queued meanwhile, through the same directory handle
    // (one request opens a directory once): it waits for a flush of its
    // own, though the round flushed that very handle.
    let open_dir = || {
        rustix::fs::open(
            fixture.dest("s"),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap()
    };
    let mut other = CommitRequest::default();
    other.flush_before_record(&mut lock(&slot.unsynced), None, [open_dir()]);
    let (_, tokens) = crate::commit::sync_targets(&round);
    other.flush_before_record(&mut lock(&slot.unsynced), None, [open_dir()]);
    assert_eq!(other.dirs_to_sync.len(), 1, "one handle for the directory");
    crate::commit::forget_flushed(&round, &tokens);
    let left: Vec<usize> = lock(&slot.unsynced)
        .iter()
        .map(|pending| pending.target.address())
        .collect();
    assert_eq!(left, [Arc::as_ptr(&other.dirs_to_sync[0]) as usize]);
}

/// A rename whose new name cannot be made (a file where its directory
/// should be) is refused: its intent is taken back, durably, and the
/// file goes on under its old name.
#[test]
fn a_rename_that_cannot_be_made_leaves_the_file_at_its_name() {
    let fixture = Fixture::new("rename-refused");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let first = rows(|b| b.push_data("a.tmp", 1, 0, b"first"));
    let (request, _) = placer.place(&source, 1, &first).unwrap();
    record_placed(&request);
    std::fs::write(fixture.dest("s/blocker"), b"a file, not a directory").unwrap();
    let id = FileId {
        source: "s".into(),
        key: "a.tmp".into(),
        generation: 1,
    };

    for (seq, to) in [(2, "blocker/a"), (3, "blocker")] {
        if to == "blocker" {
            std::fs::remove_file(fixture.dest("s/blocker")).unwrap();
            std::fs::create_dir_all(fixture.dest("s/blocker/inside")).unwrap();
        }
        let more = rows(|b| {
            b.push_rename("a.tmp", 1, to);
            b.push_data("a.tmp", 1, 5, b" more");
        });
        let (request, ack) = placer.place(&source, seq, &more).unwrap();
        assert_eq!(ack.rejected.len(), 1, "{:?}", ack.rejected);
        assert_eq!(ack.rejected[0].row, 0);
        assert!(!ack.rejected[0].superseded);
        assert!(
            ack.rejected[0].error.contains("cannot rename"),
            "{}",
            ack.rejected[0].error
        );
        record_placed(&request);
        assert_eq!(
            std::fs::read(fixture.dest("s/a.tmp")).unwrap(),
            b"first more"
        );
        let recorded = placer.manifest.get(&id).unwrap().unwrap();
        assert_eq!(recorded.dest_path, "s/a.tmp");
        assert_eq!(recorded.renamed_from, None);
        let slot = placer.lookup(&source, &mut lock(&source.files), "a.tmp", 1);
        let slot = slot.ok().flatten().unwrap();
        assert_eq!(lock(&slot.state).record.dest_path, "s/a.tmp");
    }
}

/// The intent of a rename over a live file records that file as
/// superseded too: a crash before the round must not leave two live
/// records naming one path.
#[test]
fn a_rename_over_a_live_file_records_it_superseded_with_the_intent() {
    let fixture = Fixture::new("rename-over-live");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let setup = rows(|b| {
        b.push_data("a.tmp", 1, 0, b"new");
        b.push_data("a", 1, 0, b"old");
    });
    let (request, _) = placer.place(&source, 1, &setup).unwrap();
    record_placed(&request);

    let rename = rows(|b| b.push_rename("a.tmp", 1, "a"));
    let (_, ack) = placer.place(&source, 2, &rename).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    assert_eq!(std::fs::read(fixture.dest("s/a")).unwrap(), b"new");
    // Only the intent has reached the manifest: no round ran.
    let record = |key: &str| {
        let id = FileId {
            source: "s".into(),
            key: key.into(),
            generation: 1,
        };
        placer.manifest.get(&id).unwrap()
    };
    let renamed = record("a.tmp").expect("the intent is recorded");
    assert_eq!(renamed.dest_path, "s/a");
    let superseded = record("a").expect("recorded with the intent");
    assert!(superseded.superseded);
}

/// A rotation (a.1 to a.2, then a to a.1) cut short by a crash after
/// both moves and before the round that records them: both intents
/// are in the manifest, and each file is already at its new name. The
/// start finishes each move by the file's inode, so the later file now
/// at a.1 is not taken for the earlier one and moved over it.
#[test]
fn a_rotation_cut_short_by_a_crash_keeps_both_files() {
    let fixture = Fixture::new("rotation-crash");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let setup = rows(|b| {
        b.push_data("a.1", 1, 0, b"first");
        b.push_data("a", 1, 0, b"second");
    });
    place_and_record(&placer, &source, 1, &setup);
    let rotate = rows(|b| {
        b.push_rename("a.1", 1, "a.2");
        b.push_rename("a", 1, "a.1");
    });
    let (_, ack) = placer.place(&source, 2, &rotate).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    // The move out of a.1 was made durable before the intent to move
    // into it was recorded; the later move waits for its round.
    let unsynced = |key: &str| {
        let files = lock(&source.files);
        let slot = files.slots.get(&(key.to_owned(), 1)).unwrap();
        lock(&slot.unsynced).len()
    };
    assert_eq!(unsynced("a.1"), 0);
    assert_ne!(unsynced("a"), 0);
    // The crash: no round ran, the intents stay in the manifest.
    drop((source, placer));

    let restarted = fixture.placer();
    let source = restarted.source("s").unwrap();
    let more = rows(|b| {
        b.push_data("a.1", 1, 5, b"+1");
        b.push_data("a", 1, 6, b"+2");
    });
    let (_, ack) = restarted.place(&source, 3, &more).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    assert_eq!(std::fs::read(fixture.dest("s/a.2")).unwrap(), b"first+1");
    assert_eq!(std::fs::read(fixture.dest("s/a.1")).unwrap(), b"second+2");
    assert!(!fixture.dest("s/a").exists());
}

/// Leaves the manifest as an earlier process that crashed would: the
/// file `s/<name>` holding `bytes`, the intent to move it to `to`
/// recorded (under the key `moved-<name>`), and `others` beside it.
fn recorded_move(
    fixture: &Fixture,
    (name, bytes): (&str, &[u8]),
    to: &str,
    mut others: Vec<(FileId, FileRecord)>,
) {
    use std::os::unix::fs::MetadataExt;
    let from = format!("s/{name}");
    std::fs::create_dir_all(fixture.dest("s")).unwrap();
    std::fs::write(fixture.dest(&from), bytes).unwrap();
    let inode = std::fs::metadata(fixture.dest(&from)).unwrap().ino();
    let mut intent = record(&from, bytes.len() as u64);
    intent.begin_move(to.into(), inode);
    others.push((file_of_s(&format!("moved-{name}")), intent));
    let placer = fixture.placer();
    placer
        .manifest
        .commit(&SinkCommit {
            records: others,
            ..SinkCommit::default()
        })
        .unwrap();
}

/// An earlier process recorded a.1's move to a.2 and did not make it;
/// a rename of a to a.1 now makes that move first, instead of putting
/// its file over the one still at a.1.
#[test]
fn a_rename_into_a_path_an_earlier_run_meant_to_leave_moves_that_file_first() {
    let fixture = Fixture::new("rename-after-intent");
    std::fs::create_dir_all(fixture.dest("s")).unwrap();
    std::fs::write(fixture.dest("s/a"), b"second").unwrap();
    let live = (file_of_s("a"), record("s/a", 6));
    recorded_move(&fixture, ("a.1", b"first"), "s/a.2", vec![live]);

    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let rename = rows(|b| b.push_rename("a", 1, "a.1"));
    let (_, ack) = placer.place(&source, 1, &rename).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    assert_eq!(std::fs::read(fixture.dest("s/a.2")).unwrap(), b"first");
    assert_eq!(std::fs::read(fixture.dest("s/a.1")).unwrap(), b"second");
    assert!(!fixture.dest("s/a").exists());
}

/// A new file at a path an earlier process recorded a move away from,
/// and did not make: that move is made first, and the new file gets a
/// file of its own.
#[test]
fn a_new_file_where_a_recorded_move_starts_waits_for_that_move() {
    let fixture = Fixture::new("create-after-intent");
    recorded_move(&fixture, ("a", b"first"), "s/a.1", Vec::new());

    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let new = rows(|b| b.push_data("a", 1, 0, b"second"));
    let (_, ack) = placer.place(&source, 1, &new).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    assert_eq!(std::fs::read(fixture.dest("s/a.1")).unwrap(), b"first");
    assert_eq!(std::fs::read(fixture.dest("s/a")).unwrap(), b"second");
}

/// The same move in a run of renames, after a rename away from its
/// target made by this process: that move is made durable first.
#[test]
fn a_run_of_renames_waits_for_moves_away_from_its_targets() {
    let fixture = Fixture::new("run-after-move");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let setup = rows(|b| {
        b.push_data("a.1", 1, 0, b"first");
        b.push_data("a", 1, 0, b"second");
        b.push_data("b", 1, 0, b"third");
    });
    place_and_record(&placer, &source, 1, &setup);
    let unsynced = |key: &str| {
        let files = lock(&source.files);
        let slot = files.slots.get(&(key.to_owned(), 1)).unwrap();
        lock(&slot.unsynced).len()
    };
    let away = rows(|b| b.push_rename("a.1", 1, "a.2"));
    placer.place(&source, 2, &away).unwrap();
    assert_ne!(unsynced("a.1"), 0);
    let run = rows(|b| {
        b.push_rename("a", 1, "a.1");
        b.push_rename("b", 1, "b.1");
    });
    let (_, ack) = placer.place(&source, 3, &run).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    assert_eq!(unsynced("a.1"), 0);
    assert_eq!(std::fs::read(fixture.dest("s/a.2")).unwrap(), b"first");
    assert_eq!(std::fs::read(fixture.dest("s/a.1")).unwrap(), b"second");
    assert_eq!(std::fs::read(fixture.dest("s/b.1")).unwrap(), b"third");
}

/// A rename of a file removed from the sink behind its back changes
/// nothing and says why.
#[test]
fn a_rename_of_a_file_the_sink_lost_is_refused() {
    let fixture = Fixture::new("rename-lost");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let setup = rows(|b| {
        b.push_data("a.tmp", 1, 0, b"first");
        b.push_data("a", 1, 0, b"live");
    });
    place_and_record(&placer, &source, 1, &setup);
    std::fs::remove_file(fixture.dest("s/a.tmp")).unwrap();
    let rename = rows(|b| b.push_rename("a.tmp", 1, "a"));
    let (_, ack) = placer.place(&source, 2, &rename).unwrap();
    assert_eq!(ack.rejected.len(), 1, "{:?}", ack.rejected);
    assert!(
        ack.rejected[0].error.contains("holds no file"),
        "{}",
        ack.rejected[0].error
    );
    let slot = placer.lookup(&source, &mut lock(&source.files), "a.tmp", 1);
    let slot = slot.ok().flatten().unwrap();
    assert_eq!(lock(&slot.state).record.dest_path, "s/a.tmp");
    assert_eq!(lock(&slot.state).record.renamed_from, None);
    // The live file at the name it asked for is left alone.
    assert_eq!(std::fs::read(fixture.dest("s/a")).unwrap(), b"live");
    let live = placer.lookup(&source, &mut lock(&source.files), "a", 1);
    assert!(!lock(&live.ok().flatten().unwrap().state).record.superseded);
}

/// An intent recorded without its inode (by an earlier build) whose move
/// was made, and whose old directory is gone since: the file is found
/// at its new name, and its ranges stay recorded.
#[test]
fn an_older_intent_whose_old_directory_is_gone_finds_its_file_moved() {
    let fixture = Fixture::new("old-intent");
    std::fs::create_dir_all(fixture.dest("src/new")).unwrap();
    std::fs::write(fixture.dest("src/new/x"), b"moved").unwrap();
    let placer = fixture.placer();
    let mut moved = record("src/new/x", 5);
    moved.renamed_from = Some("src/gone/x".into());
    placer
        .manifest
        .commit(&SinkCommit {
            records: vec![(id("gone/x", 1), moved)],
            ..SinkCommit::default()
        })
        .unwrap();
    drop(placer);

    let placer = fixture.placer();
    let source = placer.source("src").unwrap();
    let more = rows(|b| b.push_data("gone/x", 1, 5, b"+more"));
    let (request, ack) = placer.place(&source, 1, &more).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    assert_eq!(ack.placed, 5);
    record_placed(&request);
    assert_eq!(
        std::fs::read(fixture.dest("src/new/x")).unwrap(),
        b"moved+more"
    );
    let slot = placer.lookup(&source, &mut lock(&source.files), "gone/x", 1);
    let slot = slot.ok().flatten().unwrap();
    let state = lock(&slot.state);
    assert_eq!(state.record.renamed_from, None);
    assert!(state.record.placed.covers(0, 10));
}

/// Runs that name a path twice, or one inside another, keep their order.
#[test]
fn overlapping_paths_are_told_apart() {
    let paths = |list: &[&str]| list.iter().map(|p| p.to_string()).collect::<Vec<_>>();
    assert!(!paths_overlap(&paths(&[
        "s/a", "s/a.tmp", "s/a-b", "s/ab/c"
    ])));
    assert!(paths_overlap(&paths(&["s/a", "s/b", "s/a"])));
    assert!(paths_overlap(&paths(&["s/a-b", "s/a/c", "s/a"])));
    assert!(paths_overlap(&paths(&["s/d/e/f", "s/d"])));
}

/// Renaming a file only needs its directory fsynced: the small ranges
/// of the same batch still go to the journal rather than flushing every
/// file they touch. A file a batch creates is flushed itself, not just
/// its directory entry.
#[test]
fn a_rename_leaves_the_batchs_small_ranges_journaled() {
    let fixture = Fixture::new("rename-journaled");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let mut builder = BatchBuilder::with_capacity(2, 64);
    builder.push_data("a.tmp", 1, 0, b"first");
    builder.push_data("b", 1, 0, b"first");
    let (request, _) = placer
        .place(&source, 1, &RangeBatch::validate(builder.finish()).unwrap())
        .unwrap();
    let flushed: std::collections::HashSet<_> =
        request.files_to_sync.iter().map(Arc::as_ptr).collect();
    assert_eq!(flushed.len(), 2, "new files are flushed");
    assert!(request.journal.is_empty());
    record_placed(&request);

    let mut builder = BatchBuilder::with_capacity(3, 64);
    builder.push_data("a.tmp", 1, 5, b" more");
    builder.push_rename("a.tmp", 1, "a");
    builder.push_data("b", 1, 5, b" more");
    let batch = RangeBatch::validate(builder.finish()).unwrap();
    let (request, ack) = placer.place(&source, 2, &batch).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    assert!(!request.dirs_to_sync.is_empty(), "the rename's directory");
    assert!(request.files_to_sync.is_empty(), "no file flushed");
    assert!(!request.flushes_anyway());
    assert_eq!(request.journal.len(), 2, "both small ranges journaled");
    assert_eq!(std::fs::read(fixture.dest("s/a")).unwrap(), b"first more");
    assert_eq!(std::fs::read(fixture.dest("s/b")).unwrap(), b"first more");
}

/// A run of renames whose intents cannot be recorded (the sink stopping,
/// a full state directory) moves nothing, then or later: the records go
/// back to naming the files where they are. Left saying "recorded, not yet
/// moved", the next delivery of the run made the moves behind a manifest
/// that never heard of them, and after a restart the journal's replay
/// recreated the old names and the renamed files were replaced by those
/// copies (a rolling restart of a fleet's sinks lost the head of two files).
#[test]
fn a_run_whose_intents_cannot_be_recorded_moves_nothing_later() {
    let fixture = Fixture::new("run-intent-fails");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    place_and_record(
        &placer,
        &source,
        1,
        &rows(|b| {
            b.push_data("a.tmp", 1, 0, b"bytes of a");
            b.push_data("b.tmp", 1, 0, b"bytes of b");
        }),
    );
    placer.health.poison("the manifest cannot be written");
    let run = rows(|b| {
        b.push_rename("a.tmp", 1, "a");
        b.push_rename("b.tmp", 1, "b");
    });
    assert!(placer.place(&source, 2, &run).is_err());
    for key in ["a.tmp", "b.tmp"] {
        let slot = lock(&source.files).slots[&(key.to_string(), 1)].clone();
        let state = lock(&slot.state);
        assert_eq!(state.record.dest_path, format!("s/{key}"));
        assert!(state.record.renamed_from.is_none(), "{key}");
        assert!(!state.moving, "{key}");
    }
    let _ = placer.place(&source, 3, &run);
    let files = tree(&fixture);
    assert!(
        files.contains_key("s/a.tmp") && files.contains_key("s/b.tmp"),
        "{files:?}"
    );
    assert!(
        !files.contains_key("s/a") && !files.contains_key("s/b"),
        "{files:?}"
    );
}
