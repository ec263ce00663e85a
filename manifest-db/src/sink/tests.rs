use super::*;
use crate::testutil::TempDir;
use crate::{Error, IntervalSet, OutboxEvent, Sealed};

fn id(source: &str, key: &str, generation: u64) -> FileId {
    FileId {
        source: source.to_owned(),
        key: key.to_owned(),
        generation,
    }
}

#[test]
fn outbox_events_are_appended_with_their_commit_read_in_order_and_removed() {
    let dir = TempDir::new("outbox");
    let m = SinkManifest::open(dir.path()).unwrap();
    let event = |n: u8| OutboxEvent {
        journal_round: 7,
        recorded_unix_ms: 1000 + u64::from(n),
        key: vec![n],
        payload: vec![n; usize::from(n)],
    };
    for batch in [vec![event(1), event(2)], vec![event(3)]] {
        m.commit(&SinkCommit {
            records: vec![(id("s", "a", 1), record("s/a", &[(0, 1)]))],
            outbox: batch,
            ..SinkCommit::default()
        })
        .unwrap();
    }
    assert_eq!(m.outbox_last().unwrap(), 3);
    let all = m.outbox_after(0, 10, usize::MAX).unwrap();
    assert_eq!(
        all.iter().map(|(seq, _)| *seq).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(all[1].1, event(2));
    assert_eq!(m.outbox_after(1, 1, usize::MAX).unwrap()[0].0, 2);
    assert_eq!(
        m.outbox_remove(0, 2, None, false).unwrap(),
        20 + 1 + 1 + 20 + 1 + 2
    );
    assert_eq!(m.outbox_mark().unwrap(), None);
    // A mark alone (nothing more published) is kept, and replaced.
    assert_eq!(m.outbox_remove(2, 2, Some(b"first"), true).unwrap(), 0);
    assert_eq!(m.outbox_mark().unwrap().as_deref(), Some(&b"first"[..]));
    assert_eq!(m.outbox_remove(2, 2, Some(b"second"), false).unwrap(), 0);
    assert_eq!(m.outbox_mark().unwrap().as_deref(), Some(&b"second"[..]));
    let depth = m.outbox_depth().unwrap();
    assert_eq!((depth.events, depth.oldest_unix_ms), (1, Some(1003)));
    // Sequence numbers are never reused.
    m.commit(&SinkCommit {
        outbox_rewrite: vec![(3, None)],
        outbox: vec![event(4)],
        ..SinkCommit::default()
    })
    .unwrap();
    let left = m.outbox_after(0, 10, usize::MAX).unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].0, 4);
    let id_first = m.manifest_id().unwrap();
    assert_eq!(m.manifest_id().unwrap(), id_first);
}

fn record(dest: &str, ranges: &[(u64, u64)]) -> FileRecord {
    FileRecord {
        dest_path: dest.to_owned(),
        placed: IntervalSet::from_ranges(ranges.iter().copied()),
        sealed: None,
        superseded: false,
        kept: false,
        renamed_from: None,
        renamed_inode: None,
        untold_from: None,
        committed_unix_ms: None,
    }
}

#[test]
fn is_send_sync_clone() {
    fn check<T: Send + Sync + Clone>() {}
    check::<SinkManifest>();
}

#[test]
fn key_encoding_round_trips_and_orders() {
    let ids = [
        id("s", "a", 2),
        id("s", "a", 10),
        id("s", "a/b", 0),
        id("s", "ab", 1),
        id("s2", "", 0),
        id("", "x", u64::MAX),
    ];
    for i in &ids {
        assert_eq!(decode_file_key(&file_key(i)).as_ref(), Some(i));
    }
    let mut by_bytes = ids.to_vec();
    by_bytes.sort_by_key(file_key);
    let mut by_fields = ids.to_vec();
    by_fields.sort();
    assert_eq!(by_bytes, by_fields);
    assert_eq!(decode_file_key(b"short"), None);
    assert_eq!(decode_file_key(b"nonul\x01\0\0\0\0\0\0\0\0"), None);
}

#[test]
fn reopen_returns_same_state() {
    let dir = TempDir::new("sink-reopen");
    let a1 = id("det", "run1/a.xtc2", 1);
    let a2 = id("det", "run1/a.xtc2", 2);
    let b1 = id("det", "run1/b.xtc2", 1);
    let other = id("other", "run1/a.xtc2", 1);
    let mut sealed = record("run1/a.xtc2", &[(0, 100)]);
    sealed.sealed = Some(Sealed {
        size: 100,
        digest: format!("blake3:{}", "ab".repeat(32)),
    });
    sealed.superseded = true;
    {
        let m = SinkManifest::open(dir.path()).unwrap();
        assert_eq!(m.first_source().unwrap(), None);
        m.commit(&SinkCommit {
            journal: Vec::new(),
            journal_round: 0,
            journal_start: 0,
            withdrawn: Vec::new(),
            outbox: Vec::new(),
            outbox_rewrite: Vec::new(),
            journal_complete: 0,
            records: vec![
                (a2.clone(), record("run1/a.xtc2", &[(0, 10)])),
                (a1.clone(), sealed.clone()),
                (b1.clone(), record("run1/b.xtc2", &[(0, 5), (8, 9)])),
                (other.clone(), record("x", &[])),
            ],
            placements: vec![
                (a1.clone(), 50, 50),
                (a1.clone(), 0, 50),
                (a2.clone(), 0, 10),
            ],
            counters: SinkCounters {
                placed_bytes: 110,
                duplicate_bytes: 0,
                rewritten_bytes: 3,
            },
        })
        .unwrap();
    }
    let m = SinkManifest::open(dir.path()).unwrap();
    assert_eq!(m.get(&a1).unwrap(), Some(sealed.clone()));
    assert_eq!(m.get(&id("det", "run1/a.xtc2", 3)).unwrap(), None);
    let gens = m.generations("det", "run1/a.xtc2").unwrap();
    assert_eq!(
        gens,
        vec![(1, sealed.clone()), (2, record("run1/a.xtc2", &[(0, 10)]))]
    );
    assert!(m.generations("det", "run1/a").unwrap().is_empty());
    let of_source: Vec<FileId> = m
        .files_of_source("det")
        .unwrap()
        .into_iter()
        .map(|(i, _)| i)
        .collect();
    assert_eq!(of_source, vec![a1.clone(), a2.clone(), b1.clone()]);
    assert!(m.files_of_source("de").unwrap().is_empty());
    assert_eq!(m.all_files().unwrap().len(), 4);
    assert_eq!(m.first_source().unwrap().as_deref(), Some("det"));
    assert_eq!(m.placements(&a1).unwrap(), vec![(0, 50), (50, 50)]);
    assert_eq!(m.placements(&a2).unwrap(), vec![(0, 10)]);
    assert!(m.placements(&b1).unwrap().is_empty());
    assert_eq!(
        m.counters().unwrap(),
        SinkCounters {
            placed_bytes: 110,
            duplicate_bytes: 0,
            rewritten_bytes: 3
        }
    );
}

/// Records and counters are overwritten in their memtable entry when the
/// new value fits: shorter, equal and longer values all read back as
/// last written, from memory and after reopening (the log replayed).
#[test]
fn records_rewritten_in_place_read_back_as_last_written() {
    let dir = TempDir::new("sink-inplace");
    let f = id("src", "k", 1);
    let shapes: [&[(u64, u64)]; 5] = [
        &[(0, 10), (20, 30), (40, 50)],
        &[(0, 1_000_000)],
        &[(0, 5)],
        &[(0, 5), (9, 12)],
        &[(0, 123_456_789), (200_000_000, 200_000_001)],
    ];
    let commit = |m: &SinkManifest, ranges: &[(u64, u64)], placed: u64| {
        m.commit(&SinkCommit {
            records: vec![(f.clone(), record("k", ranges))],
            counters: SinkCounters {
                placed_bytes: placed,
                ..SinkCounters::default()
            },
            ..SinkCommit::default()
        })
        .unwrap();
    };
    {
        let m = SinkManifest::open(dir.path()).unwrap();
        for (i, ranges) in shapes.iter().enumerate() {
            commit(&m, ranges, 1 << (8 * i));
            assert_eq!(m.get(&f).unwrap(), Some(record("k", ranges)), "{i}");
        }
        assert_eq!(m.files_of_source("src").unwrap().len(), 1);
    }
    let m = SinkManifest::open(dir.path()).unwrap();
    assert_eq!(m.get(&f).unwrap(), Some(record("k", shapes[4])));
    assert_eq!(
        m.all_files().unwrap(),
        vec![(f.clone(), record("k", shapes[4]))]
    );
    assert_eq!(m.counters().unwrap().placed_bytes, 0x01_0101_0101);
}

#[test]
fn counters_add_and_duplicates_show_in_audit() {
    let dir = TempDir::new("sink-counters");
    let f = id("src", "k", 7);
    {
        let m = SinkManifest::open(dir.path()).unwrap();
        assert_eq!(m.counters().unwrap(), SinkCounters::default());
        m.commit(&SinkCommit {
            journal: Vec::new(),
            journal_round: 0,
            journal_start: 0,
            withdrawn: Vec::new(),
            outbox: Vec::new(),
            outbox_rewrite: Vec::new(),
            journal_complete: 0,
            records: vec![(f.clone(), record("k", &[(0, 10)]))],
            placements: vec![(f.clone(), 0, 10)],
            counters: SinkCounters {
                placed_bytes: 10,
                duplicate_bytes: 1,
                rewritten_bytes: 0,
            },
        })
        .unwrap();
    }
    // Reopen between commits: the audit sequence must continue, not restart.
    let m = SinkManifest::open(dir.path()).unwrap();
    let clone = m.clone();
    clone
        .commit(&SinkCommit {
            journal: Vec::new(),
            journal_round: 0,
            journal_start: 0,
            withdrawn: Vec::new(),
            outbox: Vec::new(),
            outbox_rewrite: Vec::new(),
            journal_complete: 0,
            records: vec![(f.clone(), record("k", &[(0, 10)]))],
            placements: vec![(f.clone(), 0, 10)],
            counters: SinkCounters {
                placed_bytes: 10,
                duplicate_bytes: 2,
                rewritten_bytes: 4,
            },
        })
        .unwrap();
    m.commit(&SinkCommit::default()).unwrap();
    assert_eq!(
        m.counters().unwrap(),
        SinkCounters {
            placed_bytes: 20,
            duplicate_bytes: 3,
            rewritten_bytes: 4
        }
    );
    assert_eq!(m.placements(&f).unwrap(), vec![(0, 10), (0, 10)]);
}

#[test]
fn concurrent_commits_do_not_lose_counts() {
    let dir = TempDir::new("sink-concurrent");
    let m = SinkManifest::open(dir.path()).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let m = m.clone();
            std::thread::spawn(move || {
                for i in 0..10 {
                    m.commit(&SinkCommit {
                        journal: Vec::new(),
                        journal_round: 0,
                        journal_start: 0,
                        withdrawn: Vec::new(),
                        outbox: Vec::new(),
                        outbox_rewrite: Vec::new(),
                        journal_complete: 0,
                        records: vec![],
                        placements: vec![(id("s", "k", t), i, 1)],
                        counters: SinkCounters {
                            placed_bytes: 1,
                            ..SinkCounters::default()
                        },
                    })
                    .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(m.counters().unwrap().placed_bytes, 40);
    for t in 0..4 {
        assert_eq!(m.placements(&id("s", "k", t)).unwrap().len(), 10);
    }
}

#[test]
fn garbage_file_record_is_reported_as_corrupt() {
    let dir = TempDir::new("sink-corrupt-value");
    let m = SinkManifest::open(dir.path()).unwrap();
    let f = id("src", "bad/file", 3);
    m.inner
        .store
        .raw_put(CF_FILES, &file_key(&f), b"\xff not json");
    for err in [m.get(&f).unwrap_err(), m.all_files().unwrap_err()] {
        assert!(matches!(err, Error::Corrupt { cf: "files", .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("column family files"), "{msg}");
        assert!(msg.contains("bad/file"), "{msg}");
        assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
    }
    let err = m.generations("src", "bad/file").unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
}

#[test]
fn garbage_file_key_is_reported_as_corrupt() {
    let dir = TempDir::new("sink-corrupt-key");
    let m = SinkManifest::open(dir.path()).unwrap();
    m.inner.store.raw_put(CF_FILES, b"stray-key", b"{}");
    let err = m.all_files().unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::Corrupt { cf: "files", .. }), "{err:?}");
    assert!(msg.contains("stray-key"), "{msg}");
}

#[test]
fn corrupt_counter_is_reported() {
    let dir = TempDir::new("sink-corrupt-counter");
    let m = SinkManifest::open(dir.path()).unwrap();
    m.inner.store.raw_put(CF_COUNTERS, KEY_PLACED, b"abc");
    let msg = m.counters().unwrap_err().to_string();
    assert!(
        msg.contains("counters") && msg.contains("placed_bytes"),
        "{msg}"
    );
    // A commit must refuse to build on a counter it cannot read.
    let err = m
        .commit(&SinkCommit {
            counters: SinkCounters {
                placed_bytes: 1,
                ..SinkCounters::default()
            },
            ..SinkCommit::default()
        })
        .unwrap_err();
    assert!(matches!(err, Error::Corrupt { .. }), "{err:?}");
}

#[test]
fn journal_entries_commit_with_records_and_are_forgotten() {
    let dir = TempDir::new("sink-journal");
    let m = SinkManifest::open(dir.path()).unwrap();
    let a = id("s", "run/a", 1);
    let b = id("s", "run/a", 2);
    m.commit(&SinkCommit {
        records: vec![(a.clone(), record("s/run/a", &[(0, 8)]))],
        journal: vec![
            (b.clone(), 0, in_file(16, 6)),
            (a.clone(), 4, JournalBytes::Inline(b"tail".to_vec())),
            (a.clone(), 0, in_file(0, 4)),
        ],
        journal_round: 7,
        ..SinkCommit::default()
    })
    .unwrap();
    m.commit(&SinkCommit {
        journal: vec![(a.clone(), 8, in_file(22, 2))],
        journal_round: 22,
        ..SinkCommit::default()
    })
    .unwrap();
    drop(m);
    let m = SinkManifest::open(dir.path()).unwrap();
    assert_eq!(
        m.journal().unwrap(),
        vec![
            (a.clone(), 0, in_file(0, 4)),
            (a.clone(), 4, JournalBytes::Inline(b"tail".to_vec())),
            (a.clone(), 8, in_file(22, 2)),
            (b.clone(), 0, in_file(16, 6)),
        ]
    );
    m.forget_journal(&[7]).unwrap();
    assert_eq!(
        m.journal().unwrap(),
        vec![
            (a.clone(), 4, JournalBytes::Inline(b"tail".to_vec())),
            (a.clone(), 8, in_file(22, 2)),
        ]
    );
    m.clear_journal().unwrap();
    assert!(m.journal().unwrap().is_empty());
}

fn in_file(position: u64, len: u32) -> JournalBytes {
    JournalBytes::InFile {
        position,
        len,
        crc32c: 0xdead_beef ^ len,
    }
}

#[test]
fn garbage_current_file_fails_open_with_path() {
    let dir = TempDir::new("sink-corrupt-current");
    drop(SinkManifest::open(dir.path()).unwrap());
    std::fs::write(
        dir.path().join("CURRENT"),
        b"\x00\xffgarbage-not-a-manifest\n",
    )
    .unwrap();
    let err = SinkManifest::open(dir.path()).unwrap_err();
    assert!(matches!(err, Error::Open { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&dir.path().display().to_string()), "{msg}");
}
