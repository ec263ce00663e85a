//! Commit events on a real Kafka broker (4.3.1, KRaft, from Maven Central
//! jars): simulator → watcher → sink with `--kafka-brokers`, read back with
//! confluent-kafka (read_committed). Per file, the committed ranges of its
//! events cover the file exactly once and in order, every `.inprogress`
//! rename is told, every file ends with a seal whose digest matches the
//! destination file, and no event is in the topic twice: with the sink
//! killed again and again, with the broker stopped mid-run or restarted
//! four times while events flow, and with no broker at all until the run
//! is over. `kafka_cluster.rs` does the same against three brokers.

mod common;

use std::time::{Duration, Instant};

use common::kafka::{
    KafkaBroker, TOPIC, check_events, consume, events_pipeline, events_status, finish_and_check,
    wait_more_acknowledged,
};
use common::{
    Pipeline, PipelineOptions, assert_clean_audit, files_of_run, scratch, simulate,
    simulate_in_background, status_u64, strings, workload,
};

/// Waits until the relay has published everything the sink recorded.
fn wait_published(pipeline: &Pipeline, timeout: Duration) -> serde_json::Value {
    common::kafka::wait_pipeline_published(pipeline, timeout)
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
    let events = consume(&broker.bootstrap(), TOPIC);
    let count = check_events(&events, &pipeline.dest_root, files);
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
    let events = consume(&broker.bootstrap(), TOPIC);
    let count = check_events(&events, &pipeline.dest_root, files);
    println!("{count} events for {files} files across 12 kills of the sink");
    pipeline.watcher.stop();
    pipeline.sink.stop();
    assert_clean_audit(&pipeline.sink_state);
}

#[test]
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
    let told = consume(&broker.bootstrap(), TOPIC);
    let count = check_events(&told, &pipeline.dest_root, files);
    println!("{count} events for {files} files across a broker outage");
}

/// Four graceful restarts of a one-node broker while events flow: a
/// broker shutting down skips the markers of partitions that have no leader
/// at that moment, and once took back a transaction it had acknowledged
/// (50 events lost in one CI run); the relay also once hung for good in
/// librdkafka's `send_offsets_to_transaction` here.
#[test]
fn broker_restarts_while_publishing_lose_nothing() {
    let dir = scratch("kafka-restarts");
    let mut broker = KafkaBroker::start(&dir.join("kafka"), 4);
    let pipeline = events_pipeline("kafka-restarts-run", &broker.bootstrap());
    let sim = simulate_in_background(
        &pipeline.dir,
        &pipeline.source,
        &workload("r0001", "3", "1MiB", "600s"),
    );
    for restart in 1..=4 {
        wait_more_acknowledged(
            &pipeline,
            "transactions acknowledged since the last restart",
        );
        broker.restart();
        println!("restart {restart} done");
    }
    finish_and_check(
        &pipeline,
        sim,
        &broker.bootstrap(),
        "across 4 broker restarts",
    );
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
    let told = consume(&broker.bootstrap(), TOPIC);
    let count = check_events(&told, &pipeline.dest_root, files);
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
    // Held back: the watcher keeps what the sink refuses and sends it
    // again; between two refusals after this, nothing was placed.
    let refused = || events_status(&pipeline).map_or(0, |e| status_u64(&e, "refused_batches"));
    // Two first: the rounds under way when the outbox filled are placed
    // by then.
    common::wait_until("batches refused", Duration::from_secs(60), || {
        refused() >= 2
    });
    let placed = status_u64(&pipeline.status().expect("status"), "placed_bytes");
    let refused_then = refused();
    common::wait_until(
        "two more refusals of the batches sent again",
        Duration::from_secs(60),
        || refused() >= refused_then + 2,
    );
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
    let told = consume(&broker.bootstrap(), TOPIC);
    let count = check_events(&told, &pipeline.dest_root, files);
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
    let made = std::process::Command::new(common::kafka::python())
        .args(["-c", &create])
        .status()
        .expect("run python");
    assert!(made.success(), "creating the topic failed");
    pipeline.wait_identical(Duration::from_secs(60));
    wait_published(&pipeline, Duration::from_secs(120));
    let told = consume(&broker.bootstrap(), TOPIC);
    check_events(&told, &pipeline.dest_root, files);
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
