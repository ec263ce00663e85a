//! Connection abuse (issue 32, item 9): while a real watcher transfers a
//! run, hostile peers hold 1,000 idle TCP connections, open more DoPut
//! streams than one address may hold and never send on them, and trickle
//! an HTTP/2 preface one byte a second. The watcher's transfer completes
//! identical, the hostile streams beyond the per-address cap are refused
//! and the rest are closed once they have sent no hello for 30 s, and the
//! sink's peak memory is reported.

mod common;

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use arrow_flight::flight_service_client::FlightServiceClient;
use common::{Pipeline, PipelineOptions, simulate, workload};

/// Peak resident memory of a process (kB), from /proc.
fn peak_rss_kb(pid: Option<i32>) -> u64 {
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", pid.unwrap_or(0))).unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn raise_fd_limit(to: u64) {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain getrlimit/setrlimit on this process with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max.min(to);
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

#[test]
fn hostile_peers_do_not_stop_a_real_watcher() {
    raise_fd_limit(8192);
    let pipeline = Pipeline::in_scratch("abuse", PipelineOptions::default());
    let address = pipeline.endpoint.trim_start_matches("http://").to_string();
    common::wait_until("the sink serves", Duration::from_secs(30), || {
        pipeline.status().is_some()
    });
    let rss_before = peak_rss_kb(pipeline.sink.pid());

    // 1,000 idle TCP connections.
    let idle: Vec<TcpStream> = (0..1000)
        .filter_map(|_| TcpStream::connect(&address).ok())
        .collect();
    println!("{} idle connections open", idle.len());

    // A slowloris: the HTTP/2 preface, a byte a second, from a thread that
    // ends with the test (bounded by the preface's 24 bytes).
    let slow_address = address.clone();
    let slowloris = std::thread::spawn(move || {
        let Ok(mut stream) = TcpStream::connect(&slow_address) else {
            return;
        };
        for byte in b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" {
            if stream.write_all(&[*byte]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    });

    // DoPut streams from another address that never send anything.
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let (opened, refused, _held) = runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(pipeline.endpoint.clone())
            .expect("endpoint")
            .local_address(Some("127.0.0.2".parse().expect("address")))
            .connect()
            .await
            .expect("connect from 127.0.0.2");
        let mut held = Vec::new();
        let (mut opened, mut refused) = (0, 0);
        for _ in 0..100 {
            let mut client = FlightServiceClient::new(channel.clone());
            let silent = futures::stream::pending::<arrow_flight::FlightData>();
            match client.do_put(silent).await {
                Ok(response) => {
                    opened += 1;
                    held.push(response.into_inner());
                }
                Err(status) if status.code() == tonic::Code::ResourceExhausted => refused += 1,
                Err(status) => panic!("unexpected answer to a silent stream: {status}"),
            }
        }
        (opened, refused, held)
    });
    println!("silent streams: {opened} opened, {refused} refused");
    assert!(refused > 0, "one address held {opened} streams");

    // The real watcher transfers a run meanwhile.
    let started = Instant::now();
    simulate(&pipeline.source, &workload("r0001", "2", "1MiB", "3s"));
    let files = common::files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, Duration::from_secs(120));
    pipeline.wait_identical(Duration::from_secs(60));
    println!(
        "the run completed in {:?} beside the hostile peers",
        started.elapsed()
    );

    // The silent streams are closed after the hello timeout.
    common::wait_until(
        "the silent streams are closed",
        Duration::from_secs(90),
        || pipeline.sink.log_text().contains("no hello within 30 s"),
    );
    let rss_after = peak_rss_kb(pipeline.sink.pid());
    println!("sink peak RSS: {rss_before} kB before the hostile peers, {rss_after} kB after");
    drop(idle);
    let _ = slowloris.join();
}
