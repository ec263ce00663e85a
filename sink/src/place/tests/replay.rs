//! The journal's replay at startup.

use super::*;

/// A journal file damaged after a crash: a range its file already holds
/// is fine, one it does not is refused (unless its round may have been
/// cut short, see below), naming the file and offset.
#[test]
fn replay_checks_journal_bytes_against_their_crc() {
    let fixture = Fixture::new("replay-damaged");
    let placer = fixture.placer();
    std::fs::create_dir_all(fixture.dest("src")).unwrap();
    std::fs::write(fixture.dest("src/kept.dat"), b"headtail").unwrap();
    std::fs::write(fixture.dest("src/later.dat"), b"head").unwrap();
    let commit = |name: &str, end, round, bytes: &[u8]| {
        placer
            .manifest
            .commit(&SinkCommit {
                records: vec![(id(name, 1), record(&format!("src/{name}"), end))],
                journal: vec![(id(name, 1), end - 4, in_journal(bytes))],
                journal_round: round,
                ..SinkCommit::default()
            })
            .unwrap()
    };
    commit("kept.dat", 8, 1, b"tail");
    std::fs::write(fixture.journal_file(), b"headXXXXgone").unwrap();
    assert_eq!(placer.replay_journal(&fixture.journal_file()).unwrap(), 0);
    assert!(placer.manifest.journal().unwrap().is_empty());

    commit("lost.dat", 8, 1, b"tail");
    commit("later.dat", 4, 2, b"head");
    let err = placer
        .replay_journal(&fixture.journal_file())
        .unwrap_err()
        .to_string();
    assert!(err.contains("offset 4 of src/lost.dat"), "{err}");
    assert!(err.contains("journal.ring"), "{err}");
    assert_eq!(placer.manifest.journal().unwrap().len(), 2);
}

/// A crash while the newest round's bytes were being journaled, after its
/// records were written: ranges whose bytes are neither in the journal
/// nor in their file are withdrawn (never acknowledged), from the record,
/// the audit and the placed counter; ranges found in either stay.
#[test]
fn replay_withdraws_the_ranges_of_a_round_cut_short() {
    let fixture = Fixture::new("replay-torn");
    let placer = fixture.placer();
    std::fs::create_dir_all(fixture.dest("src")).unwrap();
    std::fs::write(fixture.dest("src/torn.dat"), b"head").unwrap();
    std::fs::write(fixture.dest("src/cached.dat"), b"headtail").unwrap();
    let (torn, cached) = (id("torn.dat", 1), id("cached.dat", 1));
    // One round per commit, each putting `bytes` at `end - 4` of both files.
    let commit = |end, round, bytes: &[u8]| {
        let files = [&torn, &cached];
        placer
            .manifest
            .commit(&SinkCommit {
                records: files
                    .map(|f| (f.clone(), record(&format!("src/{}", f.key), end)))
                    .into(),
                placements: files.map(|f| (f.clone(), end - 4, 4)).into(),
                counters: manifest_db::SinkCounters {
                    placed_bytes: 8,
                    ..Default::default()
                },
                journal: files
                    .map(|f| (f.clone(), end - 4, in_journal(bytes)))
                    .into(),
                journal_round: round,
                ..SinkCommit::default()
            })
            .unwrap()
    };
    commit(4, 1, b"head");
    // The newest round: records written, journal bytes never were.
    commit(8, 2, b"tail");
    std::fs::write(fixture.journal_file(), b"head\0\0\0\0").unwrap();

    assert_eq!(placer.replay_journal(&fixture.journal_file()).unwrap(), 8);
    let manifest = &placer.manifest;
    let placed = |file: &FileId| manifest.get(file).unwrap().unwrap().placed;
    assert_eq!(placed(&torn), IntervalSet::from_ranges([(0, 4)]));
    assert_eq!(manifest.placements(&torn).unwrap(), [(0, 4)]);
    assert_eq!(placed(&cached), IntervalSet::from_ranges([(0, 8)]));
    assert_eq!(manifest.placements(&cached).unwrap(), [(0, 4), (4, 4)]);
    assert_eq!(manifest.counters().unwrap().placed_bytes, 12);
    assert!(manifest.journal().unwrap().is_empty());
    assert_eq!(
        std::fs::read(fixture.dest("src/torn.dat")).unwrap(),
        b"head"
    );
}

/// A seal placed while the round in doubt was recording rides in its
/// record. It came from a later batch, never acknowledged either: the
/// replay withdraws the range and the seal with it instead of refusing
/// to start.
#[test]
fn replay_unseals_a_file_sealed_behind_a_round_cut_short() {
    let fixture = Fixture::new("replay-sealed");
    let placer = fixture.placer();
    std::fs::create_dir_all(fixture.dest("src")).unwrap();
    std::fs::write(fixture.dest("src/late.dat"), b"head").unwrap();
    let late = id("late.dat", 1);
    let mut sealed = record("src/late.dat", 8);
    sealed.sealed = Some(Sealed {
        size: 8,
        digest: "crc64nvme:0000000000000000".into(),
    });
    let rounds = [
        (1, record("src/late.dat", 4), 0, &b"head"[..]),
        (2, sealed, 4, &b"tail"[..]),
    ];
    for (round, record, offset, bytes) in rounds {
        placer
            .manifest
            .commit(&SinkCommit {
                records: vec![(late.clone(), record)],
                journal: vec![(late.clone(), offset, in_journal(bytes))],
                journal_round: round,
                ..SinkCommit::default()
            })
            .unwrap();
    }
    std::fs::write(fixture.journal_file(), b"head\0\0\0\0").unwrap();

    assert_eq!(placer.replay_journal(&fixture.journal_file()).unwrap(), 4);
    let after = placer.manifest.get(&late).unwrap().unwrap();
    assert_eq!(after.placed, IntervalSet::from_ranges([(0, 4)]));
    assert_eq!(after.sealed, None);
}

/// The newest round is in doubt only until a later commit says its bytes
/// were durable; then, and for bytes that cannot be read at all, a bad
/// journal is damage: refused, never withdrawn.
#[test]
fn replay_refuses_damage_to_a_round_known_complete() {
    let fixture = Fixture::new("replay-complete");
    let placer = fixture.placer();
    std::fs::create_dir_all(fixture.dest("src")).unwrap();
    std::fs::write(fixture.dest("src/acked.dat"), b"head").unwrap();
    let acked = id("acked.dat", 1);
    let commit = |journal_round, journal_complete| {
        placer
            .manifest
            .commit(&SinkCommit {
                records: vec![(acked.clone(), record("src/acked.dat", 8))],
                journal: vec![(acked.clone(), 4, in_journal(b"tail"))],
                journal_round,
                journal_complete,
                ..SinkCommit::default()
            })
            .unwrap()
    };
    // A round, then a commit made after its journal write had ended.
    commit(1, 0);
    placer
        .manifest
        .commit(&SinkCommit {
            journal_complete: 1,
            ..SinkCommit::default()
        })
        .unwrap();
    std::fs::write(fixture.journal_file(), b"headXXXX").unwrap();
    let err = placer
        .replay_journal(&fixture.journal_file())
        .unwrap_err()
        .to_string();
    assert!(err.contains("offset 4 of src/acked.dat"), "{err}");

    // In doubt, but the journal file ends before the range: damage too.
    placer.manifest.clear_journal().unwrap();
    commit(1, 0);
    std::fs::write(fixture.journal_file(), b"head").unwrap();
    let err = placer
        .replay_journal(&fixture.journal_file())
        .unwrap_err()
        .to_string();
    assert!(err.contains("no bytes"), "{err}");
    let placed = placer.manifest.get(&acked).unwrap().unwrap().placed;
    assert_eq!(placed, IntervalSet::from_ranges([(0, 8)]));
}

/// A flat manifest from before a flat sink served one source, with
/// acknowledged ranges of two sources in its journal: the start writes
/// both back, and then serves the first source in the manifest only,
/// whichever connects first.
#[test]
fn a_flat_replay_writes_back_a_refused_sources_ranges() {
    let fixture = Fixture::new("flat-replay");
    let placer = fixture.placer_with(Layout::Flat, SupersededPolicy::Mirror, 0);
    let of = |source: &str, key: &str| FileId {
        source: source.into(),
        key: key.into(),
        generation: 1,
    };
    placer
        .manifest
        .commit(&SinkCommit {
            records: vec![
                (of("alpha", "a.dat"), record("a.dat", 4)),
                (of("beta", "b.dat"), record("b.dat", 4)),
            ],
            journal: vec![
                (
                    of("alpha", "a.dat"),
                    0,
                    JournalBytes::Inline(b"AAAA".to_vec()),
                ),
                (
                    of("beta", "b.dat"),
                    0,
                    JournalBytes::Inline(b"BBBB".to_vec()),
                ),
            ],
            ..SinkCommit::default()
        })
        .unwrap();

    assert_eq!(placer.replay_journal(&fixture.journal_file()).unwrap(), 8);
    assert_eq!(std::fs::read(fixture.dest("a.dat")).unwrap(), b"AAAA");
    assert_eq!(std::fs::read(fixture.dest("b.dat")).unwrap(), b"BBBB");
    assert!(matches!(placer.source("beta"), Err(SinkError::Peer(_))));
    placer.source("alpha").unwrap();
    // The same source wins when the other one asks first.
    drop(placer);
    let restarted = fixture.placer_with(Layout::Flat, SupersededPolicy::Mirror, 0);
    assert!(matches!(restarted.source("beta"), Err(SinkError::Peer(_))));
    restarted.source("alpha").unwrap();
}

/// A machine crash after the ack: the bytes are in the journal, the
/// destination lost them (or the whole file) with the page cache.
#[test]
fn replay_writes_journaled_ranges_back_and_empties_the_journal() {
    let fixture = Fixture::new("replay");
    let placer = fixture.placer();
    let mut old = record("src/old.dat", 4);
    old.superseded = true;
    // Superseded under `--superseded keep`: its file stays, aside.
    let mut aside = record("src/run/aside.dat.gen1", 4);
    aside.superseded = true;
    aside.kept = true;
    let mut moved = record("src/run/new-name.dat", 6);
    moved.renamed_from = Some("src/run/old-name.dat".into());
    std::fs::create_dir_all(fixture.dest("src/run")).unwrap();
    std::fs::write(fixture.dest("src/run/old-name.dat"), b"\0\0\0\0\0\0").unwrap();
    placer
        .manifest
        .commit(&SinkCommit {
            records: vec![
                (id("lost.dat", 1), record("src/lost.dat", 8)),
                (id("old.dat", 1), old),
                (id("run/old-name.dat", 1), moved),
                (id("run/aside.dat", 1), aside),
            ],
            journal: vec![
                (id("lost.dat", 1), 0, in_journal(b"head")),
                (id("lost.dat", 1), 4, in_journal(b"tail")),
                (id("old.dat", 1), 0, in_journal(b"gone")),
                // As sinks before the journal file kept them.
                (
                    id("run/old-name.dat", 1),
                    0,
                    JournalBytes::Inline(b"moved!".to_vec()),
                ),
                (
                    id("run/aside.dat", 1),
                    0,
                    JournalBytes::Inline(b"kept".to_vec()),
                ),
            ],
            ..SinkCommit::default()
        })
        .unwrap();
    std::fs::write(fixture.journal_file(), b"headtailgone").unwrap();

    assert_eq!(placer.replay_journal(&fixture.journal_file()).unwrap(), 18);
    assert_eq!(
        std::fs::read(fixture.dest("src/lost.dat")).unwrap(),
        b"headtail"
    );
    // The rename recorded before the crash is finished first, then written into.
    assert_eq!(
        std::fs::read(fixture.dest("src/run/new-name.dat")).unwrap(),
        b"moved!"
    );
    assert!(!fixture.dest("src/run/old-name.dat").exists());
    // A removed superseded generation is not brought back; one kept
    // aside gets its bytes.
    assert!(!fixture.dest("src/old.dat").exists());
    assert_eq!(
        std::fs::read(fixture.dest("src/run/aside.dat.gen1")).unwrap(),
        b"kept"
    );
    let manifest = &placer.manifest;
    assert!(manifest.journal().unwrap().is_empty());
    // Made, but no event told of it yet: the record keeps the path last
    // told, so that the first round that records the file tells the move,
    // in this run or after another crash.
    let moved = manifest.get(&id("run/old-name.dat", 1)).unwrap().unwrap();
    assert_eq!(moved.dest_path, "src/run/new-name.dat");
    assert_eq!(moved.renamed_from, None);
    assert_eq!(moved.untold_from.as_deref(), Some("src/run/old-name.dat"));

    // Replaying again (a crash during the first replay) changes nothing.
    drop(placer);
    let again = fixture.placer();
    assert_eq!(again.replay_journal(&fixture.journal_file()).unwrap(), 0);
    assert_eq!(
        std::fs::read(fixture.dest("src/lost.dat")).unwrap(),
        b"headtail"
    );
}
