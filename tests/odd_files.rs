//! Odd entries in a watched tree: names with a newline
//! and of 255 bytes are transferred; a name that is not UTF-8, symbolic
//! links (a source directory replaced by one among them) and a FIFO are
//! not, and the watcher says so, in its log and its status, never silently;
//! files that vanish between their event and their opening leave nothing
//! behind that stops the rest. Every other file arrives identical, and the
//! audit is clean.
//!
//! Waits are hang guards only; nothing asserts how fast.

mod common;

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use common::{Pipeline, PipelineOptions, free_port, http_get, wait_until};

const TIMEOUT: Duration = Duration::from_secs(120);

fn discovery(port: u16) -> Option<serde_json::Value> {
    let (code, body) = http_get(port, "/api/status")?;
    let status: serde_json::Value = (code == 200).then(|| serde_json::from_str(&body).ok())??;
    Some(status["sources"][0]["discovery"].clone())
}

fn content(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + seed * 13) as u8).collect()
}

fn placed(dest: &Path, rel: &str, bytes: &[u8]) -> bool {
    std::fs::read(dest.join(rel)).is_ok_and(|held| held == bytes)
}

#[test]
fn odd_names_links_fifos_and_vanishing_files() {
    let metrics = free_port();
    let mut pipeline = Pipeline::in_scratch(
        "odd-files",
        PipelineOptions {
            extra_watch_args: vec!["--metrics-listen".into(), format!("127.0.0.1:{metrics}")],
            ..PipelineOptions::default()
        },
    );
    let source = pipeline.source.clone();
    let dest = pipeline.dest();
    wait_until("the watcher serves its status", TIMEOUT, || {
        discovery(metrics).is_some()
    });

    // Transferred: a newline in a name, a 255-byte name, and a directory
    // about to be replaced by a link.
    let newline = "line\nbreak.dat";
    let long = format!("{}.dat", "n".repeat(251));
    std::fs::create_dir_all(source.join("run2")).expect("mkdir");
    let files = [
        (newline.to_string(), content(1, 5000)),
        (long.clone(), content(2, 7000)),
        ("run2/a.dat".to_string(), content(3, 9000)),
    ];
    for (name, bytes) in &files {
        std::fs::write(source.join(name), bytes).expect("write");
    }
    wait_until("the odd names arrive", TIMEOUT, || {
        files.iter().all(|(name, bytes)| placed(&dest, name, bytes))
    });

    // Not transferred, and said so: a name that is not UTF-8, a FIFO, a
    // link to a file, and the directory replaced by a link to another one.
    let elsewhere = pipeline.dir.join("elsewhere");
    std::fs::create_dir_all(&elsewhere).expect("mkdir");
    std::fs::write(elsewhere.join("outside.dat"), b"not ours").expect("write");
    let odd = source.join(std::ffi::OsStr::from_bytes(b"bad-\xff.dat"));
    std::fs::write(&odd, b"a name the wire cannot carry").expect("write");
    let fifo = source.join("pipe");
    let fifo_name = std::ffi::CString::new(fifo.as_os_str().as_bytes()).expect("path");
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(
        unsafe { libc::mkfifo(fifo_name.as_ptr(), 0o644) },
        0,
        "mkfifo"
    );
    std::os::unix::fs::symlink(source.join(newline), source.join("link.dat")).expect("symlink");
    std::fs::rename(source.join("run2"), source.join("run2.moved")).expect("move run2 away");
    std::os::unix::fs::symlink(&elsewhere, source.join("run2")).expect("symlink run2");

    // Files that vanish between their event and their opening.
    std::fs::create_dir_all(source.join("vanish")).expect("mkdir");
    for i in 0..200 {
        let path = source.join(format!("vanish/v{i}.dat"));
        std::fs::write(&path, content(i, 100)).expect("write");
        std::fs::remove_file(&path).expect("remove");
    }
    // And one that stays, written after them.
    std::fs::write(source.join("vanish/stays.dat"), content(9, 3000)).expect("write");

    wait_until("the skipped entries are in the status", TIMEOUT, || {
        discovery(metrics).is_some_and(|d| d["skipped_entries"].as_u64() == Some(4))
    });
    let seen = discovery(metrics).unwrap_or_default();
    let examples = seen["skipped_examples"].to_string();
    for expected in ["bad-", "pipe", "link.dat", "run2: a symbolic link"] {
        assert!(
            examples.contains(expected),
            "{expected} not named in {examples}"
        );
    }
    let log = pipeline.watcher.log_text();
    for expected in ["not transferred", "bad-", "pipe", "run2"] {
        assert!(log.contains(expected), "the log does not name {expected}");
    }
    wait_until(
        "the moved directory and the late file arrive",
        TIMEOUT,
        || {
            placed(&dest, "run2.moved/a.dat", &files[2].1)
                && placed(&dest, "vanish/stays.dat", &content(9, 3000))
        },
    );
    assert!(
        !dest.join("run2/outside.dat").exists(),
        "a link was followed out of the tree"
    );

    // With the entries that cannot be transferred gone, the trees match.
    std::fs::remove_file(&odd).expect("remove");
    pipeline.wait_identical(TIMEOUT);
    pipeline.watcher.stop();
    pipeline.sink.stop();
    common::assert_clean_audit(&pipeline.sink_state);
}
