//! Finding files and hearing about changes: a recursive walk of the watched
//! tree, and a [`Discovery`] between walks: inotify watches on its
//! directories, or nothing but the passing of time for polling.
//!
//! inotify is a hint, never the truth: events can be lost (queue overflow) and
//! writes from other nodes of a network filesystem raise none. The tailer
//! therefore stats files itself, and a periodic walk finds whatever the
//! events missed.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

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

/// Walks `root` and returns its regular files (symlinks are not followed)
/// and its directories, both relative to `root`.
#[cfg(test)]
pub fn walk(root: &Path) -> io::Result<(Vec<Found>, Vec<String>)> {
    walk_with(root, || {})
}

/// [`walk`], calling `each_dir` before reading each directory: a walk of a
/// large tree on a slow filesystem takes minutes, and whoever watches the
/// walker for signs of life sees them.
pub fn walk_with(root: &Path, mut each_dir: impl FnMut()) -> io::Result<(Vec<Found>, Vec<String>)> {
    let mut files = Vec::new();
    let mut dirs = vec![String::new()];
    let mut index = 0;
    while index < dirs.len() {
        each_dir();
        let rel = dirs[index].clone();
        index += 1;
        let entries = match std::fs::read_dir(root.join(&rel)) {
            Ok(entries) => entries,
            // A directory removed between listing and reading is not an error.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("reading directory {}: {e}", root.join(&rel).display()),
                ));
            }
        };
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                tracing::warn!(dir = %root.join(&rel).display(), name = ?entry.file_name(), "skipping a file whose name is not UTF-8");
                continue;
            };
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let Ok(meta) = entry.metadata() else { continue };
            if meta.file_type().is_dir() {
                dirs.push(path);
            } else if meta.file_type().is_file() {
                files.push(Found {
                    path,
                    dev: meta.dev(),
                    ino: meta.ino(),
                    size: meta.len(),
                    mtime_ns: mtime_ns(&meta),
                    born_ns: born_ns(&meta),
                });
            }
        }
    }
    Ok((files, dirs))
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

/// How the tailer hears about changes between walks.
pub trait Discovery: Send {
    /// Waits up to `timeout` and returns the changes heard of meanwhile.
    fn wait(&mut self, timeout: Duration) -> io::Result<Vec<Change>>;

    /// Starts hearing about a directory (relative to the root); doing so
    /// twice is harmless.
    fn watch_dir(&mut self, rel: &str);
}

/// The discovery `poll` asks for: inotify, or polling where events do not
/// reach (network and parallel filesystems).
pub fn discovery(root: &Path, poll: bool) -> io::Result<Box<dyn Discovery>> {
    Ok(if poll {
        Box::new(Polling)
    } else {
        Box::new(Events::new(root)?)
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
}

impl Discovery for Events {
    fn wait(&mut self, timeout: Duration) -> io::Result<Vec<Change>> {
        Events::wait(self, timeout)
    }

    fn watch_dir(&mut self, rel: &str) {
        Events::watch_dir(self, rel)
    }
}

/// What an inotify event tells the tailer.
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

/// inotify watches over a directory tree.
pub struct Events {
    inotify: Inotify,
    dirs: HashMap<WatchDescriptor, String, foldhash::fast::RandomState>,
    root: PathBuf,
    buffer: Vec<u8>,
}

const MASK: WatchMask = WatchMask::CREATE
    .union(WatchMask::MODIFY)
    .union(WatchMask::CLOSE_WRITE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::DELETE)
    .union(WatchMask::ONLYDIR)
    .union(WatchMask::DONT_FOLLOW);

impl Events {
    pub fn new(root: &Path) -> io::Result<Self> {
        Ok(Self {
            inotify: Inotify::init()?,
            dirs: HashMap::default(),
            root: root.to_owned(),
            buffer: vec![0; 64 << 10],
        })
    }

    /// Watches a directory (relative to the root); watching twice is harmless.
    pub fn watch_dir(&mut self, rel: &str) {
        match self.inotify.watches().add(self.root.join(rel), MASK) {
            Ok(wd) => {
                self.dirs.insert(wd, rel.to_owned());
            }
            Err(e) => {
                tracing::warn!(dir = %self.root.join(rel).display(), error = %e, "cannot watch directory; relying on rescans")
            }
        }
    }

    /// Waits up to `timeout` for events and returns what they say.
    pub fn wait(&mut self, timeout: Duration) -> io::Result<Vec<Change>> {
        let mut pollfd = libc::pollfd {
            fd: self.inotify.as_raw_fd(),
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
                Ok(Vec::new())
            } else {
                Err(error)
            };
        }
        let mut changes = Vec::new();
        loop {
            let events = match self.inotify.read_events(&mut self.buffer) {
                Ok(events) => events,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e),
            };
            let mut any = false;
            for event in events {
                any = true;
                if event.mask.contains(EventMask::Q_OVERFLOW) {
                    changes.push(Change::Overflow);
                    continue;
                }
                if event.mask.contains(EventMask::IGNORED) {
                    self.dirs.remove(&event.wd);
                    continue;
                }
                let (Some(dir), Some(name)) =
                    (self.dirs.get(&event.wd), event.name.and_then(OsStr::to_str))
                else {
                    continue;
                };
                let path = if dir.is_empty() {
                    name.to_owned()
                } else {
                    format!("{dir}/{name}")
                };
                let is_dir = event.mask.contains(EventMask::ISDIR);
                if event
                    .mask
                    .intersects(EventMask::DELETE | EventMask::MOVED_FROM)
                {
                    if !is_dir {
                        changes.push(Change::Gone { path });
                    }
                } else if is_dir {
                    if event
                        .mask
                        .intersects(EventMask::CREATE | EventMask::MOVED_TO)
                    {
                        changes.push(Change::NewDir { path });
                    }
                } else {
                    // A file renamed into place was closed by whoever wrote it.
                    let closed = event
                        .mask
                        .intersects(EventMask::CLOSE_WRITE | EventMask::MOVED_TO);
                    changes.push(Change::Touched { path, closed });
                }
            }
            if !any {
                break;
            }
        }
        Ok(changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::Scratch;

    /// Waits for events until `want` is among them (bounded); returns all seen.
    fn changes_until(events: &mut Events, want: impl Fn(&Change) -> bool) -> Vec<Change> {
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
    fn walk_finds_files_and_dirs_and_skips_symlinks() {
        let scratch = Scratch::new("walk");
        let root = scratch.path();
        std::fs::create_dir_all(root.join("run1/deep")).expect("mkdir");
        std::fs::write(root.join("top.dat"), b"12345").expect("write");
        std::fs::write(root.join("run1/deep/x.dat"), b"x").expect("write");
        std::os::unix::fs::symlink(root.join("top.dat"), root.join("link.dat")).expect("symlink");
        std::os::unix::fs::symlink(root.join("run1"), root.join("linkdir")).expect("symlink");
        let (files, mut dirs) = walk(root).expect("walk");
        let mut paths: Vec<(&str, u64)> = files.iter().map(|f| (f.path.as_str(), f.size)).collect();
        paths.sort();
        assert_eq!(paths, [("run1/deep/x.dat", 1), ("top.dat", 5)]);
        dirs.sort();
        assert_eq!(dirs, ["", "run1", "run1/deep"]);
        let top = files.iter().find(|f| f.path == "top.dat").expect("top.dat");
        let meta = std::fs::metadata(root.join("top.dat")).expect("stat");
        assert_eq!((top.dev, top.ino), (meta.dev(), meta.ino()));
        assert_eq!(top.mtime_ns, mtime_ns(&meta));
    }

    #[test]
    fn walk_of_a_missing_root_is_empty_and_of_a_file_fails() {
        let scratch = Scratch::new("walk-missing");
        let (files, _) = walk(&scratch.path().join("nothing")).expect("walk");
        assert!(files.is_empty());
        std::fs::write(scratch.path().join("plain"), b"").expect("write");
        assert!(walk(&scratch.path().join("plain")).is_err());
    }

    #[test]
    fn events_tell_writes_closes_removals_and_new_dirs() {
        let scratch = Scratch::new("events");
        let root = scratch.path();
        let mut events = Events::new(root).expect("inotify");
        events.watch_dir("");
        std::fs::write(root.join("f"), b"data").expect("write");
        let seen = changes_until(
            &mut events,
            |c| matches!(c, Change::Touched { path, closed: true } if path == "f"),
        );
        assert!(
            seen.iter()
                .all(|c| matches!(c, Change::Touched { path, .. } if path == "f")),
            "{seen:?}"
        );
        std::fs::rename(root.join("f"), root.join("g")).expect("rename");
        let seen = changes_until(
            &mut events,
            |c| matches!(c, Change::Touched { path, closed: true } if path == "g"),
        );
        assert!(
            seen.iter()
                .any(|c| matches!(c, Change::Gone { path } if path == "f")),
            "{seen:?}"
        );
        std::fs::remove_file(root.join("g")).expect("remove");
        changes_until(
            &mut events,
            |c| matches!(c, Change::Gone { path } if path == "g"),
        );
        std::fs::create_dir(root.join("sub")).expect("mkdir");
        changes_until(
            &mut events,
            |c| matches!(c, Change::NewDir { path } if path == "sub"),
        );
        events.watch_dir("sub");
        std::fs::write(root.join("sub/h"), b"").expect("write");
        changes_until(
            &mut events,
            |c| matches!(c, Change::Touched { path, .. } if path == "sub/h"),
        );
    }

    #[test]
    fn polling_hears_nothing_and_inotify_hears_through_the_trait() {
        let scratch = Scratch::new("discovery");
        let mut polling = discovery(scratch.path(), true).expect("polling");
        polling.watch_dir("");
        std::fs::write(scratch.path().join("p"), b"").expect("write");
        assert!(polling.wait(Duration::ZERO).expect("wait").is_empty());
        let mut inotify = discovery(scratch.path(), false).expect("inotify");
        inotify.watch_dir("");
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

    #[test]
    fn waiting_without_events_returns_nothing() {
        let scratch = Scratch::new("events-quiet");
        let mut events = Events::new(scratch.path()).expect("inotify");
        events.watch_dir("");
        assert!(events.wait(Duration::ZERO).expect("wait").is_empty());
    }
}
