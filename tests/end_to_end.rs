//! End to end, as separate processes: the simulator writes growing files in
//! four streams with chunk rotation while a watcher streams them to a sink.
//! The destination must end byte-identical, with every `.inprogress` chunk
//! renamed to its final name, over plaintext, over mutual TLS (with BLAKE3
//! seals), in polling mode, with fanotify, and with each way the sink has of
//! flushing its files.

mod common;

use std::time::Duration;

use common::{Pipeline, PipelineOptions, files_of_run, list_files, scratch, simulate, workload};

/// Returns the pipeline, still running, for checks of its own.
fn stream_and_check(name: &str, options: PipelineOptions) -> Pipeline {
    let pipeline = Pipeline::in_scratch(name, options);
    let reader = common::LiveReader::start(&pipeline.source, &pipeline.dest());
    simulate(&pipeline.source, &workload("r0001", "4", "2MiB", "3s"));
    let files = files_of_run(&pipeline.source, "r0001");
    assert!(
        files > 5,
        "the simulator should have rotated chunks ({files} files)"
    );
    pipeline.wait_sealed(files, Duration::from_secs(120));
    pipeline.wait_identical(Duration::from_secs(60));
    common::assert_live_reads_match(reader.finish());

    let source_files = list_files(&pipeline.source);
    let dest_files = list_files(&pipeline.dest());
    assert_eq!(
        dest_files, source_files,
        "destination names differ from the source's"
    );
    assert!(
        dest_files.iter().all(|f| !f.ends_with(".inprogress")),
        "in-progress names left behind: {dest_files:?}"
    );
    assert!(dest_files.iter().filter(|f| f.ends_with(".xtc2")).count() as u64 + 1 == files);

    let status = pipeline.status().expect("sink status");
    let total: u64 = source_files
        .iter()
        .map(|f| std::fs::metadata(pipeline.source.join(f)).unwrap().len())
        .sum();
    assert_eq!(
        common::status_u64(&status, "placed_bytes"),
        total,
        "every byte placed exactly once: {status}"
    );
    pipeline
}

#[test]
fn plaintext() {
    stream_and_check("e2e-plain", PipelineOptions::default());
}

#[test]
fn mutual_tls() {
    stream_and_check(
        "e2e-mtls",
        PipelineOptions {
            mtls: true,
            // The other seal digest, verified by the sink like the default.
            extra_watch_args: vec!["--seal-digest".into(), "blake3".into()],
            ..Default::default()
        },
    );
}

#[test]
fn polling() {
    stream_and_check(
        "e2e-poll",
        PipelineOptions {
            poll: true,
            ..Default::default()
        },
    );
}

/// One fanotify mark on the source's filesystem instead of inotify watches
/// (the machine running the tests has CAP_SYS_ADMIN: it is not a fallback).
#[test]
fn fanotify() {
    let pipeline = stream_and_check(
        "e2e-fanotify",
        PipelineOptions {
            extra_watch_args: vec!["--events".into(), "fanotify".into()],
            ..Default::default()
        },
    );
    let log = pipeline.watcher.log_text();
    assert!(
        log.contains("through a fanotify mark") && !log.contains("cannot use fanotify"),
        "fanotify was not used:\n{log}"
    );
}

/// The default (`--sync auto`) mixes syncfs rounds and per-file rounds;
/// each strategy must also work on its own.
#[test]
fn every_sync_strategy() {
    for strategy in ["files", "filesystem"] {
        stream_and_check(
            &format!("e2e-sync-{strategy}"),
            PipelineOptions {
                extra_sink_args: vec!["--sync".into(), strategy.into()],
                ..Default::default()
            },
        );
    }
}

/// `--to A --to B`: files are sharded across two sinks, each file whole on
/// exactly one of them.
#[test]
fn two_sinks_shard_files() {
    use common::{Proc, free_port, strings, verify};
    let dir = scratch("e2e-two-sinks");
    let source = dir.join("source");
    std::fs::create_dir_all(&source).unwrap();
    let mut endpoints = Vec::new();
    let mut sinks = Vec::new();
    for name in ["a", "b"] {
        let port = free_port();
        let mut args = strings(&[
            "sink",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--layout",
            "flat",
        ]);
        args.extend([
            "--root".into(),
            dir.join(format!("dest-{name}")).display().to_string(),
        ]);
        args.extend([
            "--state".into(),
            dir.join(format!("state-{name}")).display().to_string(),
        ]);
        sinks.push(Proc::spawn(&dir, &format!("sink-{name}"), &args));
        endpoints.push(format!("http://127.0.0.1:{port}"));
    }
    let mut args = strings(&[
        "watch",
        "--source",
        "src",
        "--seal-idle",
        "1s",
        "--rescan",
        "1s",
    ]);
    args.extend([
        "--dir".into(),
        source.display().to_string(),
        "--state".into(),
        dir.join("watch-state").display().to_string(),
    ]);
    for endpoint in &endpoints {
        args.extend(["--to".into(), endpoint.clone()]);
    }
    let _watcher = Proc::spawn(&dir, "watcher", &args);
    let readers = ["dest-a", "dest-b"].map(|d| common::LiveReader::start(&source, &dir.join(d)));
    simulate(&source, &workload("r0001", "4", "1MiB", "2s"));
    let expected = files_of_run(&source, "r0001");
    common::wait_until(
        "both sinks to seal every file",
        Duration::from_secs(120),
        || {
            let sealed: u64 = endpoints
                .iter()
                .filter_map(|e| common::sink_status(e, &[]))
                .map(|s| common::status_u64(&s, "sealed_files"))
                .sum();
            sealed >= expected
        },
    );
    // Each sink's files read live, as they grew, match the source.
    let mut together = common::LiveReport::default();
    for reader in readers {
        let report = reader.finish();
        assert!(
            report.mismatched == 0,
            "a live reader read bytes that differ from the source: {report:?}"
        );
        together.bytes_checked += report.bytes_checked;
        together.bytes_checked_growing += report.bytes_checked_growing;
    }
    common::assert_live_reads_match(together);
    let in_a = list_files(&dir.join("dest-a"));
    let in_b = list_files(&dir.join("dest-b"));
    assert!(
        !in_a.is_empty() && !in_b.is_empty(),
        "one sink got nothing: a={in_a:?} b={in_b:?}"
    );
    assert!(
        in_a.iter().all(|f| !in_b.contains(f)),
        "a file landed on both sinks"
    );
    // Each file is whole and identical on the sink it went to.
    let merged = dir.join("merged");
    for (dest, files) in [("dest-a", &in_a), ("dest-b", &in_b)] {
        for f in files {
            let to = merged.join(f);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(dir.join(dest).join(f), to).unwrap();
        }
    }
    let (identical, report) = verify(&source, &merged);
    assert!(identical, "{report}");
}
