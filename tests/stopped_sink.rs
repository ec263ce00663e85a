//! A watcher stops when told to, even while its sink does not answer:
//! here the sink is SIGSTOPped mid-run, as an
//! operator might, with more appended than the watcher can have in flight.
//! Once the sink runs again, a restarted watcher sends what was never
//! acknowledged.

mod common;

use std::time::Duration;

use common::{Pipeline, PipelineOptions, signal, strings, wait_until};

#[test]
fn sigterm_ends_a_watcher_whose_sink_is_stopped() {
    let mut pipeline = Pipeline::in_scratch(
        "stopped-sink",
        PipelineOptions {
            // Small windows and batches, so a few MiB fill everything.
            extra_watch_args: strings(&[
                "--connections",
                "1",
                "--window",
                "256KiB",
                "--batch-bytes",
                "64KiB",
                "--max-row-bytes",
                "64KiB",
            ]),
            ..PipelineOptions::default()
        },
    );
    let first: Vec<u8> = (0..1u32 << 20).map(|i| (i % 249) as u8).collect();
    std::fs::write(pipeline.source.join("first.dat"), &first).expect("write a source file");
    pipeline.wait_identical(Duration::from_secs(60));

    signal(pipeline.sink.pid(), libc::SIGSTOP);
    let more: Vec<u8> = (0..16u32 << 20).map(|i| (i % 241) as u8).collect();
    std::fs::write(pipeline.source.join("second.dat"), &more).expect("write a source file");
    // The watcher reads into its full queue, then waits on the sink.
    std::thread::sleep(Duration::from_secs(2));
    signal(pipeline.watcher.pid(), libc::SIGTERM);
    wait_until(
        "the watcher exits after SIGTERM with its sink stopped",
        Duration::from_secs(30),
        || !pipeline.watcher.is_running(),
    );

    // The watcher exited: this only forgets its handle.
    pipeline.watcher.kill9();
    signal(pipeline.sink.pid(), libc::SIGCONT);
    pipeline.watcher.start();
    pipeline.wait_identical(Duration::from_secs(60));
}
