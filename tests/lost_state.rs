//! Lost watcher state: the watcher's checkpoint directory is deleted between
//! runs. It reconciles with the sink and sends nothing that is already
//! placed, whether its files were complete or half transferred.

mod common;

use std::time::Duration;

use common::{
    Pipeline, PipelineOptions, files_of_run, scratch, simulate, simulate_in_background, status_u64,
    workload,
};

fn total_bytes(dir: &std::path::Path) -> u64 {
    common::list_files(dir)
        .iter()
        .map(|f| std::fs::metadata(dir.join(f)).unwrap().len())
        .sum()
}

/// Whether the watcher on `port` is tailing, has walked its tree, and owes
/// its sinks no byte.
fn watcher_owes_nothing(port: u16) -> bool {
    let Some((200, body)) = common::http_get(port, "/api/status") else {
        return false;
    };
    let Ok(status) = serde_json::from_str::<serde_json::Value>(&body) else {
        return false;
    };
    let source = &status["sources"][0];
    // Two heartbeats: the first walk's, and one more after it, by which
    // anything that walk found owing was counted as lag.
    status["phase"] == "tailing"
        && status["tailer_heartbeats"].as_u64() >= Some(2)
        && source["lag_bytes"].as_u64() == Some(0)
        && status["files"].as_array().is_some_and(|files| {
            files
                .iter()
                .all(|file| file["lag_bytes"].as_u64() == Some(0))
        })
}

#[test]
fn nothing_placed_is_written_again() {
    let dir = scratch("lost-state");
    let watch_port = common::free_port();
    let mut pipeline = Pipeline::start(
        &dir,
        PipelineOptions {
            extra_watch_args: vec!["--metrics-listen".into(), format!("127.0.0.1:{watch_port}")],
            ..PipelineOptions::default()
        },
    );

    // First run: complete files.
    simulate(&pipeline.source, &workload("r1", "2", "1MiB", "2s"));
    let first_files = files_of_run(&pipeline.source, "r1");
    pipeline.wait_sealed(first_files, Duration::from_secs(120));
    pipeline.wait_identical(Duration::from_secs(60));

    // Second run: kill the watcher mid-stream, wipe its state, restart it.
    let mut sim =
        simulate_in_background(&dir, &pipeline.source, &workload("r2", "2", "1MiB", "600s"));
    std::thread::sleep(Duration::from_secs(2));
    pipeline.watcher.kill9();
    std::fs::remove_dir_all(&pipeline.watch_state).unwrap();
    let placed_before_restart = status_u64(&pipeline.status().expect("status"), "placed_bytes");
    pipeline.watcher.start();
    std::thread::sleep(Duration::from_secs(2));
    sim.stop();
    let second_files = files_of_run(&pipeline.source, "r2");
    pipeline.wait_sealed(first_files + second_files, Duration::from_secs(120));
    pipeline.wait_identical(Duration::from_secs(60));

    // Once more with everything complete: wipe and restart; nothing moves.
    pipeline.watcher.stop();
    std::fs::remove_dir_all(&pipeline.watch_state).unwrap();
    let before = pipeline.status().expect("status");
    pipeline.watcher.start();
    // Not a quiet spell of some seconds: the watcher itself says it has
    // reconciled, walked its tree and owes the sink nothing.
    common::wait_until(
        "the restarted watcher to owe nothing after its first walk",
        Duration::from_secs(60),
        || watcher_owes_nothing(watch_port),
    );
    let after = pipeline.status().expect("status");

    let total = total_bytes(&pipeline.source);
    println!(
        "placed before restart {placed_before_restart}; status before {before}; after {after}; source total {total}"
    );
    assert_eq!(
        status_u64(&after, "placed_bytes"),
        total,
        "every byte placed exactly once"
    );
    assert_eq!(
        status_u64(&after, "rewritten_bytes"),
        0,
        "no placed byte was written again"
    );
    assert_eq!(
        status_u64(&after, "placed_bytes"),
        status_u64(&before, "placed_bytes")
    );
    assert_eq!(
        status_u64(&after, "duplicate_bytes"),
        status_u64(&before, "duplicate_bytes"),
        "complete files were not even re-sent"
    );
}
