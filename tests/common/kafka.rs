//! A real one-node Apache Kafka 4.3.1 broker (KRaft: broker and controller in
//! one JVM) for the tests that check what the sink publishes.
//!
//! The jars come from Maven Central through `ops/kafka/fetch.sh` (cached
//! outside the clone). A `KafkaBroker` owns its folder (config, data, log at
//! `<dir>/broker.log`), its two loopback ports and the `java` child process,
//! which it kills when dropped. `ops/kafka/broker.sh` writes the same config
//! for humans and the benchmark.
//!
//! `consume` reads a topic back with a read_committed consumer and
//! `check_events` checks, per file, what the events say against the
//! destination: shared by the Kafka tests and the fleet's takeover test.

use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const READY_TIMEOUT: Duration = Duration::from_secs(120);
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The jars' directory: runs `ops/kafka/fetch.sh` once per test process.
pub fn kafka_libs() -> PathBuf {
    static LIBS: OnceLock<PathBuf> = OnceLock::new();
    LIBS.get_or_init(|| {
        let script = repo().join("ops/kafka/fetch.sh");
        let out = Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let libs = stdout.lines().last().unwrap_or("").trim();
        assert!(
            out.status.success() && !libs.is_empty(),
            "{} failed ({}); stdout: {stdout}",
            script.display(),
            out.status
        );
        PathBuf::from(libs)
    })
    .clone()
}

pub struct KafkaBroker {
    dir: PathBuf,
    port: u16,
    controller_port: u16,
    child: Option<Child>,
}

impl KafkaBroker {
    /// Starts a fresh broker with its data under `dir` (created), on free
    /// loopback ports; panics with the log tail if it is not ready within
    /// 120 s. `partitions`: num.partitions for auto-created topics.
    pub fn start(dir: &Path, partitions: u32) -> Self {
        Self::start_on(dir, partitions, super::free_port())
    }

    /// [`Self::start`] listening on `port` (one a client was told of before
    /// the broker existed).
    pub fn start_on(dir: &Path, partitions: u32, port: u16) -> Self {
        Self::start_with(dir, partitions, port, "")
    }

    /// [`Self::start_on`] with more `server.properties` lines, which win
    /// over the defaults (e.g. `auto.create.topics.enable=false`).
    pub fn start_with(dir: &Path, partitions: u32, port: u16, extra_config: &str) -> Self {
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let controller_port = loop {
            let p = super::free_port();
            if p != port {
                break p;
            }
        };
        let data = dir.join("data");
        let config = format!(
            "process.roles=broker,controller\n\
             node.id=1\n\
             controller.quorum.voters=1@127.0.0.1:{controller_port}\n\
             listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
             controller.listener.names=CONTROLLER\n\
             inter.broker.listener.name=PLAINTEXT\n\
             log.dirs={}\n\
             num.partitions={partitions}\n\
             auto.create.topics.enable=true\n\
             default.replication.factor=1\n\
             min.insync.replicas=1\n\
             offsets.topic.replication.factor=1\n\
             transaction.state.log.replication.factor=1\n\
             transaction.state.log.min.isr=1\n\
             share.coordinator.state.topic.replication.factor=1\n\
             share.coordinator.state.topic.min.isr=1\n\
             group.initial.rebalance.delay.ms=0\n\
             {extra_config}\n",
            data.display()
        );
        let mut broker = Self {
            dir: dir.to_path_buf(),
            port,
            controller_port,
            child: None,
        };
        std::fs::write(broker.config(), config).expect("write server.properties");
        let cluster_id = broker.storage_tool(&["random-uuid"]);
        let config = broker.config().display().to_string();
        broker.storage_tool(&["format", "-t", cluster_id.trim(), "-c", config.as_str()]);
        broker.spawn();
        broker
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGTERM (a controlled shutdown), then wait; SIGKILL after 30 s.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None)) {
            // SAFETY: plain kill(2) on our own child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + STOP_TIMEOUT;
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Starts again on the same ports and data (stopping first if running)
    /// and waits until ready.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    fn config(&self) -> PathBuf {
        self.dir.join("server.properties")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("broker.log")
    }

    /// Runs `kafka.tools.StorageTool` and returns its stdout.
    fn storage_tool(&self, args: &[&str]) -> String {
        let out = Command::new("java")
            .arg("-cp")
            .arg(kafka_libs().join("*"))
            .arg("kafka.tools.StorageTool")
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run java (is a JDK installed?): {e}"));
        assert!(
            out.status.success(),
            "StorageTool {args:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts the JVM, logging to `broker.log`, and waits until it is ready.
    fn spawn(&mut self) {
        let log: File = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .expect("open broker.log");
        // Readiness is judged on this run's lines only.
        let from = log.metadata().map(|m| m.len()).unwrap_or(0) as usize;
        let child = Command::new("java")
            .args(["-Xms256m", "-Xmx512m"])
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                repo().join("ops/kafka/log4j2.properties").display()
            ))
            .arg("-cp")
            .arg(kafka_libs().join("*"))
            .arg("kafka.Kafka")
            .arg(self.config())
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run java (is a JDK installed?): {e}"));
        self.child = Some(child);

        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let text = std::fs::read(self.log()).unwrap_or_default();
            let started = text
                .get(from..)
                .is_some_and(|new| String::from_utf8_lossy(new).contains("Kafka Server started"));
            if started && TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() {
                return;
            }
            let problem = if !self.is_running() {
                "exited during start"
            } else if Instant::now() > deadline {
                "not ready within 120 s"
            } else {
                std::thread::sleep(Duration::from_millis(100));
                continue;
            };
            self.stop();
            panic!(
                "Kafka broker in {} (ports {}/{}) {problem}; log tail:\n{}",
                self.dir.display(),
                self.port,
                self.controller_port,
                self.log_tail(40)
            );
        }
    }

    fn log_tail(&self, lines: usize) -> String {
        let text =
            String::from_utf8_lossy(&std::fs::read(self.log()).unwrap_or_default()).into_owned();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The Python with confluent-kafka that ops/test.sh prepares.
pub fn python() -> String {
    std::env::var("TAILFLIGHT_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Every record of the topic, as `tests/tools/kafka_consume.py` prints them.
pub fn consume(bootstrap: &str, topic: &str) -> Vec<serde_json::Value> {
    let script = repo().join("tests/tools/kafka_consume.py");
    let out = Command::new(python())
        .arg(&script)
        .args(["--bootstrap", bootstrap, "--topic", topic])
        .args([
            "--min-events",
            "1",
            "--idle-seconds",
            "3",
            "--timeout",
            "120",
        ])
        .output()
        .expect("run the Kafka consumer");
    assert!(
        out.status.success(),
        "consumer failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).expect("consumer line is JSON"))
        .collect()
}

/// What the events say, checked against the destination under `dest_root`. Returns the
/// number of events.
pub fn check_events(events: &[serde_json::Value], dest_root: &Path, files: u64) -> usize {
    // Unique ids: each event is in the topic once.
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for event in events {
        *ids.entry(event["value"]["id"].as_str().expect("id"))
            .or_default() += 1;
    }
    let duplicates: Vec<_> = ids.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        duplicates.is_empty(),
        "events in the topic more than once: {duplicates:?}"
    );

    let mut by_file: BTreeMap<(String, String, u64), Vec<&serde_json::Value>> = BTreeMap::new();
    for event in events {
        let value = &event["value"];
        assert_eq!(value["specversion"], "1.0");
        assert_eq!(
            event["headers"]["content-type"],
            "application/cloudevents+json; charset=UTF-8"
        );
        let data = &value["data"];
        let file = (
            data["source"].as_str().expect("source").to_owned(),
            data["file_key"].as_str().expect("file_key").to_owned(),
            data["generation"].as_u64().expect("generation"),
        );
        let key: (String, String) =
            serde_json::from_str(event["key"].as_str().expect("key")).expect("key is a pair");
        assert_eq!(
            (&key.0, &key.1),
            (&file.0, &file.1),
            "record key of {event}"
        );
        by_file.entry(file).or_default().push(event);
    }
    assert_eq!(
        by_file.len() as u64,
        files,
        "files with events: {:?}",
        by_file.keys().collect::<Vec<_>>()
    );
    for (file, told) in &by_file {
        let partition = &told[0]["partition"];
        let mut offset = -1;
        // Every committed range, to be [0, size) exactly once; rounds may
        // commit a later range before an earlier one (their batches' commits
        // race), the watermark says how far the file is readable.
        let mut committed = Vec::new();
        let mut watermark = 0;
        let mut renamed = false;
        let kinds: Vec<&str> = told
            .iter()
            .map(|e| e["value"]["type"].as_str().expect("type"))
            .collect();
        assert_eq!(
            kinds[0], "org.tailflight.file.opened.v1",
            "{file:?}: {kinds:?}"
        );
        assert_eq!(
            *kinds.last().expect("events"),
            "org.tailflight.file.sealed.v1",
            "{file:?}: {kinds:?}"
        );
        for event in told {
            assert_eq!(&event["partition"], partition, "{file:?} in two partitions");
            let at = event["offset"].as_i64().expect("offset");
            assert!(at > offset, "{file:?}: offsets out of order");
            offset = at;
            let data = &event["value"]["data"];
            match event["value"]["type"].as_str().expect("type") {
                "org.tailflight.range.committed.v1" => {
                    for range in data["ranges"].as_array().expect("ranges") {
                        let start = range[0].as_u64().expect("start");
                        let end = range[1].as_u64().expect("end");
                        assert!(end > start, "{file:?}: empty range {range}");
                        committed.push((start, end));
                    }
                    let end = data["contiguous_end"].as_u64().expect("contiguous_end");
                    assert!(end >= watermark, "{file:?}: watermark went back");
                    assert_eq!(
                        end,
                        contiguous(&committed),
                        "{file:?}: watermark is not where the committed ranges stop"
                    );
                    watermark = end;
                }
                "org.tailflight.file.renamed.v1" => {
                    let from = data["from"].as_str().expect("from");
                    let to = data["path"].as_str().expect("path");
                    assert_eq!(from.strip_suffix(".inprogress"), Some(to), "{file:?}");
                    renamed = true;
                }
                "org.tailflight.file.sealed.v1" => {
                    let size = data["size"].as_u64().expect("size");
                    committed.sort_unstable();
                    let mut covered = 0;
                    for &(start, end) in &committed {
                        assert_eq!(start, covered, "{file:?}: a gap or an overlap at {start}");
                        covered = end;
                    }
                    assert_eq!(
                        size, covered,
                        "{file:?}: sealed at {size}, covered {covered}"
                    );
                    let path = dest_root.join(data["path"].as_str().expect("path"));
                    let digest = data["digest"].as_str().expect("digest");
                    let kind =
                        flight_server::SealDigest::of_digest(digest).expect("a known digest");
                    let dest = std::fs::File::open(&path)
                        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    let actual = kind
                        .of_file_prefix(&dest, size)
                        .expect("digest of the file");
                    assert_eq!(actual, digest, "{}", path.display());
                }
                "org.tailflight.file.opened.v1" => {}
                other => panic!("{file:?}: unexpected {other}"),
            }
        }
        assert_eq!(
            renamed,
            file.1.ends_with(".inprogress"),
            "{file:?}: rename told {renamed}: {kinds:?}"
        );
    }
    events.len()
}

/// Where the ranges stop covering the file from 0.
fn contiguous(ranges: &[(u64, u64)]) -> u64 {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let mut end = 0;
    for (start, stop) in sorted {
        if start > end {
            break;
        }
        end = end.max(stop);
    }
    end
}

/// Waits until the relay whose events section `events` reads has published
/// everything its sink recorded; returns that section. `context` is added
/// to the failure (the sinks' logs).
pub fn wait_published(
    mut events: impl FnMut() -> Option<serde_json::Value>,
    timeout: Duration,
    context: impl FnOnce() -> String,
) -> serde_json::Value {
    let deadline = Instant::now() + timeout;
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(events) = events() {
            if super::status_u64(&events, "depth_events") == 0
                && super::status_u64(&events, "recorded_through") > 0
            {
                return events;
            }
            last = Some(events);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!(
        "the relay never published everything: {last:?}\n{}",
        context()
    );
}
