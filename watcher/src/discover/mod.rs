//! Finding files and hearing about changes: a recursive walk of the watched
//! tree, and a [`Discovery`] between walks: inotify watches on its
//! directories (`inotify`), one fanotify mark on its filesystem
//! (`fanotify`), or nothing but the passing of time for polling.
//!
//! Events are a hint, never the truth: they can be lost (queue overflow),
//! writes from other nodes of a network filesystem raise none, and a
//! directory may be left unwatched (inotify's watch limit). The tailer
//! therefore stats files itself, polls the files of directories no event
//! reaches, and a periodic walk finds whatever the events missed.

mod fanotify;
mod inotify;

use std::io;
use std::os::fd::BorrowedFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::Duration;

pub use self::fanotify::FsEvents;
pub use self::inotify::Events;

/// A regular file found by a walk.
#[derive(Clone, Debug)]
pub struct Found {
    /// Relative to the watched root, '/'-separated.
    pub path: String,
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Modification time in nanoseconds: tells a rewritten file from an untouched one.
    pub mtime_ns: i64,
    /// Birth time in nanoseconds where the filesystem keeps one: tells a new
    /// file that reused a freed inode number from the file that had it.
    pub born_ns: Option<i64>,
}

/// What a walk found, and what it passed over.
#[derive(Debug, Default)]
pub struct Walked {
    pub files: Vec<Found>,
    /// Directories, relative to the root ("" is the root).
    pub dirs: Vec<String>,
    /// Entries that are not transferred, and why.
    pub skipped: Vec<Skipped>,
}

/// An entry a walk does not transfer: never silently, its watcher says so.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Skipped {
    /// Relative to the root; a name that is not UTF-8 is shown escaped.
    pub path: String,
    pub why: &'static str,
}

/// Walks `root` and returns its regular files (symlinks are not followed)
/// and its directories, both relative to `root`.
#[cfg(test)]
pub fn walk(root: &Path) -> io::Result<Walked> {
    walk_with(root, || {})
}

/// [`walk`], calling `each_dir` before reading each directory: a walk of a
/// large tree on a slow filesystem takes minutes, and whoever watches the
/// walker for signs of life sees them.
pub fn walk_with(root: &Path, mut each_dir: impl FnMut()) -> io::Result<Walked> {
    let mut walked = Walked {
        dirs: vec![String::new()],
        ..Walked::default()
    };
    let mut index = 0;
    while index < walked.dirs.len() {
        each_dir();
        let rel = walked.dirs[index].clone();
        index += 1;
        let entries = match std::fs::read_dir(root.join(&rel)) {
            Ok(entries) => entries,
            // A directory removed between listing and reading is not an error.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied && !rel.is_empty() => {
                walked.skipped.push(Skipped {
                    path: rel,
                    why: "a directory the watcher may not read",
                });
                continue;
            }
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("reading directory {}: {e}", root.join(&rel).display()),
                ));
            }
        };
        let join = |name: &str| {
            if rel.is_empty() {
                name.to_owned()
            } else {
                format!("{rel}/{name}")
            }
        };
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                walked.skipped.push(Skipped {
                    path: join(&format!("{:?}", entry.file_name())),
                    why: "a name that is not UTF-8 (the wire carries UTF-8 paths)",
                });
                continue;
            };
            let path = join(&name);
            // Gone since the directory was listed: nothing to transfer.
            let Ok(meta) = entry.metadata() else { continue };
            let kind = meta.file_type();
            if kind.is_dir() {
                walked.dirs.push(path);
            } else if kind.is_file() {
                walked.files.push(Found {
                    path,
                    dev: meta.dev(),
                    ino: meta.ino(),
                    size: meta.len(),
                    mtime_ns: mtime_ns(&meta),
                    born_ns: born_ns(&meta),
                });
            } else {
                walked.skipped.push(Skipped {
                    path,
                    why: if kind.is_symlink() {
                        "a symbolic link (links are not followed)"
                    } else {
                        "not a regular file (a device, FIFO or socket)"
                    },
                });
            }
        }
    }
    Ok(walked)
}

/// Birth time (statx btime) in nanoseconds, if the filesystem records it.
pub fn born_ns(meta: &std::fs::Metadata) -> Option<i64> {
    let born = meta.created().ok()?;
    let since = born.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(since.as_nanos()).ok()
}

/// Whether two observations of one (device, inode) can be the same file: a
/// freed inode number is reused by the next file created, and only a
/// differing birth time tells them apart (unknown on some filesystems).
pub fn same_birth(a: Option<i64>, b: Option<i64>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    }
}

pub fn mtime_ns(meta: &std::fs::Metadata) -> i64 {
    meta.mtime()
        .saturating_mul(1_000_000_000)
        .saturating_add(meta.mtime_nsec())
}

/// How the watcher hears about changes between walks (`--events`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EventSource {
    /// inotify watches, one per directory.
    #[default]
    Inotify,
    /// One fanotify mark on the watched tree's filesystem (needs
    /// CAP_SYS_ADMIN; inotify is used where it cannot be had).
    Fanotify,
    /// No events: every file is polled (network and parallel filesystems).
    Poll,
}

impl EventSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Inotify => "inotify",
            Self::Fanotify => "fanotify",
            Self::Poll => "poll",
        }
    }
}

/// How much of the tree a [`Discovery`] hears about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// What is in use (after any fallback).
    pub events: EventSource,
    /// Directories whose changes raise events.
    pub watched_dirs: usize,
    /// Directories it tried and failed to watch: their files are polled.
    pub unwatched_dirs: usize,
    /// Why, while any directory is unwatched (a limit and how to raise it).
    pub why_unwatched: Option<String>,
}

/// How the tailer hears about changes between walks.
pub trait Discovery: Send {
    /// Waits up to `timeout` and returns the changes heard of meanwhile.
    fn wait(&mut self, timeout: Duration) -> io::Result<Vec<Change>>;

    /// Starts hearing about a directory (relative to the root); doing so
    /// twice is harmless. A directory it cannot watch is counted in
    /// [`Discovery::coverage`] and left to polling and rescans.
    fn watch_dir(&mut self, rel: &str);

    /// A walk found exactly these directories: forget any others.
    fn walked(&mut self, _dirs: &[String]) {}

    /// Whether changes in this directory (relative to the root) raise events.
    fn covers(&self, dir: &str) -> bool;

    fn coverage(&self) -> Coverage;
}

/// The discovery `wanted` asks for. fanotify falls back to inotify, with a
/// warning saying why, where it cannot be had (no CAP_SYS_ADMIN, a
/// filesystem without file handles).
pub fn discovery(root: &Path, wanted: EventSource) -> io::Result<Box<dyn Discovery>> {
    Ok(match wanted {
        EventSource::Poll => Box::new(Polling),
        EventSource::Inotify => Box::new(Events::new(root)?),
        EventSource::Fanotify => match FsEvents::new(root) {
            Ok(events) => {
                tracing::info!(root = %root.display(), "hearing of changes through a fanotify mark on the filesystem (events of every process on it are read, those outside the tree dropped)");
                Box::new(events)
            }
            Err(error) => {
                tracing::warn!(root = %root.display(), %error, "cannot use fanotify; hearing of changes through inotify instead");
                Box::new(Events::new(root)?)
            }
        },
    })
}

/// Hears nothing: the tailer stats its files on a schedule of its own, and
/// walks find what is new.
pub struct Polling;

impl Discovery for Polling {
    fn wait(&mut self, timeout: Duration) -> io::Result<Vec<Change>> {
        std::thread::sleep(timeout);
        Ok(Vec::new())
    }

    fn watch_dir(&mut self, _rel: &str) {}

    fn covers(&self, _dir: &str) -> bool {
        false
    }

    fn coverage(&self) -> Coverage {
        Coverage {
            events: EventSource::Poll,
            ..Coverage::default()
        }
    }
}

/// What an event tells the tailer.
#[derive(Debug)]
pub enum Change {
    /// Something happened to this path (created, written, closed, moved here).
    Touched { path: String, closed: bool },
    /// This path is gone (deleted or moved away).
    Gone { path: String },
    /// A directory appeared: watch it and walk it.
    NewDir { path: String },
    /// Events were lost: walk everything.
    Overflow,
}

/// `name` in the directory `dir` (relative to the root, "" for the root).
fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_owned()
    } else {
        format!("{dir}/{name}")
    }
}

/// Waits up to `timeout` until `fd` is readable; false on a timeout or a
/// signal.
fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let mut pollfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // ppoll, not poll: a sub-millisecond linger budget must neither be
    // truncated to 0 (the loop would spin) nor rounded up to 1 ms.
    let timeout = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: one valid pollfd and a valid timespec, for the duration of the call.
    let ready = unsafe { libc::ppoll(&mut pollfd, 1, &timeout, std::ptr::null()) };
    if ready < 0 {
        let error = io::Error::last_os_error();
        return if error.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(error)
        };
    }
    Ok(ready > 0)
}

/// Checks every [`Discovery`] that hears events must pass.
#[cfg(test)]
pub(super) mod checks {
    use super::*;

    /// Waits for changes until `want` is among them (bounded); returns all seen.
    pub fn changes_until(
        events: &mut dyn Discovery,
        want: impl Fn(&Change) -> bool,
    ) -> Vec<Change> {
        let mut seen = Vec::new();
        for _ in 0..200 {
            let batch = events
                .wait(Duration::from_millis(10))
                .expect("wait for events");
            let done = batch.iter().any(&want);
            seen.extend(batch);
            if done {
                return seen;
            }
        }
        panic!("no such event among {seen:?}");
    }

    /// Writes, closes, renames, removals and new directories under an
    /// empty `root`, each told with its path relative to the root.
    pub fn tells_writes_closes_removals_and_new_dirs(events: &mut dyn Discovery, root: &Path) {
        events.watch_dir("");
        std::fs::write(root.join("f"), b"data").expect("write");
        let seen = changes_until(
            events,
            |c| matches!(c, Change::Touched { path, closed: true } if path == "f"),
        );
        assert!(
            seen.iter()
                .all(|c| matches!(c, Change::Touched { path, .. } if path == "f")),
            "{seen:?}"
        );
        std::fs::rename(root.join("f"), root.join("g")).expect("rename");
        let seen = changes_until(
            events,
            |c| matches!(c, Change::Touched { path, closed: true } if path == "g"),
        );
        assert!(
            seen.iter()
                .any(|c| matches!(c, Change::Gone { path } if path == "f")),
            "{seen:?}"
        );
        std::fs::remove_file(root.join("g")).expect("remove");
        changes_until(
            events,
            |c| matches!(c, Change::Gone { path } if path == "g"),
        );
        std::fs::create_dir(root.join("sub")).expect("mkdir");
        changes_until(
            events,
            |c| matches!(c, Change::NewDir { path } if path == "sub"),
        );
        events.watch_dir("sub");
        std::fs::write(root.join("sub/h"), b"").expect("write");
        changes_until(
            events,
            |c| matches!(c, Change::Touched { path, .. } if path == "sub/h"),
        );
        assert!(events.covers("sub"));
        assert_eq!(events.coverage().unwatched_dirs, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Scratch;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn a_new_file_on_a_reused_inode_is_told_apart_by_its_birth() {
        let scratch = Scratch::new("reuse");
        let path = scratch.path().join("f");
        std::fs::write(&path, b"first").expect("write");
        let first = std::fs::metadata(&path).expect("stat");
        assert!(same_birth(born_ns(&first), born_ns(&first)));
        // Filesystems hand a freed inode number to the next file; a few
        // tries are enough where they do, and the check is moot elsewhere.
        for _ in 0..50 {
            std::fs::remove_file(&path).expect("delete");
            // Longer than a timer tick: kernels before 6.13 stamp births
            // with the coarse clock.
            std::thread::sleep(Duration::from_millis(20));
            std::fs::write(&path, b"second").expect("write");
            let second = std::fs::metadata(&path).expect("stat");
            if second.ino() == first.ino() {
                if born_ns(&first).is_some() {
                    assert!(!same_birth(born_ns(&first), born_ns(&second)));
                }
                return;
            }
        }
    }

    #[test]
    fn walk_finds_files_and_dirs_and_names_what_it_skips() {
        let scratch = Scratch::new("walk");
        let root = scratch.path();
        std::fs::create_dir_all(root.join("run1/deep")).expect("mkdir");
        std::fs::write(root.join("top.dat"), b"12345").expect("write");
        std::fs::write(root.join("run1/deep/x.dat"), b"x").expect("write");
        std::os::unix::fs::symlink(root.join("top.dat"), root.join("link.dat")).expect("symlink");
        std::os::unix::fs::symlink(root.join("run1"), root.join("linkdir")).expect("symlink");
        let odd = std::ffi::OsStr::from_bytes(b"bad-\xff.dat");
        std::fs::write(root.join("run1").join(odd), b"?").expect("write a non-UTF-8 name");
        let Walked {
            files,
            mut dirs,
            skipped,
        } = walk(root).expect("walk");
        let mut paths: Vec<(&str, u64)> = files.iter().map(|f| (f.path.as_str(), f.size)).collect();
        paths.sort();
        assert_eq!(paths, [("run1/deep/x.dat", 1), ("top.dat", 5)]);
        dirs.sort();
        assert_eq!(dirs, ["", "run1", "run1/deep"]);
        let top = files.iter().find(|f| f.path == "top.dat").expect("top.dat");
        let meta = std::fs::metadata(root.join("top.dat")).expect("stat");
        assert_eq!((top.dev, top.ino), (meta.dev(), meta.ino()));
        assert_eq!(top.mtime_ns, mtime_ns(&meta));
        let mut skipped: Vec<(&str, &str)> = skipped
            .iter()
            .map(|s| (s.path.as_str(), s.why.split(' ').nth(1).unwrap_or("")))
            .collect();
        skipped.sort();
        assert_eq!(
            skipped,
            [
                ("link.dat", "symbolic"),
                ("linkdir", "symbolic"),
                ("run1/\"bad-\\xFF.dat\"", "name")
            ]
        );
    }

    #[test]
    fn walk_of_a_missing_root_is_empty_and_of_a_file_fails() {
        let scratch = Scratch::new("walk-missing");
        let walked = walk(&scratch.path().join("nothing")).expect("walk");
        assert!(walked.files.is_empty());
        std::fs::write(scratch.path().join("plain"), b"").expect("write");
        assert!(walk(&scratch.path().join("plain")).is_err());
    }

    #[test]
    fn polling_hears_nothing_and_inotify_hears_through_the_trait() {
        let scratch = Scratch::new("discovery");
        let mut polling = discovery(scratch.path(), EventSource::Poll).expect("polling");
        polling.watch_dir("");
        assert!(!polling.covers(""));
        std::fs::write(scratch.path().join("p"), b"").expect("write");
        assert!(polling.wait(Duration::ZERO).expect("wait").is_empty());
        let mut inotify = discovery(scratch.path(), EventSource::Inotify).expect("inotify");
        inotify.watch_dir("");
        assert!(inotify.covers(""));
        assert_eq!(inotify.coverage().watched_dirs, 1);
        std::fs::write(scratch.path().join("q"), b"").expect("write");
        let mut heard = Vec::new();
        for _ in 0..200 {
            heard.extend(inotify.wait(Duration::from_millis(10)).expect("wait"));
            if heard
                .iter()
                .any(|c| matches!(c, Change::Touched { path, .. } if path == "q"))
            {
                return;
            }
        }
        panic!("inotify never told of q: {heard:?}");
    }
}
