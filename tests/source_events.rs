mod common;

// What the pipeline does when the source tree changes under it: a file is
// truncated and rewritten, deleted and created again (possibly on the same
// inode), deleted for good, renamed while it grows or after its seal,
// replaced by a rename over it, moved into the tree from outside (alone or
// with its directory), or created in a directory that did not exist when the
// watcher started. Each scenario runs with inotify and with `--poll`; those
// that hinge on which events arrive (deletion, moves, new directories,
// replacement) also with fanotify.
// Tests marked `ignore` show product bugs (see their reasons).
//
// Every file's content comes from its own deterministic byte stream, so a
// destination that mixed bytes of two generations (or two files) would not
// compare equal. Waits are hang guards only; nothing asserts how fast.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Pipeline, PipelineOptions};

/// Far above what any run needs: only stops a hung test.
const TIMEOUT: Duration = Duration::from_secs(60);
const KIB: usize = 1024;

/// `len` bytes of a simple LCG stream; distinct seeds give distinct content
/// from the very first byte (so the head fingerprints differ too).
fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u8
        })
        .collect()
}

/// Creates (or replaces the content of) a file, written and synced.
fn write_file(path: &Path, data: &[u8]) {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    let mut file = File::create(path).unwrap();
    file.write_all(data).unwrap();
    file.sync_all().unwrap();
}

/// Creates a file and keeps it open until the destination holds all of it,
/// then closes it. The watcher has surely set up its inotify watches by then,
/// so it sees the close (a close it misses is another matter: see
/// `directory_moved_in_*`).
fn write_transferred(p: &Pipeline, rel: &str, data: &[u8]) {
    let path = p.source.join(rel);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    let mut file = File::create(&path).unwrap();
    file.write_all(data).unwrap();
    file.sync_all().unwrap();
    wait_dest(p, rel, data, &format!("{rel} at the destination"));
    drop(file);
}

fn append(file: &mut File, data: &[u8]) {
    file.write_all(data).unwrap();
    file.sync_data().unwrap();
}

fn inode(path: &Path) -> (u64, u64) {
    let meta = std::fs::metadata(path).unwrap();
    (meta.dev(), meta.ino())
}

/// How the watcher hears of changes (its `--events`).
#[derive(Clone, Copy)]
enum Events {
    Inotify,
    Fanotify,
    Poll,
}

impl Events {
    fn as_str(self) -> &'static str {
        match self {
            Self::Inotify => "inotify",
            Self::Fanotify => "fanotify",
            Self::Poll => "poll",
        }
    }
}

fn start(name: &str, events: Events) -> Pipeline {
    let p = Pipeline::in_scratch(
        &format!("{name}-{}", events.as_str()),
        PipelineOptions {
            extra_watch_args: vec!["--events".into(), events.as_str().into()],
            ..Default::default()
        },
    );
    if let Events::Fanotify = events {
        common::wait_until(
            "the watcher to say how it hears of changes",
            TIMEOUT,
            || {
                let log = p.watcher.log_text();
                log.contains("through a fanotify mark") || log.contains("cannot use fanotify")
            },
        );
        assert!(
            !p.watcher.log_text().contains("cannot use fanotify"),
            "fanotify is not in use (this test needs CAP_SYS_ADMIN):\n{}",
            p.watcher.log_text()
        );
    }
    p
}

fn dest_of(p: &Pipeline, rel: &str) -> PathBuf {
    p.dest().join(rel)
}

fn dest_is(p: &Pipeline, rel: &str, expected: &[u8]) -> bool {
    std::fs::read(dest_of(p, rel)).is_ok_and(|d| d == expected)
}

fn sealed_files(p: &Pipeline) -> Option<u64> {
    p.status().map(|s| common::status_u64(&s, "sealed_files"))
}

fn log_tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// What a failed wait shows: both trees, the sink's counters, the logs.
fn diagnostics(p: &Pipeline) -> String {
    let sizes = |root: &Path| {
        common::list_files(root)
            .into_iter()
            .map(|f| {
                let len = std::fs::metadata(root.join(&f)).map_or(0, |m| m.len());
                format!("{f} ({len} bytes)")
            })
            .collect::<Vec<_>>()
    };
    format!(
        "source: {:?}\ndest: {:?}\nstatus: {:?}\n--- sink log ---\n{}\n--- watcher log ---\n{}",
        sizes(&p.source),
        sizes(&p.dest()),
        p.status(),
        log_tail(&p.sink.log_text(), 40),
        log_tail(&p.watcher.log_text(), 60),
    )
}

/// Polls `condition` until it holds; on timeout fails with the diagnostics.
fn wait_for(p: &Pipeline, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while Instant::now() < deadline {
        if condition() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!(
        "timed out after {TIMEOUT:?} waiting for: {what}\n{}",
        diagnostics(p)
    );
}

fn wait_dest(p: &Pipeline, rel: &str, expected: &[u8], what: &str) {
    wait_for(p, what, || dest_is(p, rel, expected));
}

/// Waits until the sink holds at least `count` sealed generations.
fn wait_sealed_at_least(p: &Pipeline, count: u64, what: &str) {
    wait_for(p, what, || sealed_files(p).is_some_and(|n| n >= count));
}

/// Lets the watcher run a few rescans and poll rounds with nothing new to
/// find, so that any late or stray write would have landed by then.
fn settle() {
    std::thread::sleep(Duration::from_secs(3));
}

/// The destination mirrors the source: same files, byte for byte, and
/// nothing else (no stale generation, no leftover in-progress name).
fn assert_mirrors(p: &Pipeline) {
    let (ok, text) = common::verify(&p.source, &p.dest());
    assert!(ok, "verify: {text}\n{}", diagnostics(p));
    assert_eq!(
        common::list_files(&p.dest()),
        common::list_files(&p.source),
        "the destination holds other files than the source\n{}",
        diagnostics(p)
    );
}

/// Stops both processes and checks the sink's manifest: no range was ever
/// recorded twice and every record matches its audit log.
fn stop_and_audit(mut p: Pipeline) {
    p.watcher.stop();
    p.sink.stop();
    let report = common::audit(&p.sink_state);
    assert_eq!(report["overlapping_placements"], 0, "audit: {report:#}");
    assert_eq!(report["record_mismatches"], 0, "audit: {report:#}");
}

/// The pid of this pipeline's watcher process (found by its arguments).
fn watcher_pid(p: &Pipeline) -> Option<u32> {
    let state = p.watch_state.display().to_string();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let is_watcher = args.contains(&&b"watch"[..]) && args.contains(&state.as_bytes());
        if is_watcher {
            return Some(pid);
        }
    }
    None
}

/// Source files the watcher still holds open although they were deleted
/// (their disk space cannot be reclaimed while it does).
fn deleted_files_held(p: &Pipeline) -> Vec<String> {
    let Some(pid) = watcher_pid(p) else {
        return Vec::new();
    };
    let source = p.source.display().to_string();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    fds.flatten()
        .filter_map(|fd| std::fs::read_link(fd.path()).ok())
        .map(|target| target.display().to_string())
        .filter(|target| target.starts_with(&source) && target.ends_with(" (deleted)"))
        .collect()
}

fn assert_no_deleted_file_held(p: &Pipeline) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let held = deleted_files_held(p);
        if held.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            panic!(
                "after {TIMEOUT:?} the watcher still holds deleted source files open: {held:?}\n{}",
                diagnostics(p)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------
// 1. Truncation: the same inode continues as a new generation; the
//    destination is replaced by it, no byte of the old generation remains.

/// `after_seal`: whether the first generation was sealed (and forgotten by the
/// tailer) before the truncation, or was still being tracked. `new_len`: the
/// length of the rewritten content.
fn truncation(name: &str, events: Events, after_seal: bool, new_len: usize) {
    let p = start(name, events);
    let src = p.source.join("t.log");
    let old = content(1, 200 * KIB);
    let new = content(2, new_len);

    write_transferred(&p, "t.log", &old);
    let ino = inode(&src);
    if after_seal {
        wait_sealed_at_least(&p, 1, "the first generation sealed");
    }
    let sealed_before = sealed_files(&p).unwrap_or(0);

    // Truncate through a fresh handle, then write the new content from offset 0.
    let mut file = OpenOptions::new().write(true).open(&src).unwrap();
    file.set_len(0).unwrap();
    file.write_all(&new).unwrap();
    file.sync_all().unwrap();
    drop(file);
    assert_eq!(inode(&src), ino, "truncation keeps the inode");

    wait_dest(
        &p,
        "t.log",
        &new,
        "the destination to equal the rewritten source",
    );
    assert_eq!(
        std::fs::metadata(dest_of(&p, "t.log")).unwrap().len(),
        new.len() as u64
    );
    wait_sealed_at_least(&p, sealed_before + 1, "the new generation sealed");

    settle();
    assert!(
        dest_is(&p, "t.log", &new),
        "the destination changed after it mirrored the source\n{}",
        diagnostics(&p)
    );
    assert_mirrors(&p);
    assert_no_deleted_file_held(&p);
    stop_and_audit(p);
}

#[test]
fn truncation_while_tracked_inotify() {
    truncation("trunc-tracked", Events::Inotify, false, 50 * KIB);
}

#[test]
fn truncation_while_tracked_poll() {
    truncation("trunc-tracked", Events::Poll, false, 50 * KIB);
}

#[test]
fn truncation_after_seal_inotify() {
    truncation("trunc-sealed", Events::Inotify, true, 50 * KIB);
}

#[test]
fn truncation_after_seal_poll() {
    truncation("trunc-sealed", Events::Poll, true, 50 * KIB);
}

/// Truncated and rewritten to exactly its old length (same inode, same size):
/// only the content shows that it is a new generation.
#[test]
fn truncation_same_size_after_seal_inotify() {
    truncation("trunc-same-size", Events::Inotify, true, 200 * KIB);
}

#[test]
fn truncation_same_size_after_seal_poll() {
    truncation("trunc-same-size", Events::Poll, true, 200 * KIB);
}

// ---------------------------------------------------------------------------
// 2. Deleted and created again at the same path (on ext4 a freed inode
//    number is usually handed to the next new file): a new generation.

/// `release`: also check that the watcher lets go of the deleted first file.
fn recreate(name: &str, events: Events, after_seal: bool, new_len: usize, release: bool) {
    let p = start(name, events);
    let src = p.source.join("r.dat");
    let old = content(11, 100 * KIB);
    let new = content(12, new_len);

    write_transferred(&p, "r.dat", &old);
    let old_inode = inode(&src);
    if after_seal {
        wait_sealed_at_least(&p, 1, "the first file sealed");
        // Its descriptor is given back at the seal, so the inode can be freed.
        assert_no_deleted_file_held(&p);
    }
    let sealed_before = sealed_files(&p).unwrap_or(0);

    std::fs::remove_file(&src).unwrap();
    write_file(&src, &new);
    let reused = inode(&src) == old_inode;
    eprintln!("[{name}] new file reused the inode number: {reused}");

    wait_dest(&p, "r.dat", &new, "the destination to equal the new file");
    wait_sealed_at_least(&p, sealed_before + 1, "the new file sealed");

    settle();
    assert!(
        dest_is(&p, "r.dat", &new),
        "the destination changed after it mirrored the source\n{}",
        diagnostics(&p)
    );
    assert_mirrors(&p);
    if release {
        // The replaced generation was deleted at the source: once the new
        // one took its place, the watcher has no reason to keep it open.
        assert_no_deleted_file_held(&p);
    }
    stop_and_audit(p);
}

#[test]
fn recreate_while_tracked_inotify() {
    recreate("recreate-tracked", Events::Inotify, false, 30 * KIB, false);
}

#[test]
fn recreate_while_tracked_poll() {
    recreate("recreate-tracked", Events::Poll, false, 30 * KIB, false);
}

#[test]
fn recreate_while_tracked_releases_old_file_inotify() {
    recreate("recreate-release", Events::Inotify, false, 30 * KIB, true);
}

#[test]
fn recreate_while_tracked_releases_old_file_poll() {
    recreate("recreate-release", Events::Poll, false, 30 * KIB, true);
}

#[test]
fn recreate_after_seal_inotify() {
    recreate("recreate-sealed", Events::Inotify, true, 30 * KIB, true);
}

#[test]
fn recreate_after_seal_poll() {
    recreate("recreate-sealed", Events::Poll, true, 30 * KIB, true);
}

/// The new file has exactly the old size: if the filesystem hands it the
/// freed inode number (ext4 usually does), only its content tells it apart.
#[test]
fn recreate_same_size_after_seal_inotify() {
    recreate("recreate-same-size", Events::Inotify, true, 100 * KIB, true);
}

#[test]
fn recreate_same_size_after_seal_poll() {
    recreate("recreate-same-size", Events::Poll, true, 100 * KIB, true);
}

// ---------------------------------------------------------------------------
// 3. Deletion at the source: the destination keeps the file (a transfer,
//    not a mirror of deletions), and the watcher finishes and lets go of it.

fn deletion(name: &str, events: Events) {
    let p = start(name, events);
    let src = p.source.join("d.dat");
    let data = content(21, 100 * KIB);

    write_transferred(&p, "d.dat", &data);
    std::fs::remove_file(&src).unwrap();

    settle();
    let dest = dest_of(&p, "d.dat");
    assert!(
        dest.is_file(),
        "the destination lost the file deleted at the source\n{}",
        diagnostics(&p)
    );
    assert_eq!(
        std::fs::read(&dest).unwrap(),
        data,
        "the destination changed after the source was deleted"
    );
    wait_sealed_at_least(&p, 1, "the deleted file sealed");
    assert_no_deleted_file_held(&p);
    assert!(dest_is(&p, "d.dat", &data));
    stop_and_audit(p);
}

#[test]
fn deletion_inotify() {
    deletion("delete", Events::Inotify);
}

#[test]
fn deletion_poll() {
    deletion("delete", Events::Poll);
}

#[test]
fn deletion_fanotify() {
    deletion("delete", Events::Fanotify);
}

// ---------------------------------------------------------------------------
// 4. Renamed while it grows, through the same open handle, then renamed to
//    its final name (dropping the in-progress suffix), which seals it.

fn rename_while_growing(name: &str, events: Events) {
    const CHUNK: usize = 64 * KIB;
    let p = start(name, events);
    let data = content(31, 12 * CHUNK);
    let chunks: Vec<&[u8]> = data.chunks(CHUNK).collect();
    let first = p.source.join("g.xtc2.inprogress");
    let second = p.source.join("h.xtc2.inprogress");
    let last = p.source.join("h.xtc2");

    let mut file = OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(&first)
        .unwrap();
    for chunk in &chunks[..4] {
        append(&mut file, chunk);
        std::thread::sleep(Duration::from_millis(50));
    }
    // The watcher follows the file under its first name before the rename.
    wait_for(&p, "the first chunks under the first name", || {
        std::fs::metadata(dest_of(&p, "g.xtc2.inprogress"))
            .is_ok_and(|m| m.len() >= 2 * CHUNK as u64)
    });

    std::fs::rename(&first, &second).unwrap();
    for chunk in &chunks[4..8] {
        append(&mut file, chunk);
        std::thread::sleep(Duration::from_millis(50));
    }
    wait_dest(
        &p,
        "h.xtc2.inprogress",
        &data[..8 * CHUNK],
        "the file under its second name, complete so far",
    );
    assert!(
        !dest_of(&p, "g.xtc2.inprogress").exists(),
        "the first name remains at the destination"
    );

    for chunk in &chunks[8..] {
        append(&mut file, chunk);
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::rename(&second, &last).unwrap();

    // The handle stays open: with inotify the rename alone must seal the file.
    wait_dest(&p, "h.xtc2", &data, "the file under its final name");
    wait_sealed_at_least(&p, 1, "the file sealed by its final rename");
    let leftovers: Vec<String> = common::list_files(&p.dest())
        .into_iter()
        .filter(|f| f.ends_with(".inprogress"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "in-progress files remain at the destination: {leftovers:?}"
    );
    drop(file);

    settle();
    assert_mirrors(&p);
    stop_and_audit(p);
}

#[test]
fn rename_while_growing_inotify() {
    rename_while_growing("rename-growing", Events::Inotify);
}

#[test]
fn rename_while_growing_poll() {
    rename_while_growing("rename-growing", Events::Poll);
}

#[test]
fn rename_while_growing_fanotify() {
    rename_while_growing("rename-growing", Events::Fanotify);
}

// ---------------------------------------------------------------------------
// 5. A file moved into the tree from outside it, and files in directories
//    created after the watcher started (one written at once, one later).

fn arrivals(name: &str, events: Events) {
    let p = start(name, events);
    // The watcher is up and watching once a first file went through.
    write_transferred(&p, "first.dat", &content(40, 10 * KIB));

    // Written and closed outside the tree (same filesystem), then moved in.
    let outside = p.dir.join("outside");
    let moved_data = content(41, 80 * KIB);
    write_file(&outside.join("m.dat"), &moved_data);
    std::fs::rename(outside.join("m.dat"), p.source.join("m.dat")).unwrap();
    wait_dest(&p, "m.dat", &moved_data, "the file moved into the tree");

    // A nested directory made after the start, and a file in it.
    let early = content(42, 70 * KIB);
    write_transferred(&p, "sub/deeper/early.dat", &early);

    // A later file in the (now watched) new directory, grown in two steps.
    let late = content(43, 90 * KIB);
    let late_path = p.source.join("sub/deeper/late.dat");
    let mut file = File::create(&late_path).unwrap();
    append(&mut file, &late[..40 * KIB]);
    wait_dest(
        &p,
        "sub/deeper/late.dat",
        &late[..40 * KIB],
        "the first part of the later file",
    );
    append(&mut file, &late[40 * KIB..]);
    drop(file);
    wait_dest(&p, "sub/deeper/late.dat", &late, "the whole later file");

    wait_sealed_at_least(&p, 4, "all four files sealed");
    settle();
    assert_mirrors(&p);
    stop_and_audit(p);
}

#[test]
fn arrivals_inotify() {
    arrivals("arrivals", Events::Inotify);
}

#[test]
fn arrivals_poll() {
    arrivals("arrivals", Events::Poll);
}

#[test]
fn arrivals_fanotify() {
    arrivals("arrivals", Events::Fanotify);
}

// ---------------------------------------------------------------------------
// 6. A directory of finished files moved into the tree. No close event of
//    these files will ever come: they were closed before the watcher could
//    watch their directory. They must still be transferred, and sealed once
//    idle.

fn directory_moved_in(name: &str, events: Events) {
    let p = start(name, events);
    // The watcher is up and watching once a first file went through.
    write_transferred(&p, "first.dat", &content(50, 10 * KIB));
    wait_sealed_at_least(&p, 1, "the first file sealed");

    let outside = p.dir.join("outside/batch");
    let x = content(51, 60 * KIB);
    let y = content(52, 40 * KIB);
    write_file(&outside.join("x.dat"), &x);
    write_file(&outside.join("y.dat"), &y);
    std::fs::rename(&outside, p.source.join("batch")).unwrap();

    wait_dest(&p, "batch/x.dat", &x, "x.dat of the moved directory");
    wait_dest(&p, "batch/y.dat", &y, "y.dat of the moved directory");
    wait_sealed_at_least(&p, 3, "both files of the moved directory sealed");
    assert_mirrors(&p);
    stop_and_audit(p);
}

#[test]
fn directory_moved_in_inotify() {
    directory_moved_in("dir-moved-in", Events::Inotify);
}

#[test]
fn directory_moved_in_poll() {
    directory_moved_in("dir-moved-in", Events::Poll);
}

#[test]
fn directory_moved_in_fanotify() {
    directory_moved_in("dir-moved-in", Events::Fanotify);
}

// ---------------------------------------------------------------------------
// 7. A sealed file renamed: it is the same file under a new path, so the
//    destination renames it too, without sending its bytes again.

fn rename_after_seal(name: &str, events: Events) {
    let p = start(name, events);
    let data = content(61, 120 * KIB);
    write_transferred(&p, "a.dat", &data);
    wait_sealed_at_least(&p, 1, "a.dat sealed");
    let placed_before = common::status_u64(&p.status().unwrap(), "placed_bytes");

    std::fs::rename(p.source.join("a.dat"), p.source.join("b.dat")).unwrap();
    wait_dest(&p, "b.dat", &data, "the file under its new name");
    settle();
    assert_mirrors(&p);
    let placed_after = common::status_u64(&p.status().unwrap(), "placed_bytes");
    assert_eq!(
        placed_after,
        placed_before,
        "the renamed file's bytes were sent again\n{}",
        diagnostics(&p)
    );
    stop_and_audit(p);
}

#[test]
fn rename_after_seal_inotify() {
    rename_after_seal("rename-sealed", Events::Inotify);
}

#[test]
fn rename_after_seal_poll() {
    rename_after_seal("rename-sealed", Events::Poll);
}

// ---------------------------------------------------------------------------
// 8. Atomic replacement: a new version written to a temporary name and
//    renamed over the file. The destination ends up with the new version at
//    the final name only, and the watcher lets go of the replaced file.

/// `release`: also check that the watcher lets go of the replaced file.
fn replace_by_rename(name: &str, events: Events, after_seal: bool, release: bool) {
    let p = start(name, events);
    let v1 = content(71, 90 * KIB);
    let v2 = content(72, 70 * KIB);
    write_transferred(&p, "c.cfg", &v1);
    if after_seal {
        wait_sealed_at_least(&p, 1, "the first version sealed");
    }
    let sealed_before = sealed_files(&p).unwrap_or(0);

    write_file(&p.source.join("c.cfg.tmp"), &v2);
    std::fs::rename(p.source.join("c.cfg.tmp"), p.source.join("c.cfg")).unwrap();

    wait_dest(&p, "c.cfg", &v2, "the new version at the final name");
    wait_sealed_at_least(&p, sealed_before + 1, "the new version sealed");
    settle();
    assert!(
        dest_is(&p, "c.cfg", &v2),
        "the destination changed after it mirrored the source\n{}",
        diagnostics(&p)
    );
    assert_mirrors(&p);
    if release {
        // The replaced generation was deleted at the source: once the new
        // one took its place, the watcher has no reason to keep it open.
        assert_no_deleted_file_held(&p);
    }
    stop_and_audit(p);
}

#[test]
fn replace_by_rename_while_tracked_inotify() {
    replace_by_rename("replace-tracked", Events::Inotify, false, false);
}

#[test]
fn replace_by_rename_while_tracked_poll() {
    replace_by_rename("replace-tracked", Events::Poll, false, false);
}

#[test]
fn replace_by_rename_while_tracked_releases_old_file_inotify() {
    replace_by_rename("replace-release", Events::Inotify, false, true);
}

#[test]
fn replace_by_rename_while_tracked_releases_old_file_poll() {
    replace_by_rename("replace-release", Events::Poll, false, true);
}

#[test]
fn replace_by_rename_while_tracked_releases_old_file_fanotify() {
    replace_by_rename("replace-release", Events::Fanotify, false, true);
}

#[test]
fn replace_by_rename_after_seal_inotify() {
    replace_by_rename("replace-sealed", Events::Inotify, true, true);
}

#[test]
fn replace_by_rename_after_seal_poll() {
    replace_by_rename("replace-sealed", Events::Poll, true, true);
}
