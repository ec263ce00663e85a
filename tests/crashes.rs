//! Crashes: while the simulator writes, the sink, then the watcher, then
//! both are killed with SIGKILL at random moments and restarted, ten times
//! each with the sink's journal (whose entries are written back at every
//! restart), five without it. At the end the files are identical, the
//! manifest records no byte range twice, the commit feed told each durable
//! byte exactly once, and the duplicate counter shows re-delivery happened.

mod common;

use std::time::Duration;

use common::{
    Pipeline, PipelineOptions, assert_clean_audit, assert_feed_told_each_byte_once, feed_log_args,
    files_of_run, scratch, simulate_in_background, status_u64,
};

/// A small xorshift generator: the seed is printed so a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.next() % (high - low))
    }
}

#[test]
fn kill_nine_sink_watcher_and_both() {
    crash_cycles("crashes", PipelineOptions::default(), 10);
}

#[test]
fn kill_nine_without_the_sink_journal() {
    let options = PipelineOptions {
        extra_sink_args: common::strings(&["--journal-max-range", "0"]),
        ..PipelineOptions::default()
    };
    crash_cycles("crashes-no-journal", options, 5);
}

fn crash_cycles(name: &str, options: PipelineOptions, default_cycles: usize) {
    let seed = std::env::var("TAILFLIGHT_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("crash test seed: {seed} (set TAILFLIGHT_CRASH_SEED to replay)");
    let mut rng = Rng(seed);
    let cycles: usize = std::env::var("TAILFLIGHT_CRASH_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default_cycles);

    let dir = scratch(name);
    let feed_log = dir.join("feed.jsonl");
    let mut options = options;
    options.extra_sink_args.extend(feed_log_args(&feed_log));
    let mut pipeline = Pipeline::start(&dir, options);
    // Reads the destination files while they grow, through every kill.
    let reader = common::LiveReader::start(&pipeline.source, &pipeline.dest());
    // Long enough to outlast every kill cycle; stopped when the cycles end.
    let mut sim = simulate_in_background(
        &dir,
        &pipeline.source,
        &[
            "--streams",
            "4",
            "--rate",
            "200",
            "--frame",
            "32KiB",
            "--chunk",
            "4MiB",
            "--duration",
            "600s",
        ],
    );

    for round in ["sink", "watcher", "both"] {
        for cycle in 0..cycles {
            std::thread::sleep(rng.millis(200, 1200));
            match round {
                "sink" => pipeline.sink.kill9(),
                "watcher" => pipeline.watcher.kill9(),
                _ => {
                    pipeline.watcher.kill9();
                    pipeline.sink.kill9();
                }
            }
            std::thread::sleep(rng.millis(0, 300));
            if round != "watcher" {
                pipeline.sink.start();
            }
            if round != "sink" {
                pipeline.watcher.start();
            }
            println!("{round} cycle {cycle} done");
        }
    }
    // End the run cleanly: SIGTERM lets the simulator rename its last chunks and write its end marker.
    sim.stop();
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, Duration::from_secs(180));
    pipeline.wait_identical(Duration::from_secs(120));
    common::assert_live_reads_match(reader.finish());

    let status = pipeline.status().expect("sink status");
    println!("sink status after the crashes: {status}");
    assert!(
        status_u64(&status, "duplicate_bytes") > 0,
        "re-delivery was never exercised: {status}"
    );
    pipeline.watcher.stop();
    pipeline.sink.stop();
    let report = assert_clean_audit(&pipeline.sink_state);
    let rounds = assert_feed_told_each_byte_once(&feed_log, &pipeline.sink_state);
    assert!(rounds > 0, "the feed told no round");
    // The sink keeps its file counts in memory across restarts; the audit reads every record.
    for count in ["files", "sealed_files"] {
        assert_eq!(
            status[count], report[count],
            "status and audit disagree on {count}: {status} vs {report}"
        );
    }
}
