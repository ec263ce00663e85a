//! Unit tests of placement; they record each batch the way a commit round
//! would, without a committer.

use super::rename::paths_overlap;
use super::*;
use crate::durability::flush::SyncTarget;
use flight_server::BatchBuilder;

/// A scratch root and state directory, removed on drop.
struct Fixture {
    dir: std::path::PathBuf,
}

impl Fixture {
    fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "tailflight-placement-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("root")).unwrap();
        Self { dir }
    }

    fn placer(&self) -> Placer {
        self.placer_with(Layout::PerSource, SupersededPolicy::Mirror, 64 << 10)
    }

    fn placer_with(
        &self,
        layout: Layout,
        superseded: SupersededPolicy,
        journal_max_range: u64,
    ) -> Placer {
        Placer::new(
            Root::open(&self.dir.join("root")).unwrap(),
            SinkManifest::open(&self.dir.join("state")).unwrap(),
            layout,
            superseded,
            64,
            CommitGate::default(),
            Journal {
                max_range: journal_max_range,
                backlog: Arc::default(),
            },
        )
    }

    fn dest(&self, path: &str) -> std::path::PathBuf {
        self.dir.join("root").join(path)
    }

    fn journal_file(&self) -> std::path::PathBuf {
        self.dir.join("journal.ring")
    }
}

/// What a commit round does to the records of a batch it recorded.
fn record_placed(request: &CommitRequest) {
    for (slot, ranges) in &request.placed {
        let mut state = lock(&slot.state);
        for &(start, end) in ranges {
            state.record.placed.insert(start, end);
            state.pending.remove(start, end);
        }
    }
}

/// Places `batch` and does what its round would: its deferred writes,
/// then its records in memory.
fn place_and_record(placer: &Placer, source: &Source, seq: u64, batch: &RangeBatch) {
    let (request, _, deferred) = placer.place(source, seq, batch).unwrap();
    deferred.write(batch).unwrap();
    record_placed(&request);
}

/// A validated batch of the rows `build` pushes.
fn rows(build: impl FnOnce(&mut BatchBuilder)) -> RangeBatch {
    let mut builder = BatchBuilder::with_capacity(4, 64);
    build(&mut builder);
    RangeBatch::validate(builder.finish()).unwrap()
}

/// Where `bytes` are in a journal file written as the concatenation of
/// "head", "tail", "gone".
fn in_journal(bytes: &[u8]) -> JournalBytes {
    let position = match bytes {
        b"head" => 0,
        b"tail" => 4,
        _ => 8,
    };
    JournalBytes::InFile {
        position,
        len: bytes.len() as u32,
        crc32c: checksum::crc32c(bytes),
    }
}

/// Small ranges of a file the batch does not create go to the journal,
/// and reach their file only through the deferred writes, once the
/// batch is submitted; a seal is refused while ranges past its size are
/// still in flight.
#[test]
fn journaled_ranges_reach_their_file_through_the_deferred_writes() {
    let fixture = Fixture::new("deferred");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let dest = fixture.dest("s/a.dat");
    let batch = |build: &dyn Fn(&mut BatchBuilder)| {
        let mut builder = BatchBuilder::with_capacity(4, 64);
        build(&mut builder);
        RangeBatch::validate(builder.finish()).unwrap()
    };
    let record = record_placed;
    let digest = |bytes: &[u8]| {
        let mut hasher = SealDigest::Crc64Nvme.hasher();
        hasher.update(bytes);
        hasher.finish()
    };

    let first = batch(&|b| b.push_data("a.dat", 1, 0, b"head"));
    let (request, _, deferred) = placer.place(&source, 1, &first).unwrap();
    assert!(deferred.is_empty(), "a new file is flushed, not journaled");
    assert_eq!(std::fs::read(&dest).unwrap(), b"head");
    record(&request);

    let second = batch(&|b| b.push_data("a.dat", 1, 4, b"tail"));
    let (request, ack, deferred) = placer.place(&source, 2, &second).unwrap();
    assert_eq!((ack.placed, request.journal_bytes), (4, 4));
    assert!(!deferred.is_empty());
    assert_eq!(
        std::fs::read(&dest).unwrap(),
        b"head",
        "written only once submitted"
    );

    let early_seal = batch(&|b| b.push_seal("a.dat", 1, 4, &digest(b"head")));
    let (_, ack, _) = placer.place(&source, 3, &early_seal).unwrap();
    assert_eq!(ack.rejected.len(), 1);
    assert!(
        ack.rejected[0]
            .error
            .contains("4..8 past it are being written"),
        "{}",
        ack.rejected[0].error
    );

    let slot = request.placed[0].0.clone();
    assert_eq!(lock(&slot.state).deferred_writes, 1);
    deferred.write(&second).unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"headtail");
    // Nothing in flight: a seal need not wait for a round to end.
    assert_eq!(lock(&slot.state).deferred_writes, 0);
    record(&request);
    let seal = batch(&|b| b.push_seal("a.dat", 1, 8, &digest(b"headtail")));
    let (_, ack, _) = placer.place(&source, 4, &seal).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected[0].error);
}

/// Large ranges written in place put their aligned middle through the
/// direct descriptor (where the filesystem allows) and their head and
/// tail through the page cache; the file comes out byte-exact, a
/// re-delivery writes nothing, and the seal (told to) reads it back whole.
#[test]
fn large_ranges_write_their_aligned_middle_directly_and_land_byte_exact() {
    let fixture = Fixture::new("direct");
    let placer = fixture
        .placer()
        .with_direct_writes(8192)
        .with_seal_read_back(true);
    let source = placer.source("s").unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 253) as u8).collect();
    let batch = |offset: usize, len: usize| {
        let mut builder = BatchBuilder::with_capacity(4, len + 64);
        builder.push_data("big.dat", 1, offset as u64, &data[offset..offset + len]);
        RangeBatch::validate(builder.finish()).unwrap()
    };
    // Past the journal's 64 KiB: an aligned start, then two unaligned ones.
    for (seq, (offset, len)) in [(0, 70_000), (70_000, 100_123), (170_123, 129_877)]
        .into_iter()
        .enumerate()
    {
        let (request, ack, deferred) = placer
            .place(&source, seq as u64 + 1, &batch(offset, len))
            .unwrap();
        assert!(deferred.is_empty(), "ranges this large are not journaled");
        assert_eq!(ack.placed, len as u64);
        record_placed(&request);
        if seq == 0 {
            let state = lock(&request.placed[0].0.state);
            assert!(
                !matches!(state.direct, DirectFile::NotOpened),
                "the first large range opens the direct descriptor (or finds it refused)"
            );
        }
    }
    assert!(std::fs::read(fixture.dest("s/big.dat")).unwrap() == data);

    let (_, ack, _) = placer.place(&source, 4, &batch(70_000, 100_123)).unwrap();
    assert_eq!((ack.placed, ack.duplicate), (0, 100_123));
    assert!(std::fs::read(fixture.dest("s/big.dat")).unwrap() == data);

    let mut hasher = SealDigest::Crc64Nvme.hasher();
    hasher.update(&data);
    let mut builder = BatchBuilder::with_capacity(1, 64);
    builder.push_seal("big.dat", 1, data.len() as u64, &hasher.finish());
    let seal = RangeBatch::validate(builder.finish()).unwrap();
    let (_, ack, _) = placer.place(&source, 5, &seal).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
}

/// A seal is checked against the CRC-64 of the bytes as this process
/// wrote them; the file is read back when told to, when its ranges were
/// placed by an earlier process, and when the path no longer leads to
/// the file they were written to. (Bytes changed inside that file behind
/// the sink's back show only in a read-back: the check is on the
/// transfer, not on the disk.)
#[test]
fn seals_check_the_bytes_as_written_and_read_back_what_an_earlier_run_wrote() {
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 11 + i / 97) as u8).collect();
    let digest = |bytes: &[u8]| {
        let mut hasher = SealDigest::Crc64Nvme.hasher();
        hasher.update(bytes);
        hasher.finish()
    };
    let seal_batch = |digest: &str| {
        let mut builder = BatchBuilder::with_capacity(1, 64);
        builder.push_seal("f.dat", 1, data.len() as u64, digest);
        RangeBatch::validate(builder.finish()).unwrap()
    };
    // Places `data` in three ranges, the last one first, and records
    // them as a commit round would (in the manifest too).
    let place_all = |placer: &Placer, source: &Source| {
        for (seq, (start, end)) in [(150_000, 200_000), (0, 70_000), (70_000, 150_000)]
            .into_iter()
            .enumerate()
        {
            let mut builder = BatchBuilder::with_capacity(1, end - start + 64);
            builder.push_data("f.dat", 1, start as u64, &data[start..end]);
            let batch = RangeBatch::validate(builder.finish()).unwrap();
            let (request, ack, _) = placer.place(source, seq as u64 + 1, &batch).unwrap();
            assert_eq!(ack.placed, (end - start) as u64);
            for (slot, ranges) in &request.placed {
                let mut state = lock(&slot.state);
                for &(s, e) in ranges {
                    state.record.placed.insert(s, e);
                    state.pending.remove(s, e);
                }
                let commit = SinkCommit {
                    records: vec![(slot.id.clone(), state.record.clone())],
                    ..SinkCommit::default()
                };
                placer.manifest.commit(&commit).unwrap();
            }
        }
    };
    let damage = |path: &Path| {
        let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
        file.write_all_at(b"X", 100).unwrap();
    };
    let rejected = |placer: &Placer, source: &Source, digest: &str| {
        let (_, ack, _) = placer.place(source, 10, &seal_batch(digest)).unwrap();
        ack.rejected.first().map(|r| r.error.clone())
    };

    // Written here: the seal is checked without reading the file.
    let fixture = Fixture::new("seal-written");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    place_all(&placer, &source);
    damage(&fixture.dest("s/f.dat"));
    let wrong = rejected(&placer, &source, &digest(&data[1..])).expect("a wrong digest");
    assert!(wrong.contains("the source says"), "{wrong}");
    assert_eq!(rejected(&placer, &source, &digest(&data)), None);

    // Told to read back: the damage shows.
    let fixture = Fixture::new("seal-read-back");
    let placer = fixture.placer().with_seal_read_back(true);
    let source = placer.source("s").unwrap();
    place_all(&placer, &source);
    damage(&fixture.dest("s/f.dat"));
    assert!(rejected(&placer, &source, &digest(&data)).is_some());

    // Replaced behind the sink's back: the file at the path is read.
    let fixture = Fixture::new("seal-replaced");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    place_all(&placer, &source);
    let path = fixture.dest("s/f.dat");
    std::fs::remove_file(&path).unwrap();
    let mut other = data.clone();
    other[5] ^= 1;
    std::fs::write(&path, &other).unwrap();
    let error = rejected(&placer, &source, &digest(&data)).expect("read back");
    assert!(error.contains("digest of the file"), "{error}");

    // Replaced while its descriptor was evicted: the descriptor opened
    // again reaches another file, and what was written before is not
    // vouched for any more.
    let fixture = Fixture::new("seal-reopened");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let mut builder = BatchBuilder::with_capacity(1, 120_064);
    builder.push_data("f.dat", 1, 0, &data[..120_000]);
    let batch = RangeBatch::validate(builder.finish()).unwrap();
    let (request, _, _) = placer.place(&source, 1, &batch).unwrap();
    let slot = request.placed[0].0.clone();
    {
        let mut state = lock(&slot.state);
        state.record.placed.insert(0, 120_000);
        state.pending.remove(0, 120_000);
        state.close_file();
    }
    std::fs::remove_file(fixture.dest("s/f.dat")).unwrap();
    let mut builder = BatchBuilder::with_capacity(1, 80_064);
    builder.push_data("f.dat", 1, 120_000, &data[120_000..]);
    let batch = RangeBatch::validate(builder.finish()).unwrap();
    placer.place(&source, 2, &batch).unwrap();
    {
        let mut state = lock(&slot.state);
        state.record.placed.insert(120_000, 200_000);
        state.pending.remove(120_000, 200_000);
    }
    let error = rejected(&placer, &source, &digest(&data)).expect("read back");
    assert!(error.contains("digest of the file"), "{error}");

    // Placed by an earlier process: read back, and the damage shows.
    let fixture = Fixture::new("seal-restarted");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    place_all(&placer, &source);
    drop((source, placer));
    damage(&fixture.dest("s/f.dat"));
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let error = rejected(&placer, &source, &digest(&data)).expect("read back");
    assert!(error.contains("the source says"), "{error}");
    std::fs::write(fixture.dest("s/f.dat"), &data).unwrap();
    assert_eq!(rejected(&placer, &source, &digest(&data)), None);
}

/// Keeping a superseded generation aside never renames it over another
/// file: a live file of the source named `<dest>.gen<N>` stays, and the
/// old generation goes to the next free name; a file created later under
/// the kept name moves the kept one on instead of writing into it.
#[test]
fn a_kept_generation_goes_aside_without_replacing_a_live_file() {
    let fixture = Fixture::new("keep-aside");
    let placer = fixture.placer_with(Layout::PerSource, SupersededPolicy::Keep, 0);
    let source = placer.source("s").unwrap();
    let mut builder = BatchBuilder::with_capacity(4, 256);
    builder.push_data("a.dat", 1, 0, b"old generation");
    builder.push_data("a.dat.gen1", 1, 0, b"a live file");
    let (request, ack, _) = placer
        .place(&source, 1, &RangeBatch::validate(builder.finish()).unwrap())
        .unwrap();
    assert!(ack.rejected.is_empty());
    record_placed(&request);
    let mut builder = BatchBuilder::with_capacity(2, 256);
    builder.push_open("a.dat", 2, "a.dat");
    builder.push_data("a.dat", 2, 0, b"new");
    let (_, ack, _) = placer
        .place(&source, 2, &RangeBatch::validate(builder.finish()).unwrap())
        .unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    let read = |path: &str| std::fs::read(fixture.dest(path)).unwrap();
    assert_eq!(read("s/a.dat.gen1"), b"a live file");
    assert_eq!(read("s/a.dat.gen1.1"), b"old generation");
    assert_eq!(read("s/a.dat"), b"new");

    // A new source file named like the kept one: the kept file moves on
    // (and its record with it), the new one gets the name.
    let mut builder = BatchBuilder::with_capacity(1, 256);
    builder.push_data("a.dat.gen1.1", 1, 0, b"newcomer");
    let (request, ack, _) = placer
        .place(&source, 3, &RangeBatch::validate(builder.finish()).unwrap())
        .unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    assert_eq!(read("s/a.dat.gen1.1"), b"newcomer");
    assert_eq!(read("s/a.dat.gen1.1.1"), b"old generation");
    let moved = request
        .touched
        .iter()
        .find(|slot| slot.id.key == "a.dat" && slot.id.generation == 1)
        .expect("the kept generation's record is committed");
    assert_eq!(lock(&moved.state).record.dest_path, "s/a.dat.gen1.1.1");
}

/// Under `--superseded keep`, the move aside of the old generation is
/// recorded before the new generation's file takes its path: a crash
/// before their round leaves the old record naming the kept file, not
/// the new one. An intent whose move the crash lost is made when the new
/// generation comes again.
#[test]
fn a_generation_kept_aside_is_recorded_before_its_path_is_taken() {
    let fixture = Fixture::new("keep-crash");
    std::fs::create_dir_all(fixture.dest("s")).unwrap();
    std::fs::write(fixture.dest("s/a.dat"), b"old generation").unwrap();
    let live = (file_of_s("a.dat"), record("s/a.dat", 14));
    fixture
        .placer()
        .manifest
        .commit(&SinkCommit {
            records: vec![live],
            ..SinkCommit::default()
        })
        .unwrap();
    let keeping = || fixture.placer_with(Layout::PerSource, SupersededPolicy::Keep, 0);
    let new = rows(|b| {
        b.push_open("a.dat", 2, "a.dat");
        b.push_data("a.dat", 2, 0, b"new");
    });
    let old_record = |placer: &Placer| {
        let records = placer.manifest.files_of_source("s").unwrap();
        let (_, record) = records
            .into_iter()
            .find(|(id, _)| id.key == "a.dat" && id.generation == 1)
            .unwrap();
        record
    };

    let placer = keeping();
    let source = placer.source("s").unwrap();
    let (_, ack, deferred) = placer.place(&source, 1, &new).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    deferred.write(&new).unwrap();
    // The crash: no round ran.
    drop(source);
    let kept = old_record(&placer);
    assert_eq!(kept.dest_path, "s/a.dat.gen1");
    assert!(kept.superseded && kept.kept, "{kept:?}");
    assert_eq!(
        std::fs::read(fixture.dest("s/a.dat.gen1")).unwrap(),
        b"old generation"
    );
    assert_eq!(std::fs::read(fixture.dest("s/a.dat")).unwrap(), b"new");
    drop(placer);

    // The same intent, with its move lost: the old file is back at
    // a.dat and the new one never made.
    std::fs::rename(fixture.dest("s/a.dat.gen1"), fixture.dest("s/a.dat")).unwrap();
    let placer = keeping();
    let source = placer.source("s").unwrap();
    let (_, ack, deferred) = placer.place(&source, 1, &new).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    deferred.write(&new).unwrap();
    assert_eq!(
        std::fs::read(fixture.dest("s/a.dat.gen1")).unwrap(),
        b"old generation"
    );
    assert_eq!(std::fs::read(fixture.dest("s/a.dat")).unwrap(), b"new");
    assert_eq!(old_record(&placer).dest_path, "s/a.dat.gen1");
}

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
        let (request, ack, _) = placer.place(&source, 1, &batch_of(&setup)).unwrap();
        assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
        record_placed(&request);
        (fixture, placer, source)
    };

    // One row per batch: the order the batch's rows ask for.
    let (one_by_one, placer, source) = start("renames-one-by-one");
    for (seq, step) in steps.iter().enumerate() {
        let batch = batch_of(std::slice::from_ref(step));
        let (_, ack, _) = placer.place(&source, seq as u64 + 2, &batch).unwrap();
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
    let (request, ack, _) = placer.place(&source, 2, &batch_of(&steps)).unwrap();
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
    let mut work = BatchWork {
        request: CommitRequest::default(),
        ack: Ack::default(),
        deferred: DeferredWrites::default(),
        renamed: Default::default(),
    };
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
    let (_, ack, _) = placer.place(&source, 2, &batch).unwrap();
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
    let (request, _, _) = place(1, &|b| b.push_data("a.tmp", 1, 0, b"first")).unwrap();
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

    let (request, _, _) = place(3, &|b| b.push_data("a.tmp", 1, 5, b" more")).unwrap();
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
    let (request, _, _) = placer.place(&source, 1, &first).unwrap();
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
        let (request, ack, deferred) = placer.place(&source, seq, &more).unwrap();
        assert_eq!(ack.rejected.len(), 1, "{:?}", ack.rejected);
        assert_eq!(ack.rejected[0].row, 0);
        assert!(!ack.rejected[0].superseded);
        assert!(
            ack.rejected[0].error.contains("cannot rename"),
            "{}",
            ack.rejected[0].error
        );
        deferred.write(&more).unwrap();
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
    let (request, _, _) = placer.place(&source, 1, &setup).unwrap();
    record_placed(&request);

    let rename = rows(|b| b.push_rename("a.tmp", 1, "a"));
    let (_, ack, _) = placer.place(&source, 2, &rename).unwrap();
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
    let (_, ack, _) = placer.place(&source, 2, &rotate).unwrap();
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
    let (_, ack, deferred) = restarted.place(&source, 3, &more).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    deferred.write(&more).unwrap();
    assert_eq!(std::fs::read(fixture.dest("s/a.2")).unwrap(), b"first+1");
    assert_eq!(std::fs::read(fixture.dest("s/a.1")).unwrap(), b"second+2");
    assert!(!fixture.dest("s/a").exists());
}

fn file_of_s(key: &str) -> FileId {
    FileId {
        source: "s".into(),
        key: key.into(),
        generation: 1,
    }
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
    let (_, ack, _) = placer.place(&source, 1, &rename).unwrap();
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
    let (_, ack, deferred) = placer.place(&source, 1, &new).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    deferred.write(&new).unwrap();
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
    let (_, ack, _) = placer.place(&source, 3, &run).unwrap();
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
    let (_, ack, _) = placer.place(&source, 2, &rename).unwrap();
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
    let (request, ack, deferred) = placer.place(&source, 1, &more).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    assert_eq!(ack.placed, 5);
    deferred.write(&more).unwrap();
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
    let (request, _, deferred) = placer
        .place(&source, 1, &RangeBatch::validate(builder.finish()).unwrap())
        .unwrap();
    let flushed: std::collections::HashSet<_> =
        request.files_to_sync.iter().map(Arc::as_ptr).collect();
    assert_eq!(flushed.len(), 2, "new files are flushed");
    assert!(request.journal.is_empty() && deferred.is_empty());
    record_placed(&request);

    let mut builder = BatchBuilder::with_capacity(3, 64);
    builder.push_data("a.tmp", 1, 5, b" more");
    builder.push_rename("a.tmp", 1, "a");
    builder.push_data("b", 1, 5, b" more");
    let batch = RangeBatch::validate(builder.finish()).unwrap();
    let (request, ack, deferred) = placer.place(&source, 2, &batch).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    assert!(!request.dirs_to_sync.is_empty(), "the rename's directory");
    assert!(request.files_to_sync.is_empty(), "no file flushed");
    assert!(!request.flushes_anyway());
    assert_eq!(request.journal.len(), 2, "both small ranges journaled");
    deferred.write(&batch).unwrap();
    assert_eq!(std::fs::read(fixture.dest("s/a")).unwrap(), b"first more");
    assert_eq!(std::fs::read(fixture.dest("s/b")).unwrap(), b"first more");
}

/// A flat-layout sink serves the first source it sees, also after a
/// restart; another one is refused, naming both.
#[test]
fn a_flat_layout_serves_one_source() {
    let fixture = Fixture::new("flat-one-source");
    let placer = |fixture: &Fixture| fixture.placer_with(Layout::Flat, SupersededPolicy::Mirror, 0);
    let first = placer(&fixture);
    let source = first.source("cam").unwrap();
    let mut builder = BatchBuilder::with_capacity(1, 64);
    builder.push_data("f.dat", 1, 0, b"bytes");
    let (request, _, _) = first
        .place(&source, 1, &RangeBatch::validate(builder.finish()).unwrap())
        .unwrap();
    for (slot, _) in &request.placed {
        let state = lock(&slot.state);
        let commit = SinkCommit {
            records: vec![(slot.id.clone(), state.record.clone())],
            ..SinkCommit::default()
        };
        first.manifest.commit(&commit).unwrap();
    }
    let refused = |placer: &Placer| match placer.source("other") {
        Err(SinkError::Peer(message)) => message,
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a second source was accepted"),
    };
    let message = refused(&first);
    assert!(
        message.contains("\"cam\"") && message.contains("\"other\""),
        "{message}"
    );
    // A refused name keeps no state: peers cannot grow the map.
    assert!(!lock(&first.sources).contains_key("other"));
    drop((source, first));

    let restarted = placer(&fixture);
    refused(&restarted);
    restarted.source("cam").unwrap();
}

/// Loading a source (a scan of its records, long for a long history)
/// holds up that source's batches only: others are served meanwhile.
#[test]
fn loading_one_source_holds_up_no_other() {
    let fixture = Fixture::new("source-loading");
    let placer = Arc::new(fixture.placer());
    let served = placer.source("served").unwrap();
    // As if "slow" were being loaded by another stream right now.
    let loading = lock(&placer.sources)
        .entry("slow".to_owned())
        .or_default()
        .clone();
    let scan = lock(&loading);
    let (answer, answered) = std::sync::mpsc::channel();
    let other = placer.clone();
    let asker = std::thread::spawn(move || {
        let again = other.source("served").map(|s| s.name.clone());
        let fresh = other.source("fresh").map(|s| s.name.clone());
        let _ = answer.send((again, fresh));
    });
    // A guard against a hang, not a measure of speed.
    let (again, fresh) = answered
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("other sources waited for the one being loaded");
    assert_eq!(again.unwrap(), served.name);
    assert_eq!(fresh.unwrap(), "fresh");
    asker.join().unwrap();
    drop(scan);
    assert_eq!(placer.source("slow").unwrap().name, "slow");
    assert!(Arc::ptr_eq(&placer.source("served").unwrap(), &served));
}

/// Sources are capped: a peer cannot grow the sink's state by naming
/// new ones; those already served go on.
#[test]
fn sources_past_the_cap_are_refused() {
    let fixture = Fixture::new("source-cap");
    let mut placer = fixture.placer();
    placer.max_sources = 2;
    placer.source("a").unwrap();
    placer.source("b").unwrap();
    match placer.source("c") {
        Err(SinkError::Peer(message)) => assert!(message.contains("\"c\""), "{message}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a source past the cap was served"),
    }
    assert_eq!(lock(&placer.sources).len(), 2);
    placer.source("a").unwrap();
}

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

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn id(key: &str, generation: u64) -> FileId {
    FileId {
        source: "src".into(),
        key: key.into(),
        generation,
    }
}

fn record(dest: &str, end: u64) -> FileRecord {
    FileRecord {
        dest_path: dest.into(),
        placed: IntervalSet::from_ranges([(0, end)]),
        ..FileRecord::default()
    }
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
    let settled = manifest.get(&id("run/old-name.dat", 1)).unwrap().unwrap();
    assert_eq!(settled.renamed_from, None);

    // Replaying again (a crash during the first replay) changes nothing.
    drop(placer);
    let again = fixture.placer();
    assert_eq!(again.replay_journal(&fixture.journal_file()).unwrap(), 0);
    assert_eq!(
        std::fs::read(fixture.dest("src/lost.dat")).unwrap(),
        b"headtail"
    );
}
