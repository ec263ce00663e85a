//! Network faults (issue 32): a sink that stops answering without closing
//! anything (frozen with SIGSTOP: its sockets stay open, no RST, no FIN)
//! for longer than the HTTP/2 keepalive (a ping every 10 s, 20 s to
//! answer): the watcher gives its connections up within that bound and
//! keeps trying; once the sink runs again, what the watcher sent before
//! and after is placed once.

mod common;

use std::time::{Duration, Instant};

use common::{
    Pipeline, PipelineOptions, assert_clean_audit, files_of_run, signal, simulate_in_background,
    wait_until, workload,
};

#[test]
fn a_frozen_sink_is_given_up_on_and_nothing_is_placed_twice() {
    let mut pipeline = Pipeline::in_scratch("frozen-sink", PipelineOptions::default());
    let mut sim = simulate_in_background(
        &pipeline.dir,
        &pipeline.source,
        &workload("r0001", "2", "1MiB", "600s"),
    );
    wait_until("bytes arrive", Duration::from_secs(60), || {
        pipeline
            .status()
            .is_some_and(|s| common::status_u64(&s, "placed_bytes") > 0)
    });
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
    sim.stop();
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, Duration::from_secs(180));
    pipeline.wait_identical(Duration::from_secs(120));
    pipeline.watcher.stop();
    pipeline.sink.stop();
    // No range recorded twice: what the frozen sink received before it
    // stopped and the watcher sent again after was recognised.
    assert_clean_audit(&pipeline.sink_state);
}
