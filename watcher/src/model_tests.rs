//! Model-based tests of the tailer's file identity and tailing: random
//! sequences of appends, rotations, truncations, deletions, re-creations,
//! renames and watcher restarts, run through the real tailer against fake
//! sinks. Once the source is left alone, the destination must hold every
//! file the source holds, byte for byte, at its current path, and nothing
//! a sink would refuse (mixed bytes within a generation, a wrong seal).

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use manifest_db::WatchState;

use crate::progress::Progress;
use crate::stop::Stop;
use crate::tail::Tailer;
use crate::testkit::{Dest, FakeSinks, Scratch};
use crate::{EventSource, WatchConfig};

/// The names operations pick from; a rotation moves `x` to `x.1`.
const NAMES: [&str; 6] = ["a", "b", "c", "sub/d", "a.1", "b.1"];

/// xorshift64*: reproducible from its seed, which failures print.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a>(&mut self, names: &[&'a str]) -> &'a str {
        names[self.below(names.len() as u64) as usize]
    }

    fn bytes(&mut self, max: u64) -> Vec<u8> {
        let len = 1 + self.below(max) as usize;
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next().to_le_bytes());
        }
        out.truncate(len);
        out
    }
}

/// A tailer on its own thread, fed by fake sinks.
struct Running {
    stop: Arc<Stop>,
    thread: JoinHandle<anyhow::Result<()>>,
    sinks: FakeSinks,
}

fn start(config: &Arc<WatchConfig>, state: &WatchState, dest: &Arc<Mutex<Dest>>) -> Running {
    start_with(config, state, dest, |_| {})
}

/// Starts a tailer after `prepare` had its way with it.
fn start_with(
    config: &Arc<WatchConfig>,
    state: &WatchState,
    dest: &Arc<Mutex<Dest>>,
    prepare: impl FnOnce(&mut Tailer),
) -> Running {
    let (sinks, outboxes, deliveries) = FakeSinks::start(config.sinks.len(), dest.clone());
    let stop = Arc::new(Stop::default());
    let mut tailer = Tailer::new(
        config.clone(),
        state.clone(),
        Vec::new(),
        outboxes,
        deliveries,
        Arc::new(Progress::default()),
        stop.clone(),
    )
    .expect("start a tailer");
    prepare(&mut tailer);
    let thread = std::thread::spawn(move || tailer.run());
    Running {
        stop,
        thread,
        sinks,
    }
}

impl Running {
    fn stop(self) {
        self.stop.request();
        let result = self.thread.join().expect("the tailer thread panicked");
        result.expect("the tailer failed");
        self.sinks.join();
    }
}

fn config(root: &Path, seal: bool) -> Arc<WatchConfig> {
    Arc::new(WatchConfig {
        root: root.to_owned(),
        source: "model".into(),
        sinks: vec!["one".into(), "two".into()],
        rescan_every: Duration::from_millis(100),
        batch_bytes: 16 << 10,
        max_row_bytes: 4 << 10,
        seal,
        seal_idle: Duration::from_millis(20),
        ..WatchConfig::default()
    })
}

fn write_new(path: &Path, data: &[u8]) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("create a source dir");
    }
    std::fs::write(path, data).expect("write a source file");
}

fn append(path: &Path, data: &[u8]) {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).expect("create a source dir");
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open a source file");
    file.write_all(data).expect("append to a source file");
}

/// Applies one random operation to the source tree; returns its name for
/// the failure report. Restarts are done by the caller.
fn operate(rng: &mut Rng, root: &Path) -> String {
    let name = rng.pick(&NAMES);
    let path = root.join(name);
    match rng.below(10) {
        0..=2 => {
            let data = rng.bytes(20_000);
            append(&path, &data);
            format!("append {name} {}", data.len())
        }
        3 => {
            let rotated = root.join(format!("{name}.1"));
            if std::fs::rename(&path, &rotated).is_ok() {
                write_new(&path, &rng.bytes(3_000));
            }
            format!("rotate {name}")
        }
        4 => {
            if path.exists() {
                // Shorter than before most of the time, sometimes longer.
                write_new(&path, &rng.bytes(8_000));
            }
            format!("truncate {name}")
        }
        5 => {
            let _ = std::fs::remove_file(&path);
            format!("delete {name}")
        }
        6 => {
            let _ = std::fs::remove_file(&path);
            write_new(&path, &rng.bytes(6_000));
            format!("recreate {name}")
        }
        7 => {
            let to = rng.pick(&NAMES);
            let target = root.join(to);
            if let Some(dir) = target.parent() {
                std::fs::create_dir_all(dir).expect("create a source dir");
            }
            let _ = std::fs::rename(&path, &target);
            format!("rename {name} {to}")
        }
        _ => {
            let pause = rng.below(30);
            std::thread::sleep(Duration::from_millis(pause));
            format!("pause {pause}")
        }
    }
}

/// Every regular file under `root`, relative path and content.
fn source_files(root: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut dirs = vec![String::new()];
    while let Some(rel) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&rel)) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            match entry.file_type() {
                Ok(kind) if kind.is_dir() => dirs.push(path),
                Ok(kind) if kind.is_file() => {
                    let data = std::fs::read(root.join(&path)).expect("read a source file");
                    out.push((path, data));
                }
                _ => {}
            }
        }
    }
    out.sort();
    out
}

/// What the destination still lacks of the source, if anything.
fn missing(dest: &Dest, files: &[(String, Vec<u8>)]) -> Vec<String> {
    files
        .iter()
        .filter(|(path, data)| !dest.holds(path, data))
        .map(|(path, data)| format!("{path} ({} bytes)", data.len()))
        .collect()
}

fn run_model(seed: u64, steps: usize, seal: bool, restarts: bool) {
    run_model_with(seed, steps, seal, restarts, EventSource::Inotify);
}

fn run_model_with(seed: u64, steps: usize, seal: bool, restarts: bool, events: EventSource) {
    let scratch = Scratch::new(&format!("model-{seed}"));
    let root = scratch.path().join("src");
    std::fs::create_dir_all(&root).expect("create the source root");
    let config = Arc::new(WatchConfig {
        events,
        ..(*config(&root, seal)).clone()
    });
    let state = WatchState::open(&scratch.path().join("state")).expect("open the watch state");
    let dest = Arc::new(Mutex::new(Dest::default()));
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut log = Vec::new();
    let mut running = start(&config, &state, &dest);
    for _ in 0..steps {
        if restarts && rng.below(25) == 0 {
            running.stop();
            running = start(&config, &state, &dest);
            log.push("restart".to_owned());
        } else {
            log.push(operate(&mut rng, &root));
        }
    }
    let files = source_files(&root);
    let mut lacking = Vec::new();
    // Bounded: the tailer converges in a fraction of this.
    for _ in 0..600 {
        lacking = missing(&dest.lock().unwrap_or_else(|p| p.into_inner()), &files);
        if lacking.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    running.stop();
    let dest = dest.lock().unwrap_or_else(|p| p.into_inner());
    let held: Vec<String> = dest
        .files
        .iter()
        .map(|((key, generation), f)| {
            format!(
                "{key}#{generation} at {} placed {:?} sealed {:?}",
                f.path,
                f.placed.ranges(),
                f.seal.as_ref().map(|(size, _)| size)
            )
        })
        .collect();
    assert!(
        dest.violations.is_empty() && lacking.is_empty(),
        "seed {seed}: violations {:?}; the destination lacks {lacking:?}\noperations: {log:?}\nheld: {held:?}",
        dest.violations
    );
}

#[test]
fn random_histories_arrive_whole_without_seals() {
    for seed in 1..=10 {
        run_model(seed, 80, false, false);
    }
}

#[test]
fn random_histories_arrive_whole_and_sealed_right() {
    for seed in 101..=110 {
        run_model(seed, 80, true, false);
    }
}

/// Polling instead of inotify: the tailer hears of nothing and must find
/// every change by statting its files and walking the tree.
#[test]
fn random_histories_arrive_whole_when_polling() {
    for seed in 301..=306 {
        run_model_with(seed, 60, true, false, EventSource::Poll);
    }
}

/// fanotify instead of inotify (inotify where the process lacks
/// CAP_SYS_ADMIN: the same histories must arrive whole either way).
#[test]
fn random_histories_arrive_whole_with_fanotify() {
    for seed in 401..=404 {
        run_model_with(seed, 60, true, false, EventSource::Fanotify);
    }
}

/// Restarts of the watcher between operations. Ignored: it fails on a
/// defect found with it and not fixed yet. The checkpoint keeps one record
/// per file key, but after a rotation two generations of one key are
/// tracked at once (the old one renamed away, the new one at the path), and
/// whichever is saved last hides the other. A restarted watcher may then
/// give a new file a generation number the sink already holds with other
/// bytes (see `a_restart_does_not_reuse_a_generation`).
#[test]
#[ignore = "a generation can be reused after a restart; see the comment"]
fn random_histories_with_restarts_arrive_whole() {
    for seed in 201..=210 {
        run_model(seed, 80, true, true);
    }
}

/// The defect above, step by step. Ignored until it is fixed.
#[test]
#[ignore = "a generation can be reused after a restart; see random_histories_with_restarts_arrive_whole"]
fn a_restart_does_not_reuse_a_generation() {
    let scratch = Scratch::new("generation-reuse");
    let root = scratch.path().join("src");
    std::fs::create_dir_all(&root).expect("create the source root");
    let config = config(&root, false);
    let state = WatchState::open(&scratch.path().join("state")).expect("open the watch state");
    let dest = Arc::new(Mutex::new(Dest::default()));
    let mut rng = Rng(11);
    let running = start(&config, &state, &dest);
    let first = rng.bytes(5_000);
    write_new(&root.join("x"), &first);
    wait_until_held(&dest, "x", &first);
    // Rotation: generation 1 of key "x" moves to x.1, generation 2 starts at x.
    std::fs::rename(root.join("x"), root.join("x.1")).expect("rotate");
    let second = rng.bytes(5_000);
    write_new(&root.join("x"), &second);
    wait_until_held(&dest, "x", &second);
    std::fs::remove_file(root.join("x")).expect("delete");
    // Let a checkpoint record the deletion before generation 1 changes again.
    std::thread::sleep(Duration::from_millis(500));
    let more = rng.bytes(5_000);
    append(&root.join("x.1"), &more);
    wait_until_held(&dest, "x.1", &[first, more].concat());
    running.stop();
    let running = start(&config, &state, &dest);
    let third = rng.bytes(5_000);
    write_new(&root.join("x"), &third);
    for _ in 0..100 {
        if dest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .holds("x", &third)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    running.stop();
    let dest = dest.lock().unwrap_or_else(|p| p.into_inner());
    assert!(dest.violations.is_empty(), "{:?}", dest.violations);
    assert!(dest.holds("x", &third));
}

/// A file resumed from the checkpoint has no running digest: its seal is
/// hashed by the seal hasher, and must still match the bytes sent.
#[test]
fn a_resumed_file_is_sealed_with_the_digest_of_all_its_bytes() {
    let scratch = Scratch::new("resumed-seal");
    let root = scratch.path().join("src");
    std::fs::create_dir_all(&root).expect("create the source root");
    let config = config(&root, true);
    let state = WatchState::open(&scratch.path().join("state")).expect("open the watch state");
    let dest = Arc::new(Mutex::new(Dest::default()));
    let path = root.join("run.dat.inprogress");
    let mut rng = Rng(7);
    let first = rng.bytes(50_000);
    append(&path, &first);
    let running = start(&config, &state, &dest);
    wait_until_held(&dest, "run.dat.inprogress", &first);
    running.stop();
    let more = rng.bytes(50_000);
    append(&path, &more);
    let running = start(&config, &state, &dest);
    // Renaming away from the in-progress suffix asks for the seal at once.
    std::fs::rename(&path, root.join("run.dat")).expect("rename");
    let whole = [first, more].concat();
    let mut sealed = None;
    for _ in 0..600 {
        sealed = {
            let dest = dest.lock().unwrap_or_else(|p| p.into_inner());
            dest.files
                .values()
                .find(|f| f.path == "run.dat")
                .and_then(|f| f.seal.clone())
        };
        if sealed.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    running.stop();
    let dest = dest.lock().unwrap_or_else(|p| p.into_inner());
    assert!(dest.violations.is_empty(), "{:?}", dest.violations);
    assert!(dest.holds("run.dat", &whole));
    assert_eq!(sealed.map(|(size, _)| size), Some(whole.len() as u64));
}

fn wait_until_held(dest: &Arc<Mutex<Dest>>, path: &str, content: &[u8]) {
    for _ in 0..600 {
        if dest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .holds(path, content)
        {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("the destination never held {path}");
}

/// While a seal's digest is being read from disk, the other files are
/// still tailed: the digest is the seal hasher's work, not the tailer's.
#[test]
fn tailing_goes_on_while_a_seal_is_being_hashed() {
    let scratch = Scratch::new("seal-off-thread");
    let root = scratch.path().join("src");
    std::fs::create_dir_all(&root).expect("create the source root");
    let config = config(&root, true);
    let state = WatchState::open(&scratch.path().join("state")).expect("open the watch state");
    let dest = Arc::new(Mutex::new(Dest::default()));
    let mut rng = Rng(13);
    let big = rng.bytes(300_000);
    append(&root.join("big.inprogress"), &big);
    let running = start(&config, &state, &dest);
    wait_until_held(&dest, "big.inprogress", &big);
    running.stop();
    // Resumed from the checkpoint, the file has no running digest: its
    // seal needs the hasher, which is held back.
    let (release, gate) = std::sync::mpsc::channel();
    let running = start_with(&config, &state, &dest, |tailer| {
        tailer
            .hold_seal_hashing(gate)
            .expect("start a held seal hasher")
    });
    std::fs::rename(root.join("big.inprogress"), root.join("big")).expect("rename");
    let other = rng.bytes(20_000);
    append(&root.join("other"), &other);
    wait_until_held(&dest, "other", &other);
    let sealed = |dest: &Arc<Mutex<Dest>>| {
        let dest = dest.lock().unwrap_or_else(|p| p.into_inner());
        dest.files
            .values()
            .find(|f| f.path == "big")
            .and_then(|f| f.seal.clone())
    };
    assert_eq!(sealed(&dest), None, "sealed without the hasher's digest");
    release.send(()).expect("release the seal hasher");
    let mut seal = None;
    for _ in 0..600 {
        seal = sealed(&dest);
        if seal.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(release);
    running.stop();
    let dest = dest.lock().unwrap_or_else(|p| p.into_inner());
    assert!(dest.violations.is_empty(), "{:?}", dest.violations);
    assert_eq!(seal.map(|(size, _)| size), Some(big.len() as u64));
}

/// A file renamed while its seal is on its way must still be renamed at
/// the sink: the rename waits for the seal's acknowledgement and must not
/// be forgotten with the file when that arrives.
#[test]
fn a_rename_during_an_unacknowledged_seal_reaches_the_sink() {
    let scratch = Scratch::new("rename-during-seal");
    let root = scratch.path().join("src");
    std::fs::create_dir_all(&root).expect("create the source root");
    let config = config(&root, true);
    let state = WatchState::open(&scratch.path().join("state")).expect("open the watch state");
    let dest = Arc::new(Mutex::new(Dest::default()));
    dest.lock()
        .unwrap_or_else(|p| p.into_inner())
        .hold_seal_acks = true;
    let content = Rng(17).bytes(10_000);
    let running = start(&config, &state, &dest);
    write_new(&root.join("x"), &content);
    let mut seal_arrived = false;
    for _ in 0..600 {
        let held = dest.lock().unwrap_or_else(|p| p.into_inner());
        if held
            .files
            .values()
            .any(|f| f.path == "x" && f.seal.is_some())
        {
            seal_arrived = true;
            break;
        }
        drop(held);
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(seal_arrived, "the seal never reached the sink");
    std::fs::rename(root.join("x"), root.join("y")).expect("rename");
    // Gives the tailer time to hear of the rename before the seal's
    // acknowledgement; the outcome must be the same either way.
    std::thread::sleep(Duration::from_millis(300));
    dest.lock()
        .unwrap_or_else(|p| p.into_inner())
        .hold_seal_acks = false;
    let mut renamed = false;
    for _ in 0..200 {
        if dest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .holds("y", &content)
        {
            renamed = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    running.stop();
    let dest = dest.lock().unwrap_or_else(|p| p.into_inner());
    assert!(dest.violations.is_empty(), "{:?}", dest.violations);
    assert!(
        renamed,
        "the sink never heard of the rename: {:?}",
        dest.files
    );
}
