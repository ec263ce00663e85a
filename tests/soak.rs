//! The soak's short run (issue 32): `ops/soak.sh --quick --cycles 8` kills
//! the sink, the watcher and both with SIGKILL and cuts the network (a
//! SIGSTOP freeze on loopback when not root), twice each in a random order,
//! then verifies and audits. The full 100-cycle run is `ops/soak.sh` by
//! hand (results under `ops/soak/results/`).
//!
//! Asserts behaviour only: the script exits 0, and its summary reports every
//! cycle done, verify identical and the audit clean. Its timings and its
//! memory figures are not asserted (a judgement of growth needs the long run).

mod common;

use std::process::Command;

#[test]
fn a_short_soak_ends_identical_and_audited_clean() {
    let dir = common::scratch("soak");
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
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ops/soak.sh");
    // The binary Cargo built for this test: the script then builds nothing
    // (a nested `cargo build` would wait on the lock this `cargo test` holds).
    let output = Command::new("bash")
        .arg(&script)
        .args(["--quick", "--cycles", "8", "--seed", &seed])
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
    assert!(
        output.status.success(),
        "the soak failed ({}); its work dir: {}",
        output.status,
        workdir.display()
    );
    let report = std::fs::read_to_string(&summary).expect("the soak wrote its summary");
    for expected in [
        "# Soak: 8 cycles — PASSED",
        "| **all** | 8 |",
        "verify (byte-identical, after both stopped): **identical**",
        "audit (manifest, then manifest vs files): **clean**",
        "overlapping placements 0, record mismatches 0, manifest-vs-files problems 0",
        "panics in any log: 0",
    ] {
        assert!(
            report.contains(expected),
            "the summary lacks {expected:?}:\n{report}"
        );
    }
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
    // Everything the soak made is gone: no process of its binary left
    // running, no namespace of its own.
    let bin = workdir.join("bin/tailflight");
    let left = Command::new("pgrep")
        .arg("-f")
        .arg(bin.display().to_string())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    assert!(left.trim().is_empty(), "processes left behind: {left}");
}
