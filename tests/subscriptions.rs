//! Live-tail subscriptions (issue 29), through `tailflight tail` and a raw
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

fn wait_consumer_identical(pipeline: &Pipeline, out: &Path, consumer: &Proc) {
    common::wait_until("the consumer's files to equal the source", TIMEOUT, || {
        common::verify(&pipeline.source, out).0
    });
    let _ = consumer;
}

#[test]
fn a_consumer_following_from_the_beginning_rebuilds_the_files_exactly() {
    let mut pipeline = Pipeline::in_scratch("subscribe-follow", PipelineOptions::default());
    let dir = pipeline.dir.clone();
    let out = dir.join("consumer");
    let sim = simulate_in_background(
        &dir,
        &pipeline.source,
        &common::workload("r0001", "4", "1MiB", "4s"),
    );
    // Started as the first bytes arrive: the source must exist at the sink.
    common::wait_until("the first file at the sink", TIMEOUT, || {
        pipeline
            .status()
            .is_some_and(|s| common::status_u64(&s, "files") > 0)
    });
    let consumer = Proc::spawn(
        &dir,
        "consumer",
        &tail_args(&pipeline, &out, &dir.join("cursor.json"), &[]),
    );
    wait_for_exit(sim);
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, TIMEOUT);
    pipeline.wait_identical(TIMEOUT);
    wait_consumer_identical(&pipeline, &out, &consumer);
    let status = pipeline.status().expect("status");
    println!("subscriptions: {}", status["subscriptions"]);
    assert_eq!(status["subscriptions"].as_array().map(Vec::len), Some(1));
    drop(consumer);
    pipeline.watcher.stop();
    pipeline.sink.stop();
}

#[test]
fn a_consumer_killed_again_and_again_resumes_from_its_cursor() {
    let mut pipeline = Pipeline::in_scratch("subscribe-resume", PipelineOptions::default());
    let dir = pipeline.dir.clone();
    let out = dir.join("consumer");
    let sim = simulate_in_background(
        &dir,
        &pipeline.source,
        &common::workload("r0001", "4", "1MiB", "5s"),
    );
    common::wait_until("the first file at the sink", TIMEOUT, || {
        pipeline
            .status()
            .is_some_and(|s| common::status_u64(&s, "files") > 0)
    });
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
    wait_consumer_identical(&pipeline, &out, &consumer);
    drop(consumer);
    pipeline.watcher.stop();
    pipeline.sink.stop();
}

#[test]
fn bad_tickets_get_clear_errors_and_the_sink_serves_on() {
    use arrow_flight::flight_service_client::FlightServiceClient;
    let mut pipeline = Pipeline::in_scratch("subscribe-bad", PipelineOptions::default());
    std::fs::write(pipeline.source.join("a.dat"), b"some bytes").unwrap();
    common::wait_until("a.dat at the sink", TIMEOUT, || {
        pipeline
            .status()
            .is_some_and(|s| common::status_u64(&s, "files") > 0)
    });
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
    common::wait_until("a.dat at the sink", TIMEOUT, || {
        pipeline
            .status()
            .is_some_and(|s| common::status_u64(&s, "files") > 0)
    });
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
    common::wait_until("a.dat at the sink", TIMEOUT, || {
        pipeline
            .status()
            .is_some_and(|s| common::status_u64(&s, "files") > 0)
    });
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
