//! The soak's short runs. `ops/soak.sh --quick --cycles 8` kills the sink,
//! the watcher and both with SIGKILL and cuts the network (a SIGSTOP
//! freeze on loopback when not root), twice each in a random order, then
//! verifies and audits. `--faults cut --memory-bound 1.5` keeps one sink
//! and one watcher through eight cuts and bounds the sink's resident memory
//! (from its status) after the last cut by 1.5x that after the first. The
//! full runs (100 cycles; 40 cuts) are `ops/soak.sh` by hand (results under
//! `ops/soak/results/`).
//!
//! Asserts behaviour only: the script exits 0, and its summary reports every
//! cycle done, verify identical and the audit clean. Its timings are not
//! asserted, nor its memory figures but for the bound on the memory left
//! after cuts.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `ops/soak.sh` with `flags` in a scratch dir named `name`; returns
/// the scratch dir (removed when dropped), its work dir and its summary
/// once the script succeeded.
fn soak(name: &str, flags: &[&str]) -> (common::Scratch, PathBuf, String) {
    let dir = common::scratch(name);
    let workdir = dir.join("work");
    let summary = dir.join("summary.md");
    let seed = std::env::var("TAILFLIGHT_SOAK_SEED").unwrap_or_else(|_| {
        (std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            % (1 << 32))
            .to_string()
    });
    println!("soak seed: {seed} (set TAILFLIGHT_SOAK_SEED to replay)");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("ops/soak.sh");
    // The binary Cargo built for this test: the script then builds nothing
    // (a nested `cargo build` would wait on the lock this `cargo test` holds).
    let output = Command::new("bash")
        .arg(&script)
        .args(flags)
        .args(["--seed", &seed])
        .arg("--workdir")
        .arg(&workdir)
        .arg("--summary")
        .arg(&summary)
        .arg("--binary")
        .arg(common::bin())
        .output()
        .expect("run ops/soak.sh");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    println!("{text}");
    let report = std::fs::read_to_string(&summary).unwrap_or_default();
    assert!(
        output.status.success(),
        "the soak failed ({}); its work dir: {}\n{report}",
        output.status,
        workdir.display()
    );
    (dir, workdir, report)
}

fn assert_clean(report: &str, cycles: usize) {
    for expected in [
        format!("# Soak: {cycles} cycles — PASSED"),
        format!("| **all** | {cycles} |"),
        "verify (byte-identical, after both stopped): **identical**".into(),
        "audit (manifest, then manifest vs files): **clean**".into(),
        "overlapping placements 0, record mismatches 0, manifest-vs-files problems 0".into(),
        "panics in any log: 0".into(),
    ] {
        assert!(
            report.contains(&expected),
            "the summary lacks {expected:?}:\n{report}"
        );
    }
}

/// Everything the soak made is gone: no process of its binary left running.
fn assert_nothing_left(workdir: &Path) {
    let bin = workdir.join("bin/tailflight");
    let left = Command::new("pgrep")
        .arg("-f")
        .arg(bin.display().to_string())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(left.trim().is_empty(), "processes left behind: {left}");
}

#[test]
fn a_short_soak_ends_identical_and_audited_clean() {
    let (_scratch, workdir, report) = soak("soak", &["--quick", "--cycles", "8"]);
    assert_clean(&report, 8);
    // Each kind of fault happened (the faults come in shuffled blocks of
    // one of each kind): two of each in eight cycles.
    for kind in ["kill-sink", "kill-watcher", "kill-both", "cut"] {
        assert!(
            report.contains(&format!("| {kind} | 2 |")),
            "{kind} did not happen twice:\n{report}"
        );
    }
    // Samples were taken of both processes.
    let samples = std::fs::read_to_string(workdir.join("samples.csv")).expect("samples.csv");
    for process in [",sink,", ",watcher,"] {
        assert!(
            samples.contains(process),
            "no samples of{process}in samples.csv"
        );
    }
    assert_nothing_left(&workdir);
}

#[test]
fn the_sinks_memory_stays_flat_through_repeated_cuts() {
    let (_scratch, workdir, report) = soak(
        "soak-cuts",
        &[
            "--quick",
            "--faults",
            "cut",
            "--cycles",
            "8",
            "--memory-bound",
            "1.5",
        ],
    );
    assert_clean(&report, 8);
    assert!(
        report.contains("| cut | 8 |"),
        "not every cycle was a cut:\n{report}"
    );
    // The bound is read from the sink's status (resident bytes) after the
    // first and the last cut; the script fails beyond it, and says so.
    assert!(
        report.contains("bound 1.5×: **within**"),
        "no memory bound judged within:\n{report}"
    );
    assert_nothing_left(&workdir);
}
