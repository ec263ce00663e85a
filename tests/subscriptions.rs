//! Live-tail subscriptions, through `tailflight tail` and a raw
//! Flight client, against a sink fed by the simulator and a watcher, each a
//! process of its own: consumers rebuild the source tree exactly (renames
//! and seals included) while it is written, resume from their cursor after
//! being killed, and bad tickets get clear errors.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Pipeline, PipelineOptions, Proc, files_of_run, simulate_in_background, strings};

/// Far above what any run needs: only stops a hung test.
const TIMEOUT: Duration = Duration::from_secs(180);

fn tail_args(pipeline: &Pipeline, out: &Path, state: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = strings(&["tail", "--source", "src", "--follow"]);
    args.extend(["--from".into(), pipeline.endpoint.clone()]);
    args.extend(["--out".into(), out.display().to_string()]);
    args.extend(["--state".into(), state.display().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn wait_consumer_identical(pipeline: &Pipeline, out: &Path) {
    common::wait_until("the consumer's files to equal the source", TIMEOUT, || {
        common::verify(&pipeline.source, out).0
    });
}

/// A pipeline with the simulator writing `seconds` of 4 rotating streams
/// into it, returned once the first file is at the sink (a subscription
/// names a source the sink knows).
fn pipeline_with_writer(name: &str, seconds: &str) -> (Pipeline, Proc) {
    let pipeline = Pipeline::in_scratch(name, PipelineOptions::default());
    let sim = simulate_in_background(
        &pipeline.dir,
        &pipeline.source,
        &common::workload("r0001", "4", "1MiB", seconds),
    );
    wait_first_file(&pipeline);
    (pipeline, sim)
}

fn wait_first_file(pipeline: &Pipeline) {
    common::wait_until("the first file at the sink", TIMEOUT, || {
        pipeline
            .status()
            .is_some_and(|s| common::status_u64(&s, "files") > 0)
    });
}

#[test]
fn a_consumer_following_from_the_beginning_rebuilds_the_files_exactly() {
    let (mut pipeline, sim) = pipeline_with_writer("subscribe-follow", "4s");
    let dir = pipeline.dir.clone();
    let out = dir.join("consumer");
    let consumer = Proc::spawn(
        &dir,
        "consumer",
        &tail_args(&pipeline, &out, &dir.join("cursor.json"), &[]),
    );
    wait_for_exit(sim);
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, TIMEOUT);
    pipeline.wait_identical(TIMEOUT);
    wait_consumer_identical(&pipeline, &out);
    let status = pipeline.status().expect("status");
    println!("subscriptions: {}", status["subscriptions"]);
    assert_eq!(status["subscriptions"].as_array().map(Vec::len), Some(1));
    drop(consumer);
    pipeline.watcher.stop();
    pipeline.sink.stop();
}

#[test]
fn a_consumer_killed_again_and_again_resumes_from_its_cursor() {
    let (mut pipeline, sim) = pipeline_with_writer("subscribe-resume", "5s");
    let dir = pipeline.dir.clone();
    let out = dir.join("consumer");
    let mut consumer = Proc::spawn(
        &dir,
        "consumer",
        &tail_args(
            &pipeline,
            &out,
            &dir.join("cursor.json"),
            &["--max-batch-bytes", "64KiB"],
        ),
    );
    for kill in 0..5 {
        std::thread::sleep(Duration::from_millis(700));
        consumer.kill9();
        if kill == 2 {
            // Once across a restart of the sink too.
            pipeline.sink.kill9();
            pipeline.sink.start();
            common::wait_until("the sink back", TIMEOUT, || pipeline.status().is_some());
        }
        consumer.start();
    }
    wait_for_exit(sim);
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, TIMEOUT);
    pipeline.wait_identical(TIMEOUT);
    wait_consumer_identical(&pipeline, &out);
    drop(consumer);
    pipeline.watcher.stop();
    pipeline.sink.stop();
}

#[test]
fn bad_tickets_get_clear_errors_and_the_sink_serves_on() {
    use arrow_flight::flight_service_client::FlightServiceClient;
    let mut pipeline = Pipeline::in_scratch("subscribe-bad", PipelineOptions::default());
    std::fs::write(pipeline.source.join("a.dat"), b"some bytes").unwrap();
    wait_first_file(&pipeline);
    let endpoint = pipeline.endpoint.clone();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(endpoint.clone())
            .expect("endpoint URL")
            .connect()
            .await
            .expect("connect to the sink");
        let mut client = FlightServiceClient::new(channel);
        let bad: [(&str, &str); 6] = [
            ("garbage", "not JSON at all"),
            ("unknown source", r#"{"source":"nobody"}"#),
            (
                "a glob leaving the source",
                r#"{"source":"src","globs":["src/../etc/*"]}"#,
            ),
            (
                "a cursor of a generation never held",
                r#"{"source":"src","start":"cursor","cursor":[["a.dat",99,0,"a.dat"]]}"#,
            ),
            (
                "a huge batch",
                r#"{"source":"src","max_batch_bytes":1000000000000}"#,
            ),
            ("an unknown field", r#"{"source":"src","follow_me":true}"#),
        ];
        for (what, ticket) in bad {
            let outcome = client
                .do_get(arrow_flight::Ticket::new(ticket.as_bytes().to_vec()))
                .await;
            let status = match outcome {
                Err(status) => status,
                Ok(response) => {
                    use futures::StreamExt;
                    let mut stream = response.into_inner();
                    loop {
                        match stream.next().await {
                            Some(Err(status)) => break status,
                            Some(Ok(_)) => continue,
                            None => panic!("{what}: the ticket was served"),
                        }
                    }
                }
            };
            println!("{what}: {:?} {}", status.code(), status.message());
            assert_eq!(
                status.code(),
                tonic::Code::InvalidArgument,
                "{what}: {status:?}"
            );
        }
        // Listing still works, and names the file with a ticket for it.
        let mut listed = client
            .list_flights(arrow_flight::Criteria {
                expression: b"src/*.dat".to_vec().into(),
            })
            .await
            .unwrap()
            .into_inner();
        use futures::StreamExt;
        let info = listed.next().await.expect("a.dat listed").unwrap();
        assert_eq!(
            info.flight_descriptor.as_ref().map(|d| d.path.clone()),
            Some(vec!["src".to_string(), "a.dat".to_string()])
        );
        assert_eq!(info.total_bytes, 10);
        let listed: serde_json::Value =
            serde_json::from_slice(&info.app_metadata).expect("a listing's metadata is JSON");
        let committed = listed["last_commit_unix_ms"]
            .as_u64()
            .expect("a listing says when the file was last committed");
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(
            committed <= now_ms && committed > now_ms - 3_600_000,
            "{listed}"
        );
    });
    assert!(pipeline.status().is_some(), "the sink stopped serving");
    pipeline.watcher.stop();
    pipeline.sink.stop();
}

fn wait_for_exit(mut sim: Proc) {
    common::wait_until("the simulator to finish", TIMEOUT, || !sim.is_running());
}

/// The first error a DoGet meets (at the call or in its stream), or None
/// when the stream is served to its end.
async fn do_get_error(
    client: &mut arrow_flight::flight_service_client::FlightServiceClient<
        tonic::transport::Channel,
    >,
    ticket: &str,
    token: Option<&str>,
) -> Option<tonic::Code> {
    use futures::StreamExt;
    let mut request = tonic::Request::new(arrow_flight::Ticket::new(ticket.as_bytes().to_vec()));
    if let Some(token) = token {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    let mut stream = match client.do_get(request).await {
        Err(status) => return Some(status.code()),
        Ok(response) => response.into_inner(),
    };
    while let Some(message) = stream.next().await {
        if let Err(status) = message {
            return Some(status.code());
        }
    }
    None
}

#[test]
fn subscriber_tokens_are_checked_on_every_call_and_rotate_with_their_file() {
    use arrow_flight::flight_service_client::FlightServiceClient;
    let dir = common::scratch("subscribe-tokens");
    let tokens = dir.join("tokens.txt");
    std::fs::write(&tokens, "# readers\nalpha\n").unwrap();
    let mut pipeline = Pipeline::start(
        &dir,
        PipelineOptions {
            extra_sink_args: vec!["--subscriber-tokens".into(), tokens.display().to_string()],
            ..Default::default()
        },
    );
    std::fs::write(pipeline.source.join("a.dat"), b"some bytes").unwrap();
    wait_first_file(&pipeline);
    let endpoint = pipeline.endpoint.clone();
    let ticket = r#"{"source":"src"}"#;
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(endpoint)
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = FlightServiceClient::new(channel);
        let unauthenticated = Some(tonic::Code::Unauthenticated);
        assert_eq!(
            do_get_error(&mut client, ticket, None).await,
            unauthenticated
        );
        assert_eq!(
            do_get_error(&mut client, ticket, Some("beta")).await,
            unauthenticated
        );
        assert_eq!(do_get_error(&mut client, ticket, Some("alpha")).await, None);
        let listed = client
            .list_flights(arrow_flight::Criteria::default())
            .await
            .map(|_| ())
            .map_err(|s| s.code());
        assert_eq!(listed, Err(tonic::Code::Unauthenticated));

        // Rotated: the old token is refused from the next call on.
        std::fs::write(&tokens, "beta\n").unwrap();
        assert_eq!(
            do_get_error(&mut client, ticket, Some("alpha")).await,
            unauthenticated
        );
        assert_eq!(do_get_error(&mut client, ticket, Some("beta")).await, None);

        // A subscriber's token does not let it write.
        let mut put = tonic::Request::new(futures::stream::empty::<arrow_flight::FlightData>());
        put.metadata_mut()
            .insert("authorization", "Bearer beta".parse().unwrap());
        let written = client.do_put(put).await.map(|_| ()).map_err(|s| s.code());
        assert_eq!(written, Err(tonic::Code::PermissionDenied));
    });
    assert!(pipeline.status().is_some(), "the sink stopped serving");
    pipeline.watcher.stop();
    pipeline.sink.stop();
}

#[test]
fn a_watchers_certificate_does_not_grant_reading() {
    let mut pipeline = Pipeline::in_scratch(
        "subscribe-mtls",
        PipelineOptions {
            mtls: true,
            ..Default::default()
        },
    );
    std::fs::write(pipeline.source.join("a.dat"), b"some bytes").unwrap();
    wait_first_file(&pipeline);
    let mut args = strings(&["tail", "--source", "src", "--print"]);
    args.extend(["--from".into(), pipeline.endpoint.clone()]);
    args.extend(pipeline.client_tls.iter().cloned());
    let (ok, text) = common::run(&args);
    println!("{text}");
    assert!(!ok, "a watcher's certificate subscribed");
    assert!(
        text.contains("grants write access only"),
        "the refusal does not say why: {text}"
    );
    pipeline.watcher.stop();
    pipeline.sink.stop();
}

/// The Python with pyarrow that ops/test.sh prepares (TAILFLIGHT_PYTHON).
fn pyarrow_python() -> std::path::PathBuf {
    match std::env::var_os("TAILFLIGHT_PYTHON") {
        Some(python) => python.into(),
        None => panic!(
            "TAILFLIGHT_PYTHON names no Python with pyarrow: run the suite with ops/test.sh, \
             which makes one (or set it to such a Python)"
        ),
    }
}

/// A consumer with pyarrow alone (ops/examples/live_tail.py, no tailflight
/// code) follows from the beginning while the simulator writes with
/// rotation, and assembles files identical to the sources.
#[test]
fn a_pyarrow_consumer_rebuilds_the_files_exactly() {
    let python = pyarrow_python();
    let (mut pipeline, sim) = pipeline_with_writer("subscribe-pyarrow", "4s");
    let dir = pipeline.dir.clone();
    let out = dir.join("consumer");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("ops/examples/live_tail.py");
    let endpoint = pipeline.endpoint.replace("http://", "grpc://");
    let log = std::fs::File::create(dir.join("pyarrow.log")).unwrap();
    let mut consumer = std::process::Command::new(python)
        .arg(example)
        .arg(&endpoint)
        .arg("src")
        .arg("--out")
        .arg(&out)
        .arg("--cursor")
        .arg(dir.join("cursor.json"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start the pyarrow consumer");
    wait_for_exit(sim);
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, TIMEOUT);
    pipeline.wait_identical(TIMEOUT);
    let identical = (0..(TIMEOUT.as_secs() * 4)).any(|_| {
        if common::verify(&pipeline.source, &out).0 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(250));
        false
    });
    let _ = consumer.kill();
    let _ = consumer.wait();
    let log = std::fs::read_to_string(dir.join("pyarrow.log")).unwrap_or_default();
    assert!(
        identical,
        "the pyarrow consumer's files differ: {}\n--- its log ---\n{log}",
        common::verify(&pipeline.source, &out).1
    );
    pipeline.watcher.stop();
    pipeline.sink.stop();
}

/// A consumer that starts from `now` in the middle of a run gets, for every
/// file, one run of bytes without a gap or a repeat that ends at the file's
/// final size: exactly what became durable after it started.
#[test]
fn a_consumer_from_now_gets_exactly_the_bytes_after_its_start() {
    let mut pipeline = Pipeline::in_scratch("subscribe-now", PipelineOptions::default());
    let dir = pipeline.dir.clone();
    // Chunks of 4 MiB: the consumer starts once 1 MiB is placed, with the
    // first file of each stream well under way. With 1 MiB chunks all four
    // files rotated together every 0.64 s, and a consumer that subscribed
    // just then (it happened once in CI) found only new, empty files.
    let sim = simulate_in_background(
        &dir,
        &pipeline.source,
        &common::workload("r0001", "4", "4MiB", "4s"),
    );
    common::wait_until("bytes at the sink", TIMEOUT, || {
        pipeline
            .status()
            .is_some_and(|s| common::status_u64(&s, "placed_bytes") > (1 << 20))
    });
    let mut args = strings(&[
        "tail", "--source", "src", "--follow", "--print", "--start", "now",
    ]);
    args.extend(["--from".into(), pipeline.endpoint.clone()]);
    let mut consumer = Proc::spawn(&dir, "consumer", &args);
    wait_for_exit(sim);
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, TIMEOUT);
    pipeline.wait_identical(TIMEOUT);
    // Files sealed before the consumer came are no news to it; every other
    // file ends with its sealed row, once the sink has sent all it holds.
    common::wait_until("the consumer caught up", TIMEOUT, || {
        pipeline
            .status()
            .is_some_and(|s| s["subscriptions"][0]["behind_bytes"].as_u64() == Some(0))
    });
    common::wait_until(
        "a sealed row for every file the consumer got bytes of",
        TIMEOUT,
        || {
            let received = parse_printed(&consumer.log_text());
            let text = consumer.log_text();
            received.values().all(|file| {
                file.rows.is_empty()
                    || text.lines().any(|l| {
                        l.starts_with("sealed")
                            && l.split_whitespace().nth(1) == Some(file.path.as_str())
                    })
            })
        },
    );
    consumer.stop();
    let text = consumer.log_text();
    // Per path: the data rows' ranges, in the order they came.
    let mut ranges: std::collections::BTreeMap<String, Vec<(u64, u64)>> = Default::default();
    let mut renamed_from: std::collections::BTreeMap<String, String> = Default::default();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let field = |name: &str| {
            words
                .iter()
                .find_map(|w| w.strip_prefix(name))
                .and_then(|v| v.parse::<u64>().ok())
        };
        match words.first() {
            Some(&"data") => {
                let (offset, len) = (
                    field("offset=").unwrap(),
                    words[words.len() - 2].parse::<u64>().unwrap(),
                );
                ranges
                    .entry(words[1].to_string())
                    .or_default()
                    .push((offset, offset + len));
            }
            Some(&"renamed") => {
                renamed_from.insert(words[1].to_string(), words[words.len() - 1].to_string());
            }
            _ => {}
        }
    }
    // A file's ranges under its earlier names count as its own.
    for (to, from) in &renamed_from {
        if let Some(earlier) = ranges.remove(from) {
            let later = ranges.remove(to).unwrap_or_default();
            ranges.insert(to.clone(), earlier.into_iter().chain(later).collect());
        }
    }
    assert!(!ranges.is_empty(), "the consumer got no data:\n{text}");
    let mut started_late = 0;
    for (path, runs) in &ranges {
        for pair in runs.windows(2) {
            assert_eq!(
                pair[0].1, pair[1].0,
                "{path}: a gap or a repeat between {pair:?}"
            );
        }
        let size = std::fs::metadata(pipeline.source.join(path)).map(|m| m.len());
        assert_eq!(
            Ok(runs[runs.len() - 1].1),
            size.map_err(|e| e.to_string()),
            "{path} did not end at its size"
        );
        if runs[0].0 > 0 {
            started_late += 1;
        }
    }
    assert!(
        started_late > 0,
        "no file was joined in the middle: 'now' started at the beginning"
    );
    pipeline.watcher.stop();
    pipeline.sink.stop();
}

/// What a `tail --print` consumer received: per (key, generation), its data
/// rows (offset, length, crc32c) in order and the last path it was told.
#[derive(Default, Debug)]
struct Received {
    rows: Vec<(u64, u64, String)>,
    path: String,
}

fn parse_printed(text: &str) -> std::collections::BTreeMap<(String, u64), Received> {
    let mut files: std::collections::BTreeMap<(String, u64), Received> = Default::default();
    for line in text.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let value = |name: &str| words.iter().find_map(|w| w.strip_prefix(name));
        let (Some(key), Some(generation)) = (value("key="), value("gen=")) else {
            continue;
        };
        let file = files
            .entry((key.to_string(), generation.parse().unwrap()))
            .or_default();
        file.path = words[1].to_string();
        if words[0] == "data" {
            let offset = value("offset=").unwrap().parse().unwrap();
            let len = words[words.len() - 2].parse().unwrap();
            file.rows
                .push((offset, len, value("crc32c=").unwrap().to_string()));
        }
    }
    files
}

/// Across kill -9 of the sink, every byte a following consumer received is
/// in the final file at the same offset (nothing it saw was taken back),
/// each exactly once, and together they are the whole file.
#[test]
fn across_sink_kills_a_consumer_sees_only_bytes_that_stay() {
    let (mut pipeline, sim) = pipeline_with_writer("subscribe-kills", "5s");
    let dir = pipeline.dir.clone();
    let mut args = strings(&["tail", "--source", "src", "--follow", "--print"]);
    args.extend(["--from".into(), pipeline.endpoint.clone()]);
    let mut consumer = Proc::spawn(&dir, "consumer", &args);
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(800));
        pipeline.sink.kill9();
        pipeline.sink.start();
    }
    wait_for_exit(sim);
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, TIMEOUT);
    pipeline.wait_identical(TIMEOUT);
    let sealed_rows = |text: &str| text.lines().filter(|l| l.starts_with("sealed")).count() as u64;
    common::wait_until("a sealed row for every file", TIMEOUT, || {
        sealed_rows(&consumer.log_text()) >= files
    });
    consumer.stop();
    let text = consumer.log_text();
    assert!(
        text.contains("resuming"),
        "the consumer never lost its sink:\n{text}"
    );
    let received = parse_printed(&text);
    let mut checked = 0u64;
    for ((key, generation), file) in &received {
        let source = std::fs::read(pipeline.source.join(&file.path))
            .unwrap_or_else(|e| panic!("{} ({key} gen {generation}): {e}", file.path));
        let mut next = 0;
        for (offset, len, crc) in &file.rows {
            assert_eq!(
                *offset, next,
                "{}: a gap or a byte twice at {offset}",
                file.path
            );
            let bytes = &source[*offset as usize..(*offset + *len) as usize];
            assert_eq!(
                format!("{:08x}", flight_server::checksum::crc32c(bytes)),
                *crc,
                "{}: the bytes received at {offset} are not the final file's",
                file.path
            );
            next = offset + len;
            checked += len;
        }
        assert_eq!(
            next,
            source.len() as u64,
            "{}: not all of it was received",
            file.path
        );
    }
    println!(
        "{checked} bytes received and checked in {} files",
        received.len()
    );
    pipeline.watcher.stop();
    pipeline.sink.stop();
}

/// The sink's peak resident memory, from /proc (VmHWM, KiB).
fn peak_rss_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// A consumer that stops reading entirely while the simulator writes:
/// ingest completes and verifies, the subscription shows it falling
/// behind, and once it reads again it catches up with identical files.
#[test]
fn a_paused_consumer_neither_stops_ingest_nor_loses_its_place() {
    let mut pipeline = Pipeline::in_scratch("subscribe-paused", PipelineOptions::default());
    let dir = pipeline.dir.clone();
    let out = dir.join("consumer");
    std::fs::write(pipeline.source.join("first.dat"), b"a first file").unwrap();
    wait_first_file(&pipeline);
    let mut consumer = Proc::spawn(
        &dir,
        "consumer",
        &tail_args(&pipeline, &out, &dir.join("cursor.json"), &[]),
    );
    common::wait_until("the consumer subscribed", TIMEOUT, || {
        pipeline
            .status()
            .is_some_and(|s| s["subscriptions"].as_array().is_some_and(|a| !a.is_empty()))
    });
    let pid = consumer.pid().expect("the consumer runs");
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    common::simulate(
        &pipeline.source,
        &[
            "--streams",
            "4",
            "--rate",
            "0",
            "--frame",
            "1MiB",
            "--chunk",
            "64MiB",
            "--total",
            "512MiB",
        ],
    );
    let files = files_of_run(&pipeline.source, "r0001") + 1;
    pipeline.wait_sealed(files, TIMEOUT);
    pipeline.wait_identical(TIMEOUT);
    let status = pipeline.status().expect("status");
    let behind = status["subscriptions"][0]["behind_bytes"]
        .as_u64()
        .unwrap_or(0);
    let sink_peak_mib = pipeline.sink.pid().and_then(peak_rss_kib).unwrap_or(0) / 1024;
    println!("paused consumer {behind} bytes behind; sink peak RSS {sink_peak_mib} MiB");
    assert!(behind > 0, "a paused consumer shows no lag: {status}");
    unsafe { libc::kill(pid, libc::SIGCONT) };
    wait_consumer_identical(&pipeline, &out);
    consumer.stop();
    pipeline.watcher.stop();
    pipeline.sink.stop();
}
