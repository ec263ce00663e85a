//! A real Apache Kafka 4.3.1 broker (KRaft: broker and controller in
//! one JVM) for the tests that check what the sink publishes.
//!
//! The jars come from Maven Central through `ops/kafka/fetch.sh` (cached
//! outside the clone). A `KafkaBroker` owns its folder (config, data, log at
//! `<dir>/broker.log`), its two loopback ports and the `java` child process,
//! which it kills when dropped. `ops/kafka/broker.sh` writes the same config
//! for humans and the benchmark.
//!
//! `KafkaCluster` is three such nodes in one KRaft quorum, every topic
//! replicated three times.
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
    /// Where this run's lines start in `broker.log`.
    log_from: usize,
}

/// One node's id and loopback ports.
#[derive(Clone, Copy)]
struct Node {
    id: u32,
    port: u16,
    controller_port: u16,
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
        let controller_port = loop {
            let p = super::free_port();
            if p != port {
                break p;
            }
        };
        let node = Node {
            id: 1,
            port,
            controller_port,
        };
        let mut broker = Self::format(
            dir,
            &node,
            &[node],
            &format!("num.partitions={partitions}\n{extra_config}"),
            None,
        );
        broker.launch();
        broker.wait_ready();
        broker
    }

    /// Writes the config of `node` of the cluster of `voters` and formats
    /// its data (as cluster `cluster_id`, or a new one); does not start it.
    fn format(
        dir: &Path,
        node: &Node,
        voters: &[Node],
        extra_config: &str,
        cluster_id: Option<&str>,
    ) -> Self {
        std::fs::create_dir_all(dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let data = dir.join("data");
        let replicas = voters.len();
        let min_isr = replicas.min(2);
        let quorum = voters
            .iter()
            .map(|v| format!("{}@127.0.0.1:{}", v.id, v.controller_port))
            .collect::<Vec<_>>()
            .join(",");
        let (id, port, controller_port) = (node.id, node.port, node.controller_port);
        let config = format!(
            "process.roles=broker,controller\n\
             node.id={id}\n\
             controller.quorum.voters={quorum}\n\
             listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{port}\n\
             controller.listener.names=CONTROLLER\n\
             inter.broker.listener.name=PLAINTEXT\n\
             log.dirs={}\n\
             auto.create.topics.enable=true\n\
             default.replication.factor={replicas}\n\
             min.insync.replicas={min_isr}\n\
             offsets.topic.replication.factor={replicas}\n\
             transaction.state.log.replication.factor={replicas}\n\
             transaction.state.log.min.isr={min_isr}\n\
             share.coordinator.state.topic.replication.factor={replicas}\n\
             share.coordinator.state.topic.min.isr={min_isr}\n\
             group.initial.rebalance.delay.ms=0\n\
             {extra_config}\n",
            data.display()
        );
        let broker = Self {
            dir: dir.to_path_buf(),
            port,
            controller_port,
            child: None,
            log_from: 0,
        };
        std::fs::write(broker.config(), config).expect("write server.properties");
        let cluster_id = match cluster_id {
            Some(id) => id.to_owned(),
            None => storage_tool(&["random-uuid"]).trim().to_owned(),
        };
        let config = broker.config().display().to_string();
        storage_tool(&["format", "-t", &cluster_id, "-c", config.as_str()]);
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
        self.launch();
        self.wait_ready();
    }

    /// SIGKILL: no controlled shutdown.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts again after [`Self::stop`] or [`Self::kill9`] and waits
    /// until ready.
    pub fn start_again(&mut self) {
        self.launch();
        self.wait_ready();
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
}

/// Runs `kafka.tools.StorageTool` and returns its stdout.
fn storage_tool(args: &[&str]) -> String {
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

impl KafkaBroker {
    /// Starts the JVM, logging to `broker.log`; [`Self::wait_ready`] waits
    /// for it.
    fn launch(&mut self) {
        let log: File = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .expect("open broker.log");
        // Readiness is judged on this run's lines only.
        self.log_from = log.metadata().map(|m| m.len()).unwrap_or(0) as usize;
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
    }

    /// Waits until the broker is ready; panics with its log tail if it
    /// exits or is not ready within 120 s.
    fn wait_ready(&mut self) {
        let from = self.log_from;
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

/// Three Kafka nodes on loopback, each a broker and a controller (a KRaft
/// quorum of three), with every topic replicated three times (the
/// transaction log and the consumer offsets included) and
/// `min.insync.replicas=2`: one node may be down and nothing stops.
pub struct KafkaCluster {
    pub nodes: Vec<KafkaBroker>,
}

impl KafkaCluster {
    /// Formats and starts three nodes under `dir/node<i>` and waits until
    /// all are ready. `partitions`: num.partitions for auto-created topics.
    pub fn start(dir: &Path, partitions: u32) -> Self {
        let voters: Vec<Node> = (1..=3)
            .map(|id| Node {
                id,
                port: super::free_port(),
                controller_port: super::free_port(),
            })
            .collect();
        let cluster_id = storage_tool(&["random-uuid"]).trim().to_owned();
        let mut nodes: Vec<KafkaBroker> = voters
            .iter()
            .map(|node| {
                KafkaBroker::format(
                    &dir.join(format!("node{}", node.id)),
                    node,
                    &voters,
                    &format!("num.partitions={partitions}"),
                    Some(&cluster_id),
                )
            })
            .collect();
        // A node is ready only once a quorum of controllers is: start all
        // before waiting for any.
        for node in &mut nodes {
            node.launch();
        }
        for node in &mut nodes {
            node.wait_ready();
        }
        Self { nodes }
    }

    pub fn bootstrap(&self) -> String {
        self.nodes
            .iter()
            .map(KafkaBroker::bootstrap)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index in `nodes` of the leader of `topic`'s `partition`, as the
    /// brokers' metadata says (waits until it has one).
    pub fn leader_of(&self, topic: &str, partition: i32) -> usize {
        use rdkafka::consumer::Consumer;
        let client = self.metadata_client();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let leader = client
                .fetch_metadata(Some(topic), Duration::from_secs(10))
                .ok()
                .and_then(|metadata| {
                    metadata
                        .topics()
                        .iter()
                        .find(|t| t.name() == topic)?
                        .partitions()
                        .iter()
                        .find(|p| p.id() == partition)
                        .map(|p| p.leader())
                });
            let node = leader.and_then(|id| {
                self.nodes
                    .iter()
                    .position(|node| node.port == self.port_of_id(id))
            });
            if let Some(node) = node {
                return node;
            }
            assert!(
                Instant::now() < deadline,
                "{topic}/{partition} has no leader after {READY_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until every partition of every topic (the internal ones
    /// included) has all its replicas in sync: before a node of a rolling
    /// restart stops, so no partition drops below min.insync.replicas.
    pub fn wait_fully_replicated(&self) {
        use rdkafka::consumer::Consumer;
        let client = self.metadata_client();
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let lagging: Option<Vec<String>> = client
                .fetch_metadata(None, Duration::from_secs(10))
                .ok()
                .map(|metadata| {
                    metadata
                        .topics()
                        .iter()
                        .flat_map(|topic| {
                            topic
                                .partitions()
                                .iter()
                                .filter(|p| p.isr().len() < p.replicas().len() || p.leader() < 0)
                                .map(move |p| format!("{}/{}", topic.name(), p.id()))
                        })
                        .collect()
                });
            match lagging {
                Some(lagging) if lagging.is_empty() => return,
                lagging => assert!(
                    Instant::now() < deadline,
                    "partitions not fully replicated after {READY_TIMEOUT:?}: {lagging:?}"
                ),
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn metadata_client(&self) -> rdkafka::consumer::BaseConsumer {
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", self.bootstrap())
            .create()
            .expect("a metadata client")
    }

    /// Node ids are 1, 2, 3 in the order of `nodes`.
    fn port_of_id(&self, id: i32) -> u16 {
        usize::try_from(id - 1)
            .ok()
            .and_then(|index| self.nodes.get(index))
            .map_or(0, |node| node.port)
    }
}

/// The topic the Kafka tests publish to.
pub const TOPIC: &str = "tailflight.events";

/// A pipeline whose sink publishes its events to `brokers`, topic [`TOPIC`].
pub fn events_pipeline(name: &str, brokers: &str) -> super::Pipeline {
    super::Pipeline::in_scratch(
        name,
        super::PipelineOptions {
            extra_sink_args: super::strings(&["--kafka-brokers", brokers, "--kafka-topic", TOPIC]),
            ..super::PipelineOptions::default()
        },
    )
}

/// The `events` section of the pipeline's sink status.
pub fn events_status(pipeline: &super::Pipeline) -> Option<serde_json::Value> {
    pipeline
        .status()
        .and_then(|status| status.get("events").cloned())
}

/// Waits until the pipeline's relay has published everything its sink
/// recorded; returns the events section.
pub fn wait_pipeline_published(pipeline: &super::Pipeline, timeout: Duration) -> serde_json::Value {
    wait_published(
        || events_status(pipeline),
        timeout,
        || format!("--- sink log ---\n{}", pipeline.sink.log_text()),
    )
}

/// Transactions the pipeline's relay had acknowledged (`relay.published_events`).
fn acknowledged(pipeline: &super::Pipeline) -> u64 {
    events_status(pipeline).map_or(0, |e| super::status_u64(&e["relay"], "published_events"))
}

/// Waits until the relay has had more transactions acknowledged than now.
pub fn wait_more_acknowledged(pipeline: &super::Pipeline, what: &str) {
    let before = acknowledged(pipeline);
    super::wait_until(what, Duration::from_secs(180), || {
        acknowledged(pipeline) > before
    });
}

/// Ends a run of faults while events flow: once the relay publishes again,
/// stops the simulator, waits for every file and every event, and checks
/// what the topic at `bootstrap` holds.
pub fn finish_and_check(
    pipeline: &super::Pipeline,
    mut sim: super::Proc,
    bootstrap: &str,
    what: &str,
) {
    wait_more_acknowledged(pipeline, "transactions acknowledged after the faults");
    sim.stop();
    let files = super::files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, Duration::from_secs(180));
    pipeline.wait_identical(Duration::from_secs(60));
    let published = wait_pipeline_published(pipeline, Duration::from_secs(300));
    let told = consume(bootstrap, TOPIC);
    let count = check_events(&told, &pipeline.dest_root, files);
    println!(
        "{count} events for {files} files {what}; relay: {}",
        published["relay"]
    );
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
    // Each record names its relay and its event's number in the outbox:
    // the relay's position. A number is never published twice.
    let mut numbers: HashMap<(&str, u64), usize> = HashMap::new();
    for event in events {
        let relay = event["headers"]["tailflight-relay"]
            .as_str()
            .unwrap_or_else(|| panic!("no tailflight-relay header: {event}"));
        assert!(relay.starts_with("tailflight-relay."), "{event}");
        let seq = event["headers"]["tailflight-seq"]
            .as_str()
            .and_then(|seq| seq.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no tailflight-seq header: {event}"));
        *numbers.entry((relay, seq)).or_default() += 1;
    }
    assert!(
        numbers.values().all(|n| *n == 1),
        "an outbox number published twice"
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
