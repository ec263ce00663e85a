//! Shared harness of the end-to-end tests: runs `tailflight` subcommands as
//! separate processes on loopback, in a scratch folder per test.

#![allow(dead_code)]

pub mod browser;
pub mod etcd;
pub mod fleet;
pub mod kafka;
pub mod netns;
pub mod prometheus;
pub mod tmux;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The binary under test: the one Cargo built, or `TAILFLIGHT_BIN` (a
/// copy that later builds do not replace, for runs of the tests in a loop
/// while work goes on).
pub fn bin() -> PathBuf {
    std::env::var_os("TAILFLIGHT_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_tailflight")),
        PathBuf::from,
    )
}

/// A scratch folder for one test, emptied at creation and removed when dropped.
///
/// A failing test keeps its folder (logs, source, destination) for inspection;
/// `TAILFLIGHT_KEEP_TEST_DIR=1` keeps every folder. Without this, a full suite
/// run leaves gigabytes behind and the next step on a small CI disk fails.
pub struct Scratch(PathBuf);

pub fn scratch(name: &str) -> Scratch {
    let base = std::env::var_os("TAILFLIGHT_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let dir = base.join(format!("tailflight-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    Scratch(dir)
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("test folder kept: {}", self.0.display());
        } else if std::env::var_os("TAILFLIGHT_KEEP_TEST_DIR").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A loopback port free now and never handed out before by this test
/// process. Tests of one binary run side by side: a broker stopped for an
/// outage must find its ports again when it restarts, and the kernel hands
/// a released port to the next caller readily.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if GIVEN
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .insert(port)
        {
            return port;
        }
    }
}

/// A child process that is killed when dropped. Its stderr goes to `<dir>/<name>.log`.
pub struct Proc {
    pub name: String,
    child: Option<Child>,
    args: Vec<String>,
    /// Runs the binary through this command (e.g. `ip netns exec NS`).
    prefix: Vec<String>,
    /// Environment variables set for it (secrets that flags do not carry).
    env: Vec<(String, String)>,
    log: PathBuf,
}

impl Proc {
    pub fn spawn(dir: &Path, name: &str, args: &[String]) -> Self {
        Self::spawn_through(dir, name, &[], args)
    }

    /// [`Self::spawn`] through `prefix` (`ip netns exec NS`).
    pub fn spawn_through(dir: &Path, name: &str, prefix: &[String], args: &[String]) -> Self {
        Self::spawn_with_env(dir, name, prefix, args, &[])
    }

    /// [`Self::spawn_through`] with environment variables `env` set.
    pub fn spawn_with_env(
        dir: &Path,
        name: &str,
        prefix: &[String],
        args: &[String],
        env: &[(&str, &str)],
    ) -> Self {
        let log = dir.join(format!("{name}.log"));
        let mut proc = Self {
            name: name.into(),
            child: None,
            args: args.to_vec(),
            prefix: prefix.to_vec(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            log,
        };
        proc.start();
        proc
    }

    pub fn args(&self) -> &[String] {
        &self.args
    }

    /// Starts again with other arguments (a new address).
    pub fn start_with(&mut self, args: &[String]) {
        self.args = args.to_vec();
        self.start();
    }

    /// (Re)starts the process with the same arguments.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "{} is already running", self.name);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut command = match self.prefix.split_first() {
            Some((program, prefix)) => {
                let mut command = Command::new(program);
                command.args(prefix).arg(bin());
                command
            }
            None => Command::new(bin()),
        };
        let child = command
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env(
                "TAILFLIGHT_LOG",
                std::env::var("TAILFLIGHT_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.name));
        self.child = Some(child);
    }

    /// SIGKILL, no chance to clean up.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            unsafe {
                libc::kill(child.id() as i32, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The running process's id, to signal it directly.
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|child| child.id() as i32)
    }

    /// Waits until the process exits by itself (a simulator's run).
    pub fn wait_for_exit(&mut self, timeout: Duration) {
        let name = self.name.clone();
        wait_until(&format!("{name} to exit"), timeout, || !self.is_running());
    }

    pub fn is_running(&mut self) -> bool {
        match &mut self.child {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `sink` with its root and state under `dir`, listening on loopback
/// `port`, then `extra`: the command line of a sink run on its own.
pub fn sink_command(dir: &Path, port: u16, extra: &[&str]) -> Vec<String> {
    let mut args = strings(&["sink", "--root"]);
    args.push(dir.join("dest").display().to_string());
    args.push("--state".into());
    args.push(dir.join("state").display().to_string());
    args.push("--listen".into());
    args.push(format!("127.0.0.1:{port}"));
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Polls `condition` until it holds; panics naming `what` after `timeout`.
/// Timeouts here only stop a hung test: they are far above what any run needs.
pub fn wait_until(what: &str, timeout: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if condition() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out after {timeout:?} waiting for: {what}");
}

/// Runs a `tailflight` subcommand to completion; returns (success, stdout+stderr).
pub fn run(args: &[String]) -> (bool, String) {
    let output = Command::new(bin())
        .args(args)
        .env("TAILFLIGHT_LOG", "warn")
        .output()
        .expect("run tailflight");
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

pub fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// The sink's status counters, or None if it does not answer.
pub fn sink_status(endpoint: &str, tls: &[String]) -> Option<serde_json::Value> {
    let mut args = strings(&["status", "--to", endpoint]);
    args.extend_from_slice(tls);
    let (ok, text) = run(&args);
    if !ok {
        return None;
    }
    let start = text.find('{')?;
    serde_json::from_str(text[start..].lines().next()?).ok()
}

pub fn status_u64(status: &serde_json::Value, field: &str) -> u64 {
    status.get(field).and_then(|v| v.as_u64()).unwrap_or(0)
}

/// Whether `verify SRC DEST` reports identical trees.
pub fn verify(src: &Path, dest: &Path) -> (bool, String) {
    run(&[
        "verify".into(),
        src.display().to_string(),
        dest.display().to_string(),
    ])
}

/// Audits a stopped sink's manifest.
pub fn audit(state: &Path) -> serde_json::Value {
    let (ok, text) = run(&[
        "audit".into(),
        "--state".into(),
        state.display().to_string(),
    ]);
    let start = text
        .find('{')
        .unwrap_or_else(|| panic!("audit printed no JSON: {text}"));
    let value: serde_json::Value = serde_json::from_str(&text[start..])
        .unwrap_or_else(|e| panic!("audit output: {e}: {text}"));
    assert!(ok, "audit failed: {text}");
    value
}

/// Audits a stopped sink's manifest and asserts exactly-once placement: no
/// range recorded twice, every record matching its audit log.
pub fn assert_clean_audit(state: &Path) -> serde_json::Value {
    let report = audit(state);
    println!("audit: {report}");
    assert_eq!(
        report["overlapping_placements"], 0,
        "a range was recorded twice: {report}"
    );
    assert_eq!(
        report["record_mismatches"], 0,
        "records disagree with the audit log: {report}"
    );
    report
}

/// A test that cannot run on this machine (it needs root, say): says so
/// where a reader of the output sees it, past the harness's capture of
/// `println!`, or fails where every test must run (`TAILFLIGHT_NO_SKIPS`,
/// which `ops/test.sh` sets when it runs as root, as CI does).
pub fn cannot_run(why: &str) {
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    assert!(
        std::env::var_os("TAILFLIGHT_NO_SKIPS").is_none(),
        "{test} cannot run: {why}; TAILFLIGHT_NO_SKIPS says every test must run here"
    );
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// The mark a sink keeps in its root (which root its manifest was written
/// with): the sink's own, not a file anyone sent.
pub const ROOT_MARK: &str = ".tailflight-root-id";

/// Every regular file under `dir` (relative paths), sorted, a sink root's
/// mark left out.
pub fn list_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if entry.file_name() != ROOT_MARK {
                out.push(path.strip_prefix(dir).unwrap().display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// A sink and a watcher as separate processes, over loopback.
pub struct Pipeline {
    pub dir: PathBuf,
    pub source: PathBuf,
    pub dest_root: PathBuf,
    pub sink_state: PathBuf,
    pub watch_state: PathBuf,
    pub endpoint: String,
    pub sink: Proc,
    pub watcher: Proc,
    pub client_tls: Vec<String>,
    /// Set by [`Pipeline::in_scratch`]; last, so the processes stop before it is removed.
    scratch: Option<Scratch>,
}

#[derive(Default, Clone)]
pub struct PipelineOptions {
    pub mtls: bool,
    pub poll: bool,
    pub extra_watch_args: Vec<String>,
    pub extra_sink_args: Vec<String>,
    /// Run the sink in this network namespace, listening on its address.
    pub sink_netns: Option<(String, String)>,
}

impl Pipeline {
    pub fn start(dir: &Path, options: PipelineOptions) -> Self {
        let source = dir.join("source");
        let dest_root = dir.join("dest");
        std::fs::create_dir_all(&source).unwrap();
        let port = free_port();
        let (host, sink_prefix) = match &options.sink_netns {
            Some((ns, address)) => (
                address.clone(),
                strings(&["ip", "netns", "exec", ns.as_str()]),
            ),
            None => ("127.0.0.1".to_string(), Vec::new()),
        };
        let mut sink_args = strings(&["sink", "--listen", &format!("{host}:{port}")]);
        sink_args.extend(["--root".into(), dest_root.display().to_string()]);
        sink_args.extend([
            "--state".into(),
            dir.join("sink-state").display().to_string(),
        ]);
        let mut client_tls = Vec::new();
        let scheme = if options.mtls {
            let certs = dir.join("certs");
            let (ok, text) = run(&["certs".into(), "--out".into(), certs.display().to_string()]);
            assert!(ok, "certs: {text}");
            let c = |f: &str| certs.join(f).display().to_string();
            sink_args.extend([
                "--tls-cert".into(),
                c("server.pem"),
                "--tls-key".into(),
                c("server.key"),
            ]);
            sink_args.extend(["--client-ca".into(), c("ca.pem")]);
            client_tls = vec![
                "--tls-ca".into(),
                c("ca.pem"),
                "--tls-cert".into(),
                c("client.pem"),
                "--tls-key".into(),
                c("client.key"),
            ];
            "https"
        } else {
            "http"
        };
        let endpoint = format!("{scheme}://{host}:{port}");
        sink_args.extend(options.extra_sink_args.iter().cloned());
        let sink = Proc::spawn_through(dir, "sink", &sink_prefix, &sink_args);
        let mut watch_args = strings(&[
            "watch",
            "--source",
            "src",
            "--seal-idle",
            "1s",
            "--rescan",
            "1s",
        ]);
        watch_args.extend(["--dir".into(), source.display().to_string()]);
        watch_args.extend(["--to".into(), endpoint.clone()]);
        watch_args.extend([
            "--state".into(),
            dir.join("watch-state").display().to_string(),
        ]);
        watch_args.extend(client_tls.iter().cloned());
        if options.poll {
            watch_args.push("--poll".into());
        }
        watch_args.extend(options.extra_watch_args.iter().cloned());
        let watcher = Proc::spawn(dir, "watcher", &watch_args);
        Self {
            dir: dir.to_path_buf(),
            dest_root: dest_root.clone(),
            source,
            sink_state: dir.join("sink-state"),
            watch_state: dir.join("watch-state"),
            endpoint,
            sink,
            watcher,
            client_tls,
            scratch: None,
        }
    }

    /// A pipeline in a scratch folder of its own, removed with the pipeline.
    pub fn in_scratch(name: &str, options: PipelineOptions) -> Self {
        let dir = scratch(name);
        let mut pipeline = Self::start(&dir, options);
        pipeline.scratch = Some(dir);
        pipeline
    }

    /// Where this pipeline's files land.
    pub fn dest(&self) -> PathBuf {
        self.dest_root.join("src")
    }

    pub fn status(&self) -> Option<serde_json::Value> {
        sink_status(&self.endpoint, &self.client_tls)
    }

    /// Waits until the destination is identical to the source.
    pub fn wait_identical(&self, timeout: Duration) {
        let mut last = String::new();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let (ok, text) = verify(&self.source, &self.dest());
            if ok {
                return;
            }
            last = text;
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!(
            "destination never became identical: {last}\n--- sink log ---\n{}\n--- watcher log ---\n{}",
            tail(&self.sink.log_text()),
            tail(&self.watcher.log_text())
        );
    }

    /// Ends a run of the simulator and checks it: every file of `run`
    /// sealed, the destination identical, and after both processes stop,
    /// no range recorded twice (a clean audit).
    pub fn finish_run(&mut self, sim: &mut Proc, run: &str) {
        sim.stop();
        let files = files_of_run(&self.source, run);
        self.wait_sealed(files, Duration::from_secs(180));
        self.wait_identical(Duration::from_secs(120));
        self.watcher.stop();
        self.sink.stop();
        assert_clean_audit(&self.sink_state);
    }

    /// Waits until the sink has sealed `count` files.
    pub fn wait_sealed(&self, count: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut last = None;
        while Instant::now() < deadline {
            if let Some(status) = self.status() {
                if status_u64(&status, "sealed_files") >= count {
                    return;
                }
                last = Some(status);
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!(
            "sink never sealed {count} files (last status {last:?})\n--- sink log ---\n{}\n--- watcher log ---\n{}",
            tail(&self.sink.log_text()),
            tail(&self.watcher.log_text())
        );
    }
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// The simulator arguments of the small DAQ-like workload the tests share:
/// 16 KiB frames at 100 Hz per stream, rotated into chunks.
pub fn workload<'a>(
    run: &'a str,
    streams: &'a str,
    chunk: &'a str,
    duration: &'a str,
) -> [&'a str; 12] {
    [
        "--run",
        run,
        "--streams",
        streams,
        "--rate",
        "100",
        "--frame",
        "16KiB",
        "--chunk",
        chunk,
        "--duration",
        duration,
    ]
}

/// Runs the simulator to completion into `dir`.
pub fn simulate(dir: &Path, extra: &[&str]) {
    let mut args = strings(&["sim", "--dir"]);
    args.push(dir.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    let (ok, text) = run(&args);
    assert!(ok, "sim failed: {text}");
}

/// Starts the simulator in the background.
pub fn simulate_in_background(test_dir: &Path, dir: &Path, extra: &[&str]) -> Proc {
    let mut args = strings(&["sim", "--dir"]);
    args.push(dir.display().to_string());
    args.extend(extra.iter().map(|s| s.to_string()));
    Proc::spawn(test_dir, "sim", &args)
}

/// Number of files the simulator's end marker lists, plus the marker itself.
pub fn files_of_run(dir: &Path, run: &str) -> u64 {
    let text = std::fs::read_to_string(dir.join(format!("{run}.end.json"))).expect("end marker");
    let marker: serde_json::Value = serde_json::from_str(&text).expect("end marker JSON");
    marker["files"].as_array().map_or(0, |f| f.len() as u64) + 1
}

/// The sink arguments that make it write its commit feed to `path` (see
/// [`assert_feed_told_each_byte_once`]).
pub fn feed_log_args(path: &Path) -> Vec<String> {
    vec!["--feed-log".into(), path.display().to_string()]
}

/// Reads a sink's `--feed-log` and the audit of its stopped manifest, and
/// asserts that the commit feed told each durable byte exactly once: in
/// every run of the sink (from one start line to the next), no range twice
/// and none that was durable when the run started; at the end, per file,
/// exactly what the manifest holds. Returns the rounds read.
pub fn assert_feed_told_each_byte_once(feed_log: &Path, state: &Path) -> usize {
    type Key = (String, String, u64);
    let key_of = |id: &serde_json::Value| -> Key {
        (
            id["source"].as_str().unwrap_or_default().to_owned(),
            id["key"].as_str().unwrap_or_default().to_owned(),
            id["generation"].as_u64().unwrap_or_default(),
        )
    };
    let ranges_of = |ranges: &serde_json::Value| -> Vec<(u64, u64)> {
        ranges
            .as_array()
            .map(|all| {
                all.iter()
                    .map(|r| (r[0].as_u64().unwrap(), r[1].as_u64().unwrap()))
                    .collect()
            })
            .unwrap_or_default()
    };
    let text = std::fs::read_to_string(feed_log)
        .unwrap_or_else(|e| panic!("cannot read the feed log {}: {e}", feed_log.display()));
    let lines: Vec<&str> = text.lines().collect();
    let mut told: std::collections::HashMap<Key, manifest_db::IntervalSet> = Default::default();
    let (mut runs, mut rounds, mut start_sequence) = (0, 0, 0);
    for (number, line) in lines.iter().enumerate() {
        let value: serde_json::Value = match serde_json::from_str(line) {
            Ok(value) => value,
            Err(error) => {
                // A kill may cut a run's last line short, nothing else.
                let ends_a_run = lines
                    .get(number + 1)
                    .is_none_or(|next| next.starts_with("{\"start\""));
                assert!(ends_a_run, "feed log line {number}: {error}: {line}");
                continue;
            }
        };
        if let Some(files) = value.get("start") {
            runs += 1;
            told.clear();
            start_sequence = value["sequence"].as_u64().unwrap_or_default();
            for file in files.as_array().expect("start lists files") {
                let ranges = ranges_of(&file["ranges"]);
                told.insert(
                    key_of(&file["id"]),
                    manifest_db::IntervalSet::from_ranges(ranges),
                );
            }
            continue;
        }
        assert!(
            value.get("missed").is_none(),
            "the feed log's listener fell behind and missed rounds: {line}"
        );
        let sequence = value["sequence"].as_u64().unwrap_or_default();
        assert!(
            sequence > start_sequence,
            "run {runs}: round {sequence} is already in the start line (up to {start_sequence})"
        );
        rounds += 1;
        for file in value["files"].as_array().expect("a round lists files") {
            let key = key_of(&file["id"]);
            let set = told.entry(key.clone()).or_default();
            for (start, end) in ranges_of(&file["ranges"]) {
                assert_eq!(
                    set.missing(start, end),
                    vec![(start, end)],
                    "run {runs}: the feed told {key:?} {start}..{end} again"
                );
                set.insert(start, end);
            }
        }
    }
    assert!(runs > 0, "the feed log has no start line");
    let (ok, text) = run(&[
        "audit".into(),
        "--files".into(),
        "--state".into(),
        state.display().to_string(),
    ]);
    assert!(ok, "audit failed: {text}");
    let report: serde_json::Value =
        serde_json::from_str(&text[text.find('{').expect("audit printed JSON")..])
            .expect("audit JSON");
    let mut held = 0;
    for pair in report["records"]
        .as_array()
        .expect("audit --files lists records")
    {
        let key = key_of(&pair[0]);
        let placed = ranges_of(&pair[1]["placed"]["ranges"]);
        if placed.is_empty() {
            continue;
        }
        held += 1;
        let said = told.remove(&key).unwrap_or_default();
        assert_eq!(
            said.ranges(),
            placed.as_slice(),
            "{key:?}: the feed told other ranges than the manifest holds"
        );
    }
    told.retain(|_, set| !set.is_empty());
    assert!(
        told.is_empty(),
        "the feed told ranges of files the manifest does not hold: {told:?}"
    );
    println!("feed log: {runs} runs, {rounds} rounds, {held} files told exactly once");
    rounds
}

/// A reader of the destination in the spirit of psana2's live mode: it
/// reads every destination file while it grows, up to its current size
/// (`fstat`, then `pread`; a short read means "wait"), following each file
/// by its inode across renames, and compares every byte it reads with the
/// source file at the same offset. A thread of the test process, so it
/// lives through `kill -9` of the sink and the watcher.
pub struct LiveReader {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<LiveReport>>,
}

/// What a [`LiveReader`] saw.
#[derive(Debug, Default)]
pub struct LiveReport {
    /// Bytes read at the destination and compared with the source.
    pub bytes_checked: u64,
    /// Of those, bytes read while the file still had its in-progress name.
    pub bytes_checked_growing: u64,
    /// Bytes that differed from the source, and how many of them were zeros.
    pub mismatched: u64,
    pub mismatched_zeros: u64,
    /// The first few differences: file, offset, read, expected.
    pub examples: Vec<String>,
    /// Times a file was found shorter than what was already read of it.
    pub shrinks: u64,
}

impl LiveReader {
    /// Reads the files under `dest` (paths as under `source`) until finished.
    pub fn start(source: &Path, dest: &Path) -> Self {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (source, dest, stopping) = (source.to_owned(), dest.to_owned(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut reading = LiveReading::default();
            loop {
                let last = stopping.load(std::sync::atomic::Ordering::Relaxed);
                reading.poll(&source, &dest);
                if last {
                    return reading.report;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Reads once more to the end of every file, then reports.
    pub fn finish(mut self) -> LiveReport {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread
            .take()
            .expect("finished once")
            .join()
            .expect("the live reader panicked")
    }
}

impl Drop for LiveReader {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[derive(Default)]
struct LiveReading {
    /// Per (device, inode): the open file and how far it was read.
    files: std::collections::HashMap<(u64, u64), (std::fs::File, u64)>,
    report: LiveReport,
}

impl LiveReading {
    fn poll(&mut self, source: &Path, dest: &Path) {
        for relative in list_files(dest) {
            self.read_file(source, dest, &relative);
        }
    }

    fn read_file(&mut self, source: &Path, dest: &Path, relative: &str) {
        use std::os::unix::fs::{FileExt, MetadataExt};
        let Ok(meta) = std::fs::metadata(dest.join(relative)) else {
            return;
        };
        let id = (meta.dev(), meta.ino());
        let (file, offset) = match self.files.entry(id) {
            std::collections::hash_map::Entry::Occupied(known) => known.into_mut(),
            std::collections::hash_map::Entry::Vacant(new) => {
                let Ok(file) = std::fs::File::open(dest.join(relative)) else {
                    return;
                };
                new.insert((file, 0))
            }
        };
        let Ok(size) = file.metadata().map(|m| m.len()) else {
            return;
        };
        if size < *offset {
            self.report.shrinks += 1;
            *offset = size;
            return;
        }
        if size == *offset {
            return;
        }
        let mut read = vec![0u8; (size - *offset).min(4 << 20) as usize];
        let Ok(got) = file.read_at(&mut read, *offset) else {
            return;
        };
        read.truncate(got);
        // The source file under either name: it may be renamed meanwhile.
        let plain = relative.strip_suffix(".inprogress").unwrap_or(relative);
        let candidates = [
            relative.to_owned(),
            plain.to_owned(),
            format!("{plain}.inprogress"),
        ];
        let expected = candidates.iter().find_map(|name| {
            let file = std::fs::File::open(source.join(name)).ok()?;
            let mut expected = vec![0u8; read.len()];
            let n = file.read_at(&mut expected, *offset).ok()?;
            (n == read.len()).then_some(expected)
        });
        let Some(expected) = expected else {
            // Not findable at the source now (renamed in between): next poll.
            return;
        };
        for (i, (got, want)) in read.iter().zip(&expected).enumerate() {
            if got != want {
                self.report.mismatched += 1;
                if *got == 0 {
                    self.report.mismatched_zeros += 1;
                }
                if self.report.examples.len() < 10 {
                    self.report.examples.push(format!(
                        "{relative} at {}: read {got}, the source has {want}",
                        *offset + i as u64
                    ));
                }
            }
        }
        self.report.bytes_checked += read.len() as u64;
        if relative.ends_with(".inprogress") {
            self.report.bytes_checked_growing += read.len() as u64;
        }
        *offset += read.len() as u64;
    }
}

/// A live reader read the files while they grew and never read a byte that
/// differs from the source (no holes, no zeros for data).
pub fn assert_live_reads_match(report: LiveReport) {
    assert!(
        report.mismatched == 0,
        "a live reader read {} bytes that differ from the source ({} of them zeros): {:?}",
        report.mismatched,
        report.mismatched_zeros,
        report.examples
    );
    assert!(report.bytes_checked > 0, "the live reader read nothing");
    assert!(
        report.bytes_checked_growing > 0,
        "the live reader never read a file while it grew: {report:?}"
    );
    assert_eq!(report.shrinks, 0, "a destination file shrank: {report:?}");
}

/// One HTTP/1.0 GET on loopback: (status code, body); None if nobody answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    Some((
        head.split_whitespace().nth(1)?.parse().ok()?,
        body.to_string(),
    ))
}

/// Sends `signal` to a child process (SIGSTOP, SIGCONT, SIGTERM).
pub fn signal(pid: Option<i32>, signal: i32) {
    let pid = pid.expect("the process is running");
    // SAFETY: kill(2) with a child's pid has no memory effects here.
    let sent = unsafe { libc::kill(pid, signal) };
    assert_eq!(sent, 0, "kill({pid}, {signal})");
}

/// Bytes of every regular file under `dir`.
pub fn tree_bytes(dir: &Path) -> u64 {
    list_files(dir)
        .iter()
        .map(|f| std::fs::metadata(dir.join(f)).map_or(0, |m| m.len()))
        .sum()
}
