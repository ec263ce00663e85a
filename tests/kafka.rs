//! Commit events on a real Kafka broker (4.3.1, KRaft, from Maven Central
//! jars): simulator → watcher → sink with `--kafka-brokers`, read back with
//! confluent-kafka (read_committed). Per file, the committed ranges of its
//! events cover the file exactly once and in order, every `.inprogress`
//! rename is told, every file ends with a seal whose digest matches the
//! destination file, and no event is in the topic twice: with the sink
//! killed again and again, with the broker stopped mid-run, and with no
//! broker at all until the run is over.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::kafka::KafkaBroker;
use common::{
    Pipeline, PipelineOptions, assert_clean_audit, files_of_run, scratch, simulate,
    simulate_in_background, status_u64, strings, workload,
};

const TOPIC: &str = "tailflight.events";

fn python() -> String {
    std::env::var("TAILFLIGHT_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Every record of the topic, as `tests/tools/kafka_consume.py` prints them.
fn consume(bootstrap: &str) -> Vec<serde_json::Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/kafka_consume.py");
    let out = Command::new(python())
        .arg(&script)
        .args(["--bootstrap", bootstrap, "--topic", TOPIC])
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

fn events_pipeline(name: &str, brokers: &str) -> Pipeline {
    Pipeline::in_scratch(
        name,
        PipelineOptions {
            extra_sink_args: strings(&["--kafka-brokers", brokers, "--kafka-topic", TOPIC]),
            ..PipelineOptions::default()
        },
    )
}

fn events_status(pipeline: &Pipeline) -> Option<serde_json::Value> {
    pipeline
        .status()
        .and_then(|status| status.get("events").cloned())
}

/// Waits until the relay has published everything the sink recorded.
fn wait_published(pipeline: &Pipeline, timeout: Duration) -> serde_json::Value {
    let deadline = Instant::now() + timeout;
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(events) = events_status(pipeline) {
            if status_u64(&events, "depth_events") == 0
                && status_u64(&events, "recorded_through") > 0
            {
                return events;
            }
            last = Some(events);
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    panic!(
        "the relay never published everything: {last:?}\n--- sink log ---\n{}",
        pipeline.sink.log_text()
    );
}

/// What the events say, checked against the destination. Returns the
/// number of events.
fn check_events(events: &[serde_json::Value], pipeline: &Pipeline, files: u64) -> usize {
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
                    let path = pipeline
                        .dest_root
                        .join(data["path"].as_str().expect("path"));
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

#[test]
fn events_cover_each_file_once_in_order() {
    let dir = scratch("kafka-events");
    let broker = KafkaBroker::start(&dir.join("kafka"), 4);
    let pipeline = events_pipeline("kafka-events-run", &broker.bootstrap());
    simulate(&pipeline.source, &workload("r0001", "3", "1MiB", "3s"));
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, Duration::from_secs(120));
    pipeline.wait_identical(Duration::from_secs(60));
    let published = wait_published(&pipeline, Duration::from_secs(120));
    let events = consume(&broker.bootstrap());
    let count = check_events(&events, &pipeline, files);
    assert_eq!(count as u64, status_u64(&published, "recorded_through"));
    println!("{count} events for {files} files: {published}");
}

#[test]
fn kill_nine_of_the_sink_publishes_each_event_once() {
    let dir = scratch("kafka-kills");
    let broker = KafkaBroker::start(&dir.join("kafka"), 4);
    let mut pipeline = events_pipeline("kafka-kills-run", &broker.bootstrap());
    let mut sim = simulate_in_background(
        &pipeline.dir,
        &pipeline.source,
        &workload("r0001", "4", "1MiB", "600s"),
    );
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64 | 1);
    println!("kill seed {seed}");
    let mut pause = |low: u64, high: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        Duration::from_millis(low + seed % (high - low))
    };
    for cycle in 0..12 {
        std::thread::sleep(pause(300, 1500));
        pipeline.sink.kill9();
        std::thread::sleep(pause(0, 300));
        pipeline.sink.start();
        println!("cycle {cycle} done");
    }
    sim.stop();
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, Duration::from_secs(180));
    pipeline.wait_identical(Duration::from_secs(120));
    wait_published(&pipeline, Duration::from_secs(120));
    let events = consume(&broker.bootstrap());
    let count = check_events(&events, &pipeline, files);
    println!("{count} events for {files} files across 12 kills of the sink");
    pipeline.watcher.stop();
    pipeline.sink.stop();
    assert_clean_audit(&pipeline.sink_state);
}

#[test]
#[ignore = "issue 41: a one-node broker restarted while events flow can take back a transaction it \
            acknowledged (lost events), and a fatal transaction error can stall the relay; it \
            failed 2 of 4 runs on 2026-11-28 (cargo test --test kafka -- --ignored runs it)"]
fn a_broker_outage_does_not_stop_ingest_and_loses_nothing() {
    let dir = scratch("kafka-outage");
    let mut broker = KafkaBroker::start(&dir.join("kafka"), 4);
    let pipeline = events_pipeline("kafka-outage-run", &broker.bootstrap());
    let mut sim = simulate_in_background(
        &pipeline.dir,
        &pipeline.source,
        &workload("r0001", "3", "1MiB", "600s"),
    );
    common::wait_until("events published", Duration::from_secs(60), || {
        events_status(&pipeline).is_some_and(|e| status_u64(&e, "published_through") > 0)
    });
    broker.stop();
    let placed_before = status_u64(&pipeline.status().expect("status"), "placed_bytes");
    let stopped = Instant::now();
    common::wait_until("the relay says it fails", Duration::from_secs(60), || {
        events_status(&pipeline).is_some_and(|e| e["relay"]["state"] == "failing")
    });
    // The outage lasts at least 12 s.
    std::thread::sleep(Duration::from_secs(12).saturating_sub(stopped.elapsed()));
    let status = pipeline.status().expect("status");
    let events = &status["events"];
    assert!(
        status_u64(&status, "placed_bytes") > placed_before,
        "ingest stopped with the broker: {status}"
    );
    assert!(status_u64(events, "depth_events") > 0, "{status}");
    assert!(events["relay"]["error"].is_string(), "{status}");
    broker.restart();
    std::thread::sleep(Duration::from_secs(3));
    sim.stop();
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, Duration::from_secs(120));
    pipeline.wait_identical(Duration::from_secs(60));
    wait_published(&pipeline, Duration::from_secs(180));
    let told = consume(&broker.bootstrap());
    let count = check_events(&told, &pipeline, files);
    println!("{count} events for {files} files across a broker outage");
}

#[test]
fn no_broker_until_the_run_is_over() {
    let dir = scratch("kafka-late");
    let port = common::free_port();
    let brokers = format!("127.0.0.1:{port}");
    let pipeline = events_pipeline("kafka-late-run", &brokers);
    simulate(&pipeline.source, &workload("r0001", "2", "1MiB", "2s"));
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, Duration::from_secs(120));
    pipeline.wait_identical(Duration::from_secs(60));
    common::wait_until("the relay says it fails", Duration::from_secs(60), || {
        events_status(&pipeline).is_some_and(|e| e["relay"]["state"] == "failing")
    });
    let events = events_status(&pipeline).expect("events status");
    assert!(status_u64(&events, "depth_events") > 0, "{events}");
    assert!(
        events["relay"]["error"]
            .as_str()
            .is_some_and(|e| !e.is_empty()),
        "{events}"
    );
    let broker = KafkaBroker::start_on(&dir.join("kafka"), 4, port);
    wait_published(&pipeline, Duration::from_secs(180));
    let told = consume(&broker.bootstrap());
    let count = check_events(&told, &pipeline, files);
    println!("{count} events for {files} files, published once a broker started");
}

#[test]
fn a_full_outbox_holds_ingest_back_until_the_relay_drains_it() {
    let dir = scratch("kafka-full-outbox");
    let port = common::free_port();
    let brokers = format!("127.0.0.1:{port}");
    let pipeline = Pipeline::in_scratch(
        "kafka-full-outbox-run",
        PipelineOptions {
            extra_sink_args: strings(&[
                "--kafka-brokers",
                &brokers,
                "--kafka-topic",
                TOPIC,
                "--kafka-outbox-limit",
                "16KiB",
            ]),
            ..PipelineOptions::default()
        },
    );
    simulate(&pipeline.source, &workload("r0001", "2", "1MiB", "2s"));
    common::wait_until("the outbox is full", Duration::from_secs(60), || {
        events_status(&pipeline).is_some_and(|e| status_u64(&e, "depth_bytes") >= 16 << 10)
    });
    // Held back: the watcher keeps what the sink refuses and sends it again.
    std::thread::sleep(Duration::from_secs(1));
    let placed = status_u64(&pipeline.status().expect("status"), "placed_bytes");
    std::thread::sleep(Duration::from_secs(2));
    let status = pipeline.status().expect("status");
    assert_eq!(
        status_u64(&status, "placed_bytes"),
        placed,
        "ingest went on past a full outbox: {status}"
    );
    // Bounded: past the limit by at most the rounds already under way.
    assert!(
        status_u64(&status["events"], "depth_bytes") < 64 << 10,
        "{status}"
    );
    assert!(
        !common::verify(&pipeline.source, &pipeline.dest()).0,
        "everything arrived although the outbox was full"
    );
    let broker = KafkaBroker::start_on(&dir.join("kafka"), 4, port);
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, Duration::from_secs(180));
    pipeline.wait_identical(Duration::from_secs(120));
    wait_published(&pipeline, Duration::from_secs(120));
    let told = consume(&broker.bootstrap());
    let count = check_events(&told, &pipeline, files);
    println!("{count} events for {files} files through a 16 KiB outbox");
}

#[test]
fn a_missing_topic_is_named_in_status_and_nothing_is_lost() {
    let dir = scratch("kafka-no-topic");
    let broker = KafkaBroker::start_with(
        &dir.join("kafka"),
        4,
        common::free_port(),
        "auto.create.topics.enable=false",
    );
    let pipeline = events_pipeline("kafka-no-topic-run", &broker.bootstrap());
    simulate(&pipeline.source, &workload("r0001", "1", "1MiB", "1s"));
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, Duration::from_secs(120));
    common::wait_until(
        "status names the missing topic",
        Duration::from_secs(60),
        || {
            events_status(&pipeline).is_some_and(|e| {
                e["relay"]["state"] == "failing"
                    && e["relay"]["error"].as_str().is_some_and(|error| {
                        error.contains(TOPIC) && error.contains("does not exist")
                    })
            })
        },
    );
    let events = events_status(&pipeline).expect("events status");
    assert!(status_u64(&events, "depth_events") > 0, "{events}");
    assert_eq!(status_u64(&events, "published_through"), 0, "{events}");
    // Once the topic exists, every event waiting goes out.
    let create = format!(
        "from confluent_kafka.admin import AdminClient, NewTopic\n\
         admin = AdminClient({{'bootstrap.servers': '{}'}})\n\
         futures = admin.create_topics([NewTopic('{TOPIC}', 4, 1)])\n\
         [f.result(60) for f in futures.values()]\n",
        broker.bootstrap()
    );
    let made = Command::new(python())
        .args(["-c", &create])
        .status()
        .expect("run python");
    assert!(made.success(), "creating the topic failed");
    pipeline.wait_identical(Duration::from_secs(60));
    wait_published(&pipeline, Duration::from_secs(120));
    let told = consume(&broker.bootstrap());
    check_events(&told, &pipeline, files);
}

#[test]
fn an_unknown_kafka_property_fails_at_startup() {
    let dir = scratch("kafka-bad-property");
    let (ok, text) = common::run(&common::sink_command(
        &dir,
        common::free_port(),
        &[
            "--kafka-brokers",
            "127.0.0.1:1",
            "--kafka-property",
            "no.such.property=1",
        ],
    ));
    assert!(!ok, "the sink started: {text}");
    assert!(text.contains("no.such.property"), "{text}");
}
