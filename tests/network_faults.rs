//! Network faults. The sink runs in a network namespace of the
//! test's own, joined to the host by a veth pair (see `common::netns`):
//!
//! - the link goes down for 30 s mid-transfer, then up;
//! - the link flaps: 20 short cuts in a row;
//! - the sink restarts on a new address and the watcher is restarted with it;
//! - the sink stops answering without closing anything (frozen with
//!   SIGSTOP: its sockets stay open, no RST, no FIN) for longer than the
//!   HTTP/2 keepalive (a ping every 10 s, 20 s to answer): the watcher
//!   gives its connections up within that bound and keeps trying.
//!
//! Each ends identical, with no range recorded twice (audit).

mod common;

use std::time::{Duration, Instant};

use common::netns::NetNs;
use common::{
    Pipeline, PipelineOptions, signal, simulate_in_background, status_u64, wait_until, workload,
};

/// A pipeline whose sink is in `ns`, with the simulator running.
fn across(ns: &NetNs, name: &str) -> (Pipeline, common::Proc) {
    let pipeline = Pipeline::in_scratch(
        name,
        PipelineOptions {
            sink_netns: Some((ns.name.clone(), ns.address.clone())),
            ..PipelineOptions::default()
        },
    );
    let sim = simulate_in_background(
        &pipeline.dir,
        &pipeline.source,
        &workload("r0001", "2", "1MiB", "600s"),
    );
    wait_placed_beyond(&pipeline, 0);
    (pipeline, sim)
}

/// Waits until the sink has placed more than `bytes`.
fn wait_placed_beyond(pipeline: &Pipeline, bytes: u64) {
    wait_until("bytes flow", Duration::from_secs(120), || {
        pipeline
            .status()
            .is_some_and(|s| status_u64(&s, "placed_bytes") > bytes)
    });
}

/// Ends the run and checks it (see [`Pipeline::finish_run`]).
fn finish(mut pipeline: Pipeline, mut sim: common::Proc) {
    pipeline.finish_run(&mut sim, "r0001");
}

#[test]
fn the_link_down_for_30_seconds() {
    let Some(ns) = NetNs::create("down") else {
        return;
    };
    let (pipeline, sim) = across(&ns, "link-down");
    ns.link(false);
    std::thread::sleep(Duration::from_secs(30));
    let log = pipeline.watcher.log_text();
    assert!(
        log.contains("connection lost"),
        "the outage is not in the log:\n{log}"
    );
    ns.link(true);
    let back = Instant::now();
    wait_until("the watcher is back", Duration::from_secs(120), || {
        pipeline.status().is_some()
    });
    let placed = status_u64(&pipeline.status().expect("status"), "placed_bytes");
    wait_placed_beyond(&pipeline, placed);
    println!(
        "bytes flowed again {:?} after the link came back",
        back.elapsed()
    );
    finish(pipeline, sim);
}

#[test]
fn the_link_flaps_twenty_times() {
    let Some(ns) = NetNs::create("flap") else {
        return;
    };
    let (pipeline, sim) = across(&ns, "link-flaps");
    for cut in 0..20u64 {
        ns.link(false);
        std::thread::sleep(Duration::from_millis(300 + 100 * (cut % 8)));
        ns.link(true);
        std::thread::sleep(Duration::from_millis(700));
    }
    finish(pipeline, sim);
}

#[test]
fn the_sink_restarts_on_a_new_address() {
    let Some(ns) = NetNs::create("move") else {
        return;
    };
    let (mut pipeline, sim) = across(&ns, "sink-moves");
    std::thread::sleep(Duration::from_secs(2));
    pipeline.sink.stop();
    pipeline.watcher.stop();
    let port = common::free_port();
    let new_address = format!("{}:{port}", ns.address);
    let mut sink_args = pipeline.sink.args().to_vec();
    let listen = sink_args
        .iter()
        .position(|arg| arg == "--listen")
        .expect("--listen");
    sink_args[listen + 1] = new_address.clone();
    pipeline.sink.start_with(&sink_args);
    let endpoint = format!("http://{new_address}");
    let mut watch_args = pipeline.watcher.args().to_vec();
    let to = watch_args
        .iter()
        .position(|arg| arg == "--to")
        .expect("--to");
    watch_args[to + 1] = endpoint.clone();
    pipeline.watcher.start_with(&watch_args);
    pipeline.endpoint = endpoint;
    wait_until(
        "the sink answers on its new address",
        Duration::from_secs(60),
        || pipeline.status().is_some(),
    );
    let placed = status_u64(&pipeline.status().expect("status"), "placed_bytes");
    wait_placed_beyond(&pipeline, placed);
    // It resumed where the manifest says: nothing placed before was sent
    // again as new bytes.
    finish(pipeline, sim);
}

#[test]
fn a_frozen_sink_is_given_up_on_and_nothing_is_placed_twice() {
    let mut pipeline = Pipeline::in_scratch("frozen-sink", PipelineOptions::default());
    let mut sim = simulate_in_background(
        &pipeline.dir,
        &pipeline.source,
        &workload("r0001", "2", "1MiB", "600s"),
    );
    wait_placed_beyond(&pipeline, 0);
    let lost_before = pipeline
        .watcher
        .log_text()
        .matches("connection lost")
        .count();
    signal(pipeline.sink.pid(), libc::SIGSTOP);
    let frozen = Instant::now();
    // Keepalive: a ping every 10 s, 20 s for its answer, so each connection
    // is given up within about 30 s (allowing for a loaded machine).
    wait_until(
        "the watcher gives up on the frozen sink",
        Duration::from_secs(90),
        || {
            pipeline
                .watcher
                .log_text()
                .matches("connection lost")
                .count()
                > lost_before
        },
    );
    let detected = frozen.elapsed();
    println!("a frozen sink was given up on after {detected:?}");
    signal(pipeline.sink.pid(), libc::SIGCONT);
    std::thread::sleep(Duration::from_secs(3));
    // No range recorded twice: what the frozen sink received before it
    // stopped and the watcher sent again after was recognised.
    pipeline.finish_run(&mut sim, "r0001");
}
