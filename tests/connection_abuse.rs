//! Connection abuse: while a real watcher transfers a
//! run, hostile peers hold 1,000 idle TCP connections, open more DoPut
//! streams than one address may hold and never send on them, and trickle
//! an HTTP/2 preface one byte a second. The watcher's transfer completes
//! identical, the hostile streams beyond the per-address cap are refused
//! and the rest are closed once they have sent no hello for 30 s, and the
//! sink's peak memory is reported. A peer that sends a 64 MiB batch one
//! byte per write has it placed whole beside a real watcher's run.

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

/// Forwards one connection to `to`, writing everything the client sends
/// one byte per `write` (the answers go back as they come). Returns the
/// address to connect to and the thread, which ends with the connection
/// and returns the bytes it forwarded.
fn one_byte_writes_proxy(to: String) -> (String, std::thread::JoinHandle<u64>) {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
    let address = listener.local_addr().expect("proxy address").to_string();
    let thread = std::thread::spawn(move || {
        let Ok((client, _)) = listener.accept() else {
            return 0;
        };
        let Ok(sink) = TcpStream::connect(&to) else {
            return 0;
        };
        let (Ok(mut from_sink), Ok(mut to_client)) = (sink.try_clone(), client.try_clone()) else {
            return 0;
        };
        let answers = std::thread::spawn(move || std::io::copy(&mut from_sink, &mut to_client));
        let (mut from_client, mut to_sink) = (client, sink);
        let mut buffer = vec![0u8; 64 << 10];
        let mut forwarded = 0u64;
        loop {
            let read = match from_client.read(&mut buffer) {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            for byte in &buffer[..read] {
                if to_sink.write_all(std::slice::from_ref(byte)).is_err() {
                    return forwarded;
                }
            }
            forwarded += read as u64;
        }
        let _ = to_sink.shutdown(std::net::Shutdown::Write);
        let _ = answers.join();
        forwarded
    });
    (address, thread)
}

/// A peer that sends a valid hello and then a 64 MiB batch, every byte of
/// the connection in a write of its own: the sink reads it as it comes,
/// holds no more than the message, places it whole and acknowledges it,
/// while a real watcher transfers a run beside it.
#[test]
fn a_64_mib_message_in_one_byte_writes_is_placed_whole() {
    let pipeline = Pipeline::in_scratch("one-byte-writes", PipelineOptions::default());
    common::wait_until("the sink serves", Duration::from_secs(30), || {
        pipeline.status().is_some()
    });
    let rss_before = peak_rss_kb(pipeline.sink.pid());
    let sink_address = pipeline.endpoint.trim_start_matches("http://").to_string();
    let (proxy, forwarder) = one_byte_writes_proxy(sink_address);

    // A message just under the sink's 64 MiB limit: one data row.
    let data: Vec<u8> = (0..(64u64 << 20) - (64 << 10))
        .map(|i| (i % 251) as u8)
        .collect();
    let mut builder = flight_server::BatchBuilder::with_capacity(1, data.len());
    builder.push_data("big.dat", 1, 0, &data);
    let batch = builder.finish();
    let mut messages =
        arrow_flight::utils::batches_to_flight_data(&flight_server::range_schema(), [&batch])
            .expect("encode the batch");
    let hello = serde_json::to_vec(&flight_server::Hello::new("trickle")).expect("hello");
    messages[0].flight_descriptor = Some(arrow_flight::FlightDescriptor::new_cmd(hello));
    messages[1].app_metadata = flight_server::protocol::encode_seq(1).to_vec().into();

    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let trickled = std::thread::spawn(move || {
        runtime.block_on(async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{proxy}"))
                .expect("endpoint")
                .connect()
                .await
                .expect("connect through the proxy");
            let mut client = FlightServiceClient::new(channel)
                .max_decoding_message_size(64 << 20)
                .max_encoding_message_size(64 << 20);
            let started = Instant::now();
            let mut answers = client
                .do_put(futures::stream::iter(messages))
                .await
                .expect("the DoPut stream opens")
                .into_inner();
            let first = answers.message().await;
            (first, started.elapsed())
        })
    });

    // The real watcher transfers a run meanwhile.
    simulate(&pipeline.source, &workload("r0001", "2", "1MiB", "3s"));
    let files = common::files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, Duration::from_secs(120));
    pipeline.wait_identical(Duration::from_secs(60));

    let (answer, took) = trickled.join().expect("the trickling client");
    let put = answer
        .expect("an answer to the trickled batch")
        .expect("an ack, not the end of the stream");
    let ack = flight_server::Ack::decode(&put.app_metadata).expect("a readable ack");
    assert_eq!((ack.seq, ack.placed), (1, data.len() as u64));
    let placed =
        std::fs::read(pipeline.dest_root.join("trickle/big.dat")).expect("the placed file");
    assert!(
        placed == data,
        "the trickled batch was not placed byte-identical"
    );
    let forwarded = forwarder.join().unwrap_or(0);
    let rss_after = peak_rss_kb(pipeline.sink.pid());
    println!(
        "{forwarded} bytes in one-byte writes acknowledged after {took:?}; sink peak RSS {rss_before} kB before, {rss_after} kB after"
    );
}
