//! Unit tests of placement; they record each batch the way a commit round
//! would, without a committer.

use std::os::unix::fs::FileExt;
use std::path::Path;

use flight_server::{BatchBuilder, SealDigest, checksum};
use manifest_db::{FileRecord, JournalBytes, Sealed, SinkCommit};

use super::*;
use crate::durability::flush::SyncTarget;

mod beside;
mod order;
mod rename;
mod replay;

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
            Shared {
                commit_gate: crate::state::new_commit_gate(),
                journal: Journal {
                    max_range: journal_max_range,
                    backlog: Arc::default(),
                },
                health: Health::default(),
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

/// Places `batch` and does what its round would: its records in memory.
fn place_and_record(placer: &Placer, source: &Source, seq: u64, batch: &RangeBatch) {
    let (request, _) = placer.place(source, seq, batch).unwrap();
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
/// and are in their file as soon as they are placed (before the batch's
/// round); a seal is refused while ranges past its size are in flight.
#[test]
fn journaled_ranges_are_in_their_file_once_placed() {
    let fixture = Fixture::new("journaled");
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
    let (request, _) = placer.place(&source, 1, &first).unwrap();
    assert!(
        request.journal.is_empty(),
        "a new file is flushed, not journaled"
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"head");
    record(&request);

    let second = batch(&|b| b.push_data("a.dat", 1, 4, b"tail"));
    let (request, ack) = placer.place(&source, 2, &second).unwrap();
    assert_eq!((ack.placed, request.journal_bytes), (4, 4));
    assert_eq!(request.journal.len(), 1);
    assert_eq!(
        request.journal[0].crc32c,
        checksum::crc32c(b"tail"),
        "the row's checked CRC goes to the journal with its bytes"
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"headtail");

    let early_seal = batch(&|b| b.push_seal("a.dat", 1, 4, &digest(b"head")));
    let (_, ack) = placer.place(&source, 3, &early_seal).unwrap();
    assert_eq!(ack.rejected.len(), 1);
    assert!(
        ack.rejected[0]
            .error
            .contains("4..8 past it are being written"),
        "{}",
        ack.rejected[0].error
    );

    record(&request);
    let seal = batch(&|b| b.push_seal("a.dat", 1, 8, &digest(b"headtail")));
    let (_, ack) = placer.place(&source, 4, &seal).unwrap();
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
        let (request, ack) = placer
            .place(&source, seq as u64 + 1, &batch(offset, len))
            .unwrap();
        assert!(
            request.journal.is_empty(),
            "ranges this large are not journaled"
        );
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

    let (_, ack) = placer.place(&source, 4, &batch(70_000, 100_123)).unwrap();
    assert_eq!((ack.placed, ack.duplicate), (0, 100_123));
    assert!(std::fs::read(fixture.dest("s/big.dat")).unwrap() == data);

    let mut hasher = SealDigest::Crc64Nvme.hasher();
    hasher.update(&data);
    let mut builder = BatchBuilder::with_capacity(1, 64);
    builder.push_seal("big.dat", 1, data.len() as u64, &hasher.finish());
    let seal = RangeBatch::validate(builder.finish()).unwrap();
    let (_, ack) = placer.place(&source, 5, &seal).unwrap();
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
            let (request, ack) = placer.place(source, seq as u64 + 1, &batch).unwrap();
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
        let (_, ack) = placer.place(source, 10, &seal_batch(digest)).unwrap();
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
    let (request, _) = placer.place(&source, 1, &batch).unwrap();
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
    let (request, ack) = placer
        .place(&source, 1, &RangeBatch::validate(builder.finish()).unwrap())
        .unwrap();
    assert!(ack.rejected.is_empty());
    record_placed(&request);
    let mut builder = BatchBuilder::with_capacity(2, 256);
    builder.push_open("a.dat", 2, "a.dat");
    builder.push_data("a.dat", 2, 0, b"new");
    let (_, ack) = placer
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
    let (request, ack) = placer
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
    let (_, ack) = placer.place(&source, 1, &new).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
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
    let (_, ack) = placer.place(&source, 1, &new).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    assert_eq!(
        std::fs::read(fixture.dest("s/a.dat.gen1")).unwrap(),
        b"old generation"
    );
    assert_eq!(std::fs::read(fixture.dest("s/a.dat")).unwrap(), b"new");
    assert_eq!(old_record(&placer).dest_path, "s/a.dat.gen1");
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
    let (request, _) = first
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
    assert!(!first.sources.names().iter().any(|name| name == "other"));
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
    let loading = placer.sources.cell("slow").unwrap();
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
    placer.sources.set_max_sources(2);
    placer.source("a").unwrap();
    placer.source("b").unwrap();
    match placer.source("c") {
        Err(SinkError::Peer(message)) => assert!(message.contains("\"c\""), "{message}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a source past the cap was served"),
    }
    assert_eq!(placer.sources.names().len(), 2);
    placer.source("a").unwrap();
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

fn file_of_s(key: &str) -> FileId {
    FileId {
        source: "s".into(),
        key: key.into(),
        generation: 1,
    }
}
