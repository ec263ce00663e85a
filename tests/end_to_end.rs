//! End to end, as separate processes: the simulator writes growing files in
//! four streams with chunk rotation while a watcher streams them to a sink.
//! The destination must end byte-identical, with every `.inprogress` chunk
//! renamed to its final name, over plaintext, over mutual TLS and in polling
//! mode.

mod common;

use std::time::Duration;

use common::{Pipeline, PipelineOptions, files_of_run, list_files, scratch, simulate};

fn stream_and_check(name: &str, options: PipelineOptions) {
    let dir = scratch(name);
    let pipeline = Pipeline::start(&dir, options);
    simulate(
        &pipeline.source,
        &[
            "--streams",
            "4",
            "--rate",
            "100",
            "--frame",
            "16KiB",
            "--chunk",
            "2MiB",
            "--duration",
            "3s",
        ],
    );
    let files = files_of_run(&pipeline.source, "r0001");
    assert!(
        files > 5,
        "the simulator should have rotated chunks ({files} files)"
    );
    pipeline.wait_sealed(files, Duration::from_secs(120));
    pipeline.wait_identical(Duration::from_secs(60));

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
