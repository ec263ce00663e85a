//! `tailflight send`, the one-shot copy, against a real sink: a large tree
//! with a file growing while it is sent, a rerun after `kill -9` that sends
//! only the rest, a sink killed and restarted during a send, the exit code
//! of each kind of bad input, and its progress with and without a terminal.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Runs `tailflight send ARGS` to its end.
fn send(args: &[String]) -> Output {
    Command::new(bin())
        .arg("send")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run tailflight send")
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn report(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("send --json printed no report ({e}): {}", text(output)))
}

fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

fn start_sink(dir: &Path, port: u16) -> Proc {
    let sink = Proc::spawn(dir, "sink", &sink_command(dir, port, &[]));
    wait_until("the sink answers", Duration::from_secs(30), || {
        sink_status(&format!("http://127.0.0.1:{port}"), &[]).is_some()
    });
    sink
}

/// Writes `count` files of pseudo-random bytes, sizes spread from empty to
/// `largest`, under `dir` in a few subdirectories.
fn write_tree(dir: &Path, count: usize, largest: usize) -> u64 {
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut total = 0;
    for i in 0..count {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let size = match i % 10 {
            0 => 0,
            1..=6 => (seed >> 40) as usize % 8192,
            _ => (seed >> 33) as usize % largest,
        };
        let sub = dir.join(format!("d{}", i % 7)).join(format!("e{}", i % 3));
        std::fs::create_dir_all(&sub).unwrap();
        let bytes: Vec<u8> = (0..size).map(|j| (j as u64 ^ seed) as u8).collect();
        std::fs::write(sub.join(format!("f{i:04}.dat")), &bytes).unwrap();
        total += size as u64;
    }
    total
}

fn outcomes(report: &serde_json::Value) -> Vec<String> {
    report["files"]
        .as_array()
        .expect("files in the report")
        .iter()
        .map(|f| f["outcome"].as_str().unwrap_or("?").to_owned())
        .collect()
}

#[test]
fn a_tree_of_a_thousand_files_arrives_identical_and_sealed() {
    let dir = scratch("send-tree");
    let port = free_port();
    let _sink = start_sink(&dir, port);
    let tree = dir.join("run7");
    write_tree(&tree, 1000, 512 << 10);
    // One file grows while it is sent: appended for 3 s, then left alone.
    let growing = tree.join("d0/growing.xtc2");
    std::fs::write(&growing, b"first frame\n").unwrap();
    let writer = {
        let growing = growing.clone();
        std::thread::spawn(move || {
            let mut file = std::fs::OpenOptions::new()
                .append(true)
                .open(&growing)
                .unwrap();
            for frame in 0..30u32 {
                std::thread::sleep(Duration::from_millis(100));
                file.write_all(&vec![frame as u8; 64 << 10]).unwrap();
            }
        })
    };
    let out = send(&strings(&[
        "-r",
        tree.to_str().unwrap(),
        &format!("http://127.0.0.1:{port}/beamline/2026"),
        "--settle",
        "1s",
        "--json",
    ]));
    writer.join().unwrap();
    assert_eq!(code(&out), 0, "{}", text(&out));
    let report = report(&out);
    let outcomes = outcomes(&report);
    assert_eq!(outcomes.len(), 1001);
    assert!(outcomes.iter().all(|o| o == "sealed"), "{outcomes:?}");
    let grown = report["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["key"] == "2026/run7/d0/growing.xtc2")
        .expect("the growing file in the report");
    assert_eq!(
        grown["size"],
        12 + 30 * (64 << 10),
        "sealed at its final size"
    );
    let (same, diff) = verify(&tree, &dir.join("dest/beamline/2026/run7"));
    assert!(same, "{diff}");
    let status = sink_status(&format!("http://127.0.0.1:{port}"), &[]).unwrap();
    assert_eq!(status_u64(&status, "sealed_files"), 1001, "{status}");
}

#[test]
fn a_rerun_after_kill_9_sends_only_the_rest() {
    let dir = scratch("send-resume");
    let port = free_port();
    let _sink = start_sink(&dir, port);
    let tree = dir.join("calib");
    let total = write_tree(&tree, 24, 12 << 20);
    let dest = dir.join("dest/cal/calib");
    let url = format!("http://127.0.0.1:{port}/cal");
    let mut first = Command::new(bin())
        .args([
            "send",
            "-r",
            tree.to_str().unwrap(),
            &url,
            "--settle",
            "100ms",
            "--limit-rate",
            "16MiB",
            "-q",
        ])
        .spawn()
        .unwrap();
    wait_until(
        "a third of the tree is at the sink",
        Duration::from_secs(60),
        || tree_bytes(&dest) >= total / 3,
    );
    first.kill().unwrap();
    let _ = first.wait();
    assert!(
        tree_bytes(&dest) < total,
        "the first send was cut before it ended"
    );
    let out = send(&strings(&[
        "-r",
        tree.to_str().unwrap(),
        &url,
        "--settle",
        "100ms",
        "--json",
    ]));
    assert_eq!(code(&out), 0, "{}", text(&out));
    let report = report(&out);
    let number = |field: &str| {
        report[field]
            .as_u64()
            .unwrap_or_else(|| panic!("{field} in {report}"))
    };
    assert_eq!(number("total_bytes"), total);
    assert!(number("already_bytes") >= total / 4, "{report}");
    assert_eq!(
        number("already_bytes") + number("sent_bytes"),
        total,
        "{report}"
    );
    // The wire carries the rest and its framing, not the tree again.
    assert!(
        number("wire_bytes") < total - number("already_bytes") + (1 << 20),
        "{report}"
    );
    let (same, diff) = verify(&tree, &dest);
    assert!(same, "{diff}");
}

#[test]
fn a_send_outlives_a_sink_restart() {
    let dir = scratch("send-sink-restart");
    let port = free_port();
    let mut sink = start_sink(&dir, port);
    let tree = dir.join("run8");
    let total = write_tree(&tree, 16, 8 << 20);
    let dest = dir.join("dest/b/run8");
    let mut sending = Command::new(bin())
        .args([
            "send",
            "-r",
            tree.to_str().unwrap(),
            &format!("http://127.0.0.1:{port}/b"),
            "--settle",
            "100ms",
            "--limit-rate",
            "12MiB",
            "-q",
        ])
        .spawn()
        .unwrap();
    wait_until(
        "a quarter of the tree is at the sink",
        Duration::from_secs(60),
        || tree_bytes(&dest) >= total / 4,
    );
    sink.kill9();
    std::thread::sleep(Duration::from_secs(1));
    sink.start();
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(status) = sending.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the send did not end after the sink came back"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(status.code(), Some(0));
    let (same, diff) = verify(&tree, &dest);
    assert!(same, "{diff}");
}

#[test]
fn bad_input_gets_its_exit_code_and_reason() {
    let dir = scratch("send-bad-input");
    let port = free_port();
    let _sink = start_sink(&dir, port);
    let url = format!("http://127.0.0.1:{port}/x");
    let good = dir.join("good.dat");
    std::fs::write(&good, b"good bytes").unwrap();
    let arg = |path: &Path| path.to_str().unwrap().to_owned();
    let expect = |args: Vec<String>, want: i32, says: &str| {
        let out = send(&args);
        let said = text(&out);
        assert_eq!(code(&out), want, "send {args:?}: {said}");
        assert!(
            said.contains(says),
            "send {args:?} should say {says:?}: {said}"
        );
    };
    // A missing path: the rest is sent, the run is partial.
    expect(
        vec![arg(&dir.join("missing.dat")), arg(&good), url.clone()],
        3,
        "no such file",
    );
    // A symbolic link is not followed.
    let link = dir.join("link.dat");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    expect(vec![arg(&link), url.clone()], 3, "symbolic link");
    // A directory without -r.
    expect(vec![arg(&dir.join("dest")), url.clone()], 3, "give -r");
    // A file still growing, with --no-follow: sent up to its size, unsealed.
    let fresh = dir.join("fresh.dat");
    std::fs::write(&fresh, b"still being written").unwrap();
    expect(
        vec![
            arg(&fresh),
            url.clone(),
            "--no-follow".into(),
            "--settle".into(),
            "1h".into(),
        ],
        3,
        "incomplete",
    );
    // A file it may not read.
    let secret = dir.join("secret.dat");
    std::fs::write(&secret, b"secret").unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
    let as_nobody = unprivileged_bin(&dir);
    let out = Command::new(&as_nobody[0])
        .args(&as_nobody[1..])
        .args(["send", &arg(&secret), &url])
        .output()
        .unwrap();
    assert_eq!(code(&out), 3, "{}", text(&out));
    assert!(text(&out).contains("Permission denied"), "{}", text(&out));
    // A destination the sink refuses: a link where a directory would be.
    std::fs::create_dir_all(dir.join("dest/x")).unwrap();
    std::os::unix::fs::symlink(dir.join("elsewhere"), dir.join("dest/x/escape")).unwrap();
    expect(vec![arg(&good), format!("{url}/escape")], 4, "symlink");
    assert!(
        !dir.join("elsewhere").exists(),
        "nothing was written through the link"
    );
    // No sink at all.
    let nowhere = format!("http://127.0.0.1:{}/x", free_port());
    expect(
        vec![arg(&good), nowhere, "--retry-for".into(), "2s".into()],
        5,
        "unreachable",
    );
    // The caller's mistakes.
    expect(vec![arg(&good), "ftp://host/x".into()], 2, "http");
    expect(vec![arg(&good), format!("{url}/../up")], 2, "..");
}

/// The command that runs the binary as an unprivileged user when the tests
/// run as root (root reads any file): a copy of the binary they may run.
fn unprivileged_bin(dir: &Path) -> Vec<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return vec![bin().display().to_string()];
    }
    let copy = dir.join("tailflight-unprivileged");
    std::fs::copy(bin(), &copy).unwrap();
    for open_up in [dir, copy.as_path()] {
        std::fs::set_permissions(open_up, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
    }
    strings(&[
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
    ])
    .into_iter()
    .chain([copy.display().to_string()])
    .collect()
}

#[test]
fn progress_shows_on_a_terminal_and_as_lines_without_one() {
    let dir = scratch("send-progress");
    let port = free_port();
    let _sink = start_sink(&dir, port);
    let tree = dir.join("run9");
    let total = write_tree(&tree, 12, 8 << 20);
    // Paced to take a few seconds, so that progress has time to show.
    let rate = |seconds: u64| (total / seconds).max(64 << 10).to_string();
    // Without a terminal: periodic lines on stderr, then the summary.
    let out = send(&strings(&[
        "-r",
        tree.to_str().unwrap(),
        &format!("http://127.0.0.1:{port}/lines"),
        "--settle",
        "100ms",
        "--limit-rate",
        &rate(3),
        "--progress-every",
        "300ms",
    ]));
    assert_eq!(code(&out), 0, "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = said.lines().filter(|l| l.starts_with("send: ")).collect();
    assert!(lines.len() >= 2, "{said}");
    assert!(
        lines
            .iter()
            .all(|l| l.contains(" of ") && l.contains("files ")),
        "{said}"
    );
    assert!(said.contains("sent 12 of 12 files"), "{said}");
    // On a terminal (tmux): a bar with bytes, rate, ETA and files.
    let session = format!("send-progress-{}", std::process::id());
    let tmux = |args: &[&str]| {
        Command::new("tmux")
            .args(["-L", &session])
            .args(args)
            .output()
            .expect("run tmux (ops/test.sh installs it)")
    };
    let command = format!(
        "{} send -r {} http://127.0.0.1:{port}/bar --settle 100ms --limit-rate {}; sleep 30",
        bin().display(),
        tree.display(),
        rate(4)
    );
    assert!(
        tmux(&[
            "new-session",
            "-d",
            "-s",
            &session,
            "-x",
            "160",
            "-y",
            "20",
            &command
        ])
        .status
        .success()
    );
    let capture = || {
        String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", &session]).stdout).into_owned()
    };
    let mut seen_bar = String::new();
    wait_until(
        "the summary on the terminal",
        Duration::from_secs(60),
        || {
            let screen = capture();
            if screen.contains("ETA") {
                seen_bar = screen.clone();
            }
            screen.contains("sent 12 of 12 files")
        },
    );
    let _ = tmux(&["kill-server"]);
    assert!(
        seen_bar.contains("files ") && seen_bar.contains("MiB"),
        "the bar: {seen_bar}"
    );
}

#[test]
fn a_file_changed_since_it_was_sent_goes_again_whole() {
    let dir = scratch("send-changed");
    let port = free_port();
    let _sink = start_sink(&dir, port);
    let file = dir.join("calib.h5");
    let mut bytes: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
    std::fs::write(&file, &bytes).unwrap();
    let url = format!("http://127.0.0.1:{port}/c");
    let args = strings(&[file.to_str().unwrap(), &url, "--settle", "0s", "--json"]);
    let first = send(&args);
    assert_eq!(code(&first), 0, "{}", text(&first));
    // Rewritten in place: the same size and the same head, other bytes past it.
    bytes[700_000..700_016].copy_from_slice(b"rewritten bytes!");
    std::fs::write(&file, &bytes).unwrap();
    let second = send(&args);
    assert_eq!(code(&second), 0, "{}", text(&second));
    assert_eq!(outcomes(&report(&second)), ["sealed"], "{}", text(&second));
    assert_eq!(std::fs::read(dir.join("dest/c/calib.h5")).unwrap(), bytes);
    // Unchanged since: checked, not sent.
    let third = send(&args);
    assert_eq!(code(&third), 0, "{}", text(&third));
    let report = report(&third);
    assert_eq!(outcomes(&report), ["already-sealed"]);
    assert_eq!(report["sent_bytes"], 0);
}
