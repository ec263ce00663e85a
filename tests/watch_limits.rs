//! A tree larger than inotify's watch limit: the watcher runs in a user
//! namespace of its own whose `user.max_inotify_watches` is 20, over a tree
//! of 61 directories, asked for fanotify (which a user namespace cannot
//! have: it falls back to inotify and says why). It must say, once, how
//! many directories it cannot watch and which sysctl limits it, show them
//! in its status, poll the files under them and find new ones by rescans:
//! every file, growing in a watched or an unwatched directory, arrives
//! identical and sealed, and the sink's audit is clean.
//!
//! Waits are hang guards only; nothing asserts how fast.

mod common;

use std::fs::File;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use common::{Proc, free_port, http_get, scratch, sink_command, strings, verify, wait_until};

/// Far above what any run needs: only stops a hung test.
const TIMEOUT: Duration = Duration::from_secs(120);
const WATCH_LIMIT: u32 = 20;
const DIRS: usize = 30;

/// Runs the binary in a new user namespace (root mapped to us) whose
/// inotify watch limit is `limit`.
fn under_watch_limit(limit: u32) -> Vec<String> {
    strings(&[
        "unshare",
        "--user",
        "--map-root-user",
        "sh",
        "-c",
        &format!("echo {limit} > /proc/sys/user/max_inotify_watches && exec \"$@\""),
        "sh",
    ])
}

fn status(port: u16) -> Option<serde_json::Value> {
    let (code, body) = http_get(port, "/api/status")?;
    (code == 200).then(|| serde_json::from_str(&body).ok())?
}

fn discovery(port: u16) -> Option<serde_json::Value> {
    Some(status(port)?["sources"][0]["discovery"].clone())
}

/// Deterministic content, distinct per file and round.
fn chunk(file: usize, round: usize) -> Vec<u8> {
    (0..4096 + file * 7 + round * 13)
        .map(|i| (i * 31 + file * 17 + round * 5) as u8)
        .collect()
}

fn sealed(endpoint: &str) -> u64 {
    common::sink_status(endpoint, &[]).map_or(0, |s| common::status_u64(&s, "sealed_files"))
}

#[test]
fn directories_past_the_inotify_limit_are_polled_and_nothing_is_missed() {
    let dir = scratch("watch-limit");
    let source = dir.join("source");
    // 1 + 30 + 30 directories, each with a file before the start.
    for d in 0..DIRS {
        std::fs::create_dir_all(source.join(format!("d{d:02}/sub"))).unwrap();
        std::fs::write(source.join(format!("d{d:02}/early.dat")), chunk(d, 0)).unwrap();
    }
    let port = free_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut sink = Proc::spawn(&dir, "sink", &sink_command(&dir, port, &[]));
    let metrics = free_port();
    let mut args = strings(&[
        "watch",
        "--source",
        "src",
        "--seal-idle",
        "1s",
        "--rescan",
        "1s",
        "--events",
        "fanotify",
        "--to",
        &endpoint,
        "--metrics-listen",
        &format!("127.0.0.1:{metrics}"),
    ]);
    args.extend(["--dir".into(), source.display().to_string()]);
    args.extend([
        "--state".into(),
        dir.join("watch-state").display().to_string(),
    ]);
    let mut watcher = Proc::spawn_through(&dir, "watcher", &under_watch_limit(WATCH_LIMIT), &args);

    wait_until(
        "the watcher to report directories it cannot watch",
        TIMEOUT,
        || discovery(metrics).is_some_and(|d| d["unwatched_directories"].as_u64() > Some(0)),
    );
    let seen = discovery(metrics).unwrap_or_default();
    assert_eq!(seen["events"], "inotify", "{seen}");
    assert!(
        seen["watched_directories"].as_u64() <= Some(u64::from(WATCH_LIMIT)),
        "{seen}"
    );
    assert_eq!(
        seen["watched_directories"].as_u64().unwrap_or(0)
            + seen["unwatched_directories"].as_u64().unwrap_or(0),
        1 + 2 * DIRS as u64,
        "{seen}"
    );

    // Files growing in every directory, watched or not, and files in a
    // directory made now (past the limit too).
    let mut growing: Vec<(usize, File)> = (0..DIRS)
        .map(|d| {
            let path = source.join(format!("d{d:02}/sub/growing.dat"));
            (d, File::create(path).unwrap())
        })
        .collect();
    for round in 1..=3 {
        for (d, file) in &mut growing {
            file.write_all(&chunk(*d, round)).unwrap();
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(growing);
    std::fs::create_dir_all(source.join("late/deeper")).unwrap();
    std::fs::write(source.join("late/deeper/new.dat"), chunk(99, 1)).unwrap();

    let files = common::list_files(&source).len() as u64;
    let dest = dir.join("dest").join("src");
    wait_until("every file sealed at the sink", TIMEOUT, || {
        sealed(&endpoint) >= files
    });
    let (identical, report) = verify(&source, &dest);
    assert!(
        identical,
        "{report}\n--- watcher log ---\n{}",
        watcher.log_text()
    );
    let seen = discovery(metrics).unwrap_or_default();
    assert!(seen["polled_files"].as_u64() > Some(0), "{seen}");
    assert!(
        seen["unwatched_reason"]
            .as_str()
            .is_some_and(|r| r.contains("fs.inotify.max_user_watches")),
        "{seen}"
    );

    watcher.stop();
    sink.stop();
    common::assert_clean_audit(&dir.join("state"));
    let log = watcher.log_text();
    assert!(
        log.contains("cannot use fanotify") && log.contains("CAP_SYS_ADMIN"),
        "the fallback to inotify is not told:\n{log}"
    );
    assert_eq!(
        log.matches("directories cannot be watched").count(),
        1,
        "the watch limit is not told exactly once:\n{log}"
    );
    assert!(log.contains("fs.inotify.max_user_watches"), "{log}");
    assert_not_in_dest_only(&source, &dest);
}

/// Nothing at the destination that the source does not hold.
fn assert_not_in_dest_only(source: &Path, dest: &Path) {
    let extra: Vec<String> = common::list_files(dest)
        .into_iter()
        .filter(|f| !source.join(f).exists())
        .collect();
    assert!(extra.is_empty(), "only at the destination: {extra:?}");
}
