//! Full disks, on size-limited tmpfs mounts
//! the tests make (they need root, as CI has; elsewhere they say so and
//! pass without checking anything).
//!
//! - The sink's root fills: writes fail with ENOSPC, each batch is refused
//!   as retryable with the file and the full filesystem named, the sink
//!   stays healthy and keeps answering, and once the filesystem is grown
//!   the transfer completes identical, without a restart.
//! - The sink's state directory fills: a manifest write fails with ENOSPC,
//!   the sink is poisoned naming its state directory and acknowledges
//!   nothing more; once space is freed and the sink restarted, the
//!   transfer completes identical and the audit is clean.
//! - The watcher's state directory fills: checkpoints fail with a warning
//!   and the transfer goes on to the end; a restart once there is room
//!   finds nothing missing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{
    Pipeline, PipelineOptions, assert_clean_audit, files_of_run, scratch, simulate, status_u64,
};

/// A tmpfs mounted by the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// `None` (with a message) where this process may not mount.
    fn mount(at: &Path, size: &str) -> Option<Self> {
        std::fs::create_dir_all(at).expect("mount point");
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .is_ok_and(|status| status.success());
        if !mounted {
            common::cannot_run(&format!(
                "cannot mount a tmpfs at {} (needs root)",
                at.display()
            ));
            return None;
        }
        Some(Self(at.to_path_buf()))
    }

    fn resize(&self, size: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .expect("run mount");
        assert!(status.success(), "remounting {} failed", self.0.display());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_destination_is_retried_until_there_is_room() {
    let dir = scratch("full-dest");
    let Some(dest) = Tmpfs::mount(&dir.join("dest"), "6m") else {
        return;
    };
    let mut pipeline = Pipeline::start(&dir, PipelineOptions::default());
    simulate(
        &pipeline.source,
        &[
            "--streams",
            "2",
            "--rate",
            "200",
            "--frame",
            "64KiB",
            "--chunk",
            "4MiB",
            "--total",
            "16MiB",
        ],
    );
    common::wait_until(
        "the sink refuses for a full disk",
        Duration::from_secs(60),
        || pipeline.sink.log_text().contains("is full ("),
    );
    let log = pipeline.sink.log_text();
    assert!(
        log.contains("No space left on device") && log.contains(&dest.0.display().to_string()),
        "the refusal names neither the error nor the filesystem:\n{log}"
    );
    // Still healthy and answering while the disk is full.
    let status = pipeline.status().expect("status while the disk is full");
    assert!(status["poisoned"].is_null(), "{status}");
    assert!(
        !common::verify(&pipeline.source, &pipeline.dest()).0,
        "everything fit in the full filesystem"
    );
    dest.resize("64m");
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, Duration::from_secs(120));
    pipeline.wait_identical(Duration::from_secs(60));
    let status = pipeline.status().expect("status");
    assert!(status["poisoned"].is_null(), "{status}");
    assert!(status_u64(&status, "placed_bytes") >= 16 << 20, "{status}");
    pipeline.watcher.stop();
    pipeline.sink.stop();
    assert_clean_audit(&pipeline.sink_state);
    drop(pipeline);
    drop(dest);
}

/// Bytes in use on the filesystem at `path`.
fn used_bytes(path: &Path) -> u64 {
    let fs = rustix::fs::statvfs(path).expect("statvfs");
    (fs.f_blocks - fs.f_bfree) * fs.f_frsize
}

/// Fills what is left of the filesystem holding `at` with one file.
fn fill(at: &Path) {
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=1024"])
        .arg(format!("of={}", at.display()))
        .stderr(std::process::Stdio::null())
        .status();
}

#[test]
fn a_full_sink_state_directory_stops_the_acks_until_a_restart() {
    let dir = scratch("full-sink-state");
    // Room for a first start: RocksDB preallocates about 70 MiB for its
    // write-ahead log (1.1 times the largest memtable), and the journal
    // ring is 64 MiB of zeros.
    let Some(state) = Tmpfs::mount(&dir.join("sink-state"), "192m") else {
        return;
    };
    let mut pipeline = Pipeline::start(&dir, PipelineOptions::default());
    simulate(
        &pipeline.source,
        &common::workload("r0001", "2", "1MiB", "2s"),
    );
    let first = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(first, Duration::from_secs(120));

    // Filled while the sink runs, the filesystem would not stop it for
    // long: the log's preallocated 70 MiB take tens of thousands of rounds
    // to use up. A sink started on a filesystem with less room than that
    // has its preallocation refused (RocksDB goes on without one), and its
    // log then needs a new page every few rounds: filled, the next one
    // fails.
    pipeline.sink.stop();
    let headroom = 24 << 20;
    state.resize(&format!("{}k", (used_bytes(&state.0) + headroom) >> 10));
    pipeline.sink.start();
    common::wait_until(
        "the restarted sink answers",
        Duration::from_secs(60),
        || pipeline.status().is_some(),
    );
    let filler = state.0.join("filler");
    fill(&filler);
    simulate(
        &pipeline.source,
        &common::workload("r0002", "2", "1MiB", "2s"),
    );
    let mut poisoned = String::new();
    common::wait_until(
        "a failed manifest write poisons the sink",
        Duration::from_secs(60),
        || {
            let status = pipeline.status();
            let reason = status.as_ref().and_then(|s| s["poisoned"].as_str());
            poisoned = reason.unwrap_or_default().to_string();
            reason.is_some()
        },
    );
    assert!(
        poisoned.contains("No space left on device")
            && poisoned.contains(&pipeline.sink_state.display().to_string()),
        "the reason names neither the error nor the state directory: {poisoned}"
    );
    // Poisoned, it refuses every batch the watcher sends again (as
    // retryable), and the watcher keeps going.
    common::wait_until(
        "the sink refuses the watcher's batches",
        Duration::from_secs(60),
        || {
            pipeline
                .sink
                .log_text()
                .contains("refuses work until restarted")
        },
    );
    assert!(pipeline.watcher.is_running(), "the watcher stopped");

    std::fs::remove_file(&filler).expect("remove the filler");
    pipeline.sink.stop();
    pipeline.sink.start();
    let second = files_of_run(&pipeline.source, "r0002");
    pipeline.wait_sealed(first + second, Duration::from_secs(120));
    pipeline.wait_identical(Duration::from_secs(60));
    let status = pipeline.status().expect("status");
    assert!(status["poisoned"].is_null(), "{status}");
    pipeline.watcher.stop();
    pipeline.sink.stop();
    // Every byte recorded once: none acknowledged was lost from the
    // manifest (its file's seal would then wait forever).
    let report = assert_clean_audit(&pipeline.sink_state);
    assert_eq!(
        report["placed_bytes"].as_u64(),
        Some(common::tree_bytes(&pipeline.source)),
        "{report}"
    );
    drop(pipeline);
    drop(state);
}

#[test]
fn a_full_watcher_state_directory_only_costs_checkpoints() {
    let dir = scratch("full-watch-state");
    let Some(state) = Tmpfs::mount(&dir.join("watch-state"), "16m") else {
        return;
    };
    let mut pipeline = Pipeline::start(&dir, PipelineOptions::default());
    common::wait_until(
        "the watcher's state exists",
        Duration::from_secs(30),
        || std::fs::read_dir(&state.0).is_ok_and(|mut entries| entries.next().is_some()),
    );
    // Fill what is left of the state directory's filesystem.
    let filler = state.0.join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "count=64"])
        .arg(format!("of={}", filler.display()))
        .status();
    simulate(
        &pipeline.source,
        &common::workload("r0001", "2", "1MiB", "3s"),
    );
    let files = files_of_run(&pipeline.source, "r0001");
    pipeline.wait_sealed(files, Duration::from_secs(120));
    pipeline.wait_identical(Duration::from_secs(60));
    assert!(pipeline.watcher.is_running(), "the watcher stopped");
    let log = pipeline.watcher.log_text();
    assert!(
        log.contains("cannot write the watcher's checkpoint"),
        "no warning about the checkpoints:\n{log}"
    );
    // Room again. RocksDB stays read-only after a failed log write until
    // it is opened again: a restarted watcher resumes from its last
    // checkpoint (or reconciles) and finds nothing missing.
    std::fs::remove_file(&filler).expect("remove the filler");
    pipeline.watcher.stop();
    pipeline.watcher.start();
    pipeline.wait_identical(Duration::from_secs(60));
    assert!(
        pipeline.watcher.is_running(),
        "the restarted watcher stopped"
    );
    pipeline.watcher.stop();
    pipeline.sink.stop();
    assert_clean_audit(&pipeline.sink_state);
    drop(pipeline);
    drop(state);
}
