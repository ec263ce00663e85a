//! End-to-end runs of the simulator against a scratch directory.

use detector_sim::{EndMarker, SimConfig, first_mismatch, run};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A fresh directory under the system temp dir, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let dir =
            std::env::temp_dir().join(format!("detector-sim-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn config(dir: &Path) -> SimConfig {
    SimConfig {
        dir: dir.join("data"),
        run: "r0042".into(),
        streams: 2,
        rate_hz: 0.0,
        frame_bytes: 300,
        events_per_write: 1,
        chunk_bytes: 1000,
        duration: None,
        total_bytes: Some(5001),
        seed: 99,
        ..SimConfig::default()
    }
}

/// One stream of 10-byte frames at 200 Hz for 300 ms: 60 writes are due.
fn paced_config(dir: &Path) -> SimConfig {
    SimConfig {
        streams: 1,
        rate_hz: 200.0,
        frame_bytes: 10,
        chunk_bytes: 1 << 20,
        duration: Some(Duration::from_millis(300)),
        total_bytes: None,
        ..config(dir)
    }
}

fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

#[test]
fn short_run_produces_renamed_chunks_with_correct_content() {
    let scratch = Scratch::new("short");
    let log_path = scratch.0.join("writes.log");
    let cfg = SimConfig {
        write_log: Some(log_path.clone()),
        ..config(&scratch.0)
    };
    let report = run(&cfg, &AtomicBool::new(false)).expect("run");

    // 5001 bytes over 2 streams: 2501 + 2500, in 1000-byte chunks.
    let expected: Vec<(String, u64)> = [
        ("r0042-s00-c000.xtc2", 1000),
        ("r0042-s00-c001.xtc2", 1000),
        ("r0042-s00-c002.xtc2", 501),
        ("r0042-s01-c000.xtc2", 1000),
        ("r0042-s01-c001.xtc2", 1000),
        ("r0042-s01-c002.xtc2", 500),
    ]
    .iter()
    .map(|(n, s)| (n.to_string(), *s))
    .collect();
    assert_eq!(report.files, expected);
    assert_eq!(report.bytes, 5001);

    let mut on_disk: Vec<String> = expected.iter().map(|(n, _)| n.clone()).collect();
    on_disk.push("r0042.end.json".into());
    on_disk.sort();
    assert_eq!(listing(&cfg.dir), on_disk, "no .inprogress may be left");

    for (name, size) in &expected {
        let data = std::fs::read(cfg.dir.join(name)).expect("read chunk");
        assert_eq!(data.len() as u64, *size, "{name}");
        assert_eq!(first_mismatch(cfg.seed, name, 0, &data), None, "{name}");
    }

    let marker: EndMarker = serde_json::from_slice(
        &std::fs::read(cfg.dir.join("r0042.end.json")).expect("read marker"),
    )
    .expect("parse marker");
    assert_eq!(marker.run, "r0042");
    assert_eq!(marker.seed, 99);
    assert_eq!(marker.bytes, 5001);
    let listed: Vec<(String, u64)> = marker.files.into_iter().map(|f| (f.name, f.size)).collect();
    assert_eq!(listed, expected);

    // The write log covers every file contiguously, one line per write().
    let log = std::fs::read_to_string(&log_path).expect("read write log");
    let mut covered: BTreeMap<String, u64> = BTreeMap::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f.len(), 4, "{line:?}");
        let (offset, len): (u64, u64) = (f[1].parse().unwrap(), f[2].parse().unwrap());
        let nanos: u64 = f[3].parse().unwrap();
        assert!(nanos > 1_600_000_000_000_000_000, "unix nanos: {line:?}");
        assert!((1..=300).contains(&len), "{line:?}");
        let end = covered.entry(f[0].to_string()).or_insert(0);
        assert_eq!(*end, offset, "writes to {} are sequential", f[0]);
        *end += len;
    }
    let covered: Vec<(String, u64)> = covered.into_iter().collect();
    assert_eq!(covered, expected);
}

#[test]
fn events_are_batched_into_writes() {
    let scratch = Scratch::new("events");
    let log_path = scratch.0.join("writes.log");
    let cfg = SimConfig {
        streams: 1,
        frame_bytes: 100,
        events_per_write: 10,
        chunk_bytes: 1 << 20,
        total_bytes: Some(10_000),
        write_log: Some(log_path.clone()),
        ..config(&scratch.0)
    };
    let report = run(&cfg, &AtomicBool::new(false)).expect("run");
    assert_eq!(
        report.files,
        vec![("r0042-s00-c000.xtc2".to_string(), 10_000)]
    );
    let log = std::fs::read_to_string(&log_path).expect("read write log");
    assert_eq!(log.lines().count(), 10);
    assert!(
        log.lines().all(|l| l.split(' ').nth(2) == Some("1000")),
        "{log}"
    );
}

#[test]
fn paced_run_holds_rate_and_duration() {
    let scratch = Scratch::new("paced");
    let cfg = paced_config(&scratch.0);
    let report = run(&cfg, &AtomicBool::new(false)).expect("run");
    let writes = report.bytes / 10;
    // 60 are due; the schedule never runs ahead, and a busy machine may lose a few.
    assert!((30..=60).contains(&writes), "{writes} writes");
    assert!(
        report.elapsed < Duration::from_secs(3),
        "{:?}",
        report.elapsed
    );
}

#[test]
fn fewer_writer_threads_write_the_same_files() {
    let scratch = Scratch::new("threads");
    let one_each = SimConfig {
        dir: scratch.0.join("one-each"),
        streams: 5,
        ..config(&scratch.0)
    };
    let shared = SimConfig {
        dir: scratch.0.join("shared"),
        writer_threads: Some(2),
        write_log: Some(scratch.0.join("shared.log")),
        ..one_each.clone()
    };
    let expected = run(&one_each, &AtomicBool::new(false)).expect("one thread per stream");
    let report = run(&shared, &AtomicBool::new(false)).expect("two writer threads");
    assert_eq!(report.files, expected.files);
    assert_eq!(report.bytes, 5001);
    assert_eq!(listing(&shared.dir), listing(&one_each.dir));
    for (name, size) in &report.files {
        let data = std::fs::read(shared.dir.join(name)).expect("read chunk");
        assert_eq!(data.len() as u64, *size, "{name}");
        assert_eq!(first_mismatch(shared.seed, name, 0, &data), None, "{name}");
    }
    // Every stream's writes are still sequential within its files.
    let log = std::fs::read_to_string(scratch.0.join("shared.log")).expect("read write log");
    let mut covered: BTreeMap<String, u64> = BTreeMap::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let (offset, len): (u64, u64) = (f[1].parse().unwrap(), f[2].parse().unwrap());
        let end = covered.entry(f[0].to_string()).or_insert(0);
        assert_eq!(*end, offset, "writes to {} are sequential", f[0]);
        *end += len;
    }
    assert_eq!(covered.into_iter().collect::<Vec<_>>(), report.files);
}

#[test]
fn a_failing_stream_ends_the_run_and_its_thread_mates_close_their_chunks() {
    let scratch = Scratch::new("thread-mate");
    let cfg = SimConfig {
        writer_threads: Some(1),
        ..config(&scratch.0)
    };
    // Stream 1 cannot open its second chunk: that name is taken.
    std::fs::create_dir_all(&cfg.dir).expect("create data dir");
    std::fs::write(cfg.dir.join("r0042-s01-c001.xtc2"), b"taken").expect("take the name");
    let err = run(&cfg, &AtomicBool::new(false)).expect_err("stream 1 fails");
    let message = format!("{err:#}");
    assert!(
        message.contains("stream 1 of run r0042") && message.contains("already exists"),
        "{message}"
    );
    let names = listing(&cfg.dir);
    assert!(
        !names.iter().any(|n| n.ends_with(".inprogress")),
        "stream 0 shares the failed stream's thread and still renames its chunk: {names:?}"
    );
    assert!(
        names.contains(&"r0042-s00-c000.xtc2".to_string()),
        "{names:?}"
    );
}

#[test]
fn one_writer_thread_keeps_every_streams_schedule() {
    let scratch = Scratch::new("one-writer");
    let cfg = SimConfig {
        streams: 3,
        writer_threads: Some(1),
        ..paced_config(&scratch.0)
    };
    let report = run(&cfg, &AtomicBool::new(false)).expect("run");
    assert_eq!(report.files.len(), 3, "{:?}", report.files);
    let sizes: Vec<u64> = report.files.iter().map(|(_, s)| *s).collect();
    let (least, most) = (sizes.iter().min(), sizes.iter().max());
    // The streams share one schedule; the end can fall between two streams' turns
    // within one tick, so they may differ by that one write and no more.
    assert!(
        matches!((least, most), (Some(l), Some(m)) if m - l <= 10 && *l > 0),
        "{sizes:?}"
    );
}

#[test]
fn bursts_raise_the_rate() {
    let scratch = Scratch::new("burst");
    let cfg = SimConfig {
        streams: 1,
        rate_hz: 100.0,
        frame_bytes: 10,
        chunk_bytes: 1 << 20,
        burst_every: Some(Duration::from_millis(200)),
        burst_len: Some(Duration::from_millis(100)),
        burst_factor: 5.0,
        duration: Some(Duration::from_millis(400)),
        total_bytes: None,
        ..config(&scratch.0)
    };
    let report = run(&cfg, &AtomicBool::new(false)).expect("run");
    let writes = report.bytes / 10;
    // 40 without bursts; 2 x (50 + 10) = 120 with them.
    assert!((70..=121).contains(&writes), "{writes} writes");
}

#[test]
fn stop_flag_ends_an_unbounded_run_cleanly() {
    let scratch = Scratch::new("stop");
    let cfg = SimConfig {
        rate_hz: 1000.0,
        frame_bytes: 64,
        chunk_bytes: 4096,
        duration: None,
        total_bytes: None,
        ..config(&scratch.0)
    };
    let stop = AtomicBool::new(false);
    let report = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(150));
            stop.store(true, Ordering::Relaxed);
        });
        run(&cfg, &stop).expect("run")
    });
    assert!(report.bytes > 0);
    let names = listing(&cfg.dir);
    assert!(
        !names.iter().any(|n| n.ends_with(".inprogress")),
        "{names:?}"
    );
    assert!(names.contains(&"r0042.end.json".to_string()));
    let total: u64 = report.files.iter().map(|(_, s)| s).sum();
    assert_eq!(total, report.bytes);
}

#[test]
fn preset_stop_writes_only_the_marker() {
    let scratch = Scratch::new("prestop");
    let cfg = config(&scratch.0);
    let report = run(&cfg, &AtomicBool::new(true)).expect("run");
    assert!(report.files.is_empty());
    assert_eq!(report.bytes, 0);
    assert_eq!(listing(&cfg.dir), vec!["r0042.end.json".to_string()]);
}

#[test]
fn refuses_to_overwrite_an_earlier_run() {
    let scratch = Scratch::new("again");
    let cfg = config(&scratch.0);
    run(&cfg, &AtomicBool::new(false)).expect("first run");
    let err = run(&cfg, &AtomicBool::new(false)).expect_err("marker exists");
    assert!(format!("{err:#}").contains("r0042.end.json"), "{err:#}");

    std::fs::remove_file(cfg.dir.join("r0042.end.json")).expect("remove marker");
    let err = run(&cfg, &AtomicBool::new(false)).expect_err("chunks exist");
    assert!(format!("{err:#}").contains("already exists"), "{err:#}");
}

#[test]
fn rejects_bad_configs() {
    let scratch = Scratch::new("bad");
    let base = config(&scratch.0);
    let bad = [
        SimConfig {
            streams: 0,
            ..base.clone()
        },
        SimConfig {
            chunk_bytes: 0,
            ..base.clone()
        },
        SimConfig {
            frame_bytes: 0,
            ..base.clone()
        },
        SimConfig {
            writer_threads: Some(0),
            ..base.clone()
        },
        SimConfig {
            rate_hz: -1.0,
            ..base.clone()
        },
        SimConfig {
            run: "a b".into(),
            ..base.clone()
        },
        SimConfig {
            burst_every: Some(Duration::from_secs(1)),
            ..base.clone()
        },
        SimConfig {
            burst_every: Some(Duration::from_secs(1)),
            burst_len: Some(Duration::from_millis(10)),
            burst_factor: 0.0,
            ..base.clone()
        },
    ];
    for cfg in &bad {
        assert!(run(cfg, &AtomicBool::new(false)).is_err(), "{cfg:?}");
    }
    assert!(
        !base.dir.exists(),
        "nothing is created for a rejected config"
    );
}

#[test]
fn config_deserializes_with_defaults() {
    let cfg: SimConfig = serde_json::from_str(r#"{"streams": 2, "run": "r0007"}"#).expect("parse");
    assert_eq!(cfg.streams, 2);
    assert_eq!(cfg.run, "r0007");
    assert_eq!(cfg.chunk_bytes, 64 << 20);
    let back: SimConfig =
        serde_json::from_str(&serde_json::to_string(&cfg).expect("encode")).expect("decode");
    assert_eq!(back.duration, Some(Duration::from_secs(10)));
}
