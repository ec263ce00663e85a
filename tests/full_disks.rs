//! Full disks (issue 32, items 5 and 7), on size-limited tmpfs mounts the
//! tests make (they need root, as CI has; elsewhere they say so and pass
//! without checking anything).
//!
//! - The sink's root fills: writes fail with ENOSPC, each batch is refused
//!   as retryable with the file and the full filesystem named, the sink
//!   stays healthy and keeps answering, and once the filesystem is grown
//!   the transfer completes identical, without a restart.
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
            println!(
                "skipped: cannot mount a tmpfs at {} (needs root)",
                at.display()
            );
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
