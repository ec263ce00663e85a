//! inotify: one watch per directory of the tree, and the directories it
//! could not watch (inotify's per-user watch limit reached, or another
//! error), which the tailer covers by polling their files.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ::inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

use super::{Change, Coverage, Discovery, EventSource, join, wait_readable};

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// inotify watches over a directory tree.
pub struct Events {
    inotify: Inotify,
    dirs: Map<WatchDescriptor, String>,
    /// Directories whose watch failed, with the error number.
    unwatched: Map<String, i32>,
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
        let inotify = Inotify::init().map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("inotify_init: {e} (at most fs.inotify.max_user_instances per user)"),
            )
        })?;
        Ok(Self {
            inotify,
            dirs: Map::default(),
            unwatched: Map::default(),
            root: root.to_owned(),
            buffer: vec![0; 64 << 10],
        })
    }

    /// Watches a directory (relative to the root); watching twice is harmless.
    pub fn watch_dir(&mut self, rel: &str) {
        let error = match self.inotify.watches().add(self.root.join(rel), MASK) {
            Ok(wd) => {
                self.dirs.insert(wd, rel.to_owned());
                self.unwatched.remove(rel);
                return;
            }
            Err(error) => error,
        };
        let errno = error.raw_os_error().unwrap_or(0);
        if matches!(errno, libc::ENOENT | libc::ENOTDIR) {
            // Gone (or replaced by a file) since it was seen: nothing to watch.
            self.unwatched.remove(rel);
            return;
        }
        let first = self.unwatched.insert(rel.to_owned(), errno).is_none();
        // The watch limit is told once for all directories (see `coverage`);
        // any other failure is the directory's own, told once each.
        if first && errno != libc::ENOSPC {
            tracing::warn!(dir = %self.root.join(rel).display(), %error, "cannot watch directory; its files are polled and new ones found by rescans");
        }
    }

    /// Waits up to `timeout` for events and returns what they say.
    pub fn wait(&mut self, timeout: Duration) -> io::Result<Vec<Change>> {
        wait_readable(self.inotify.as_fd(), timeout)?;
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
                let path = join(dir, name);
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

    fn why_unwatched(&self) -> Option<String> {
        if self.unwatched.values().any(|&errno| errno == libc::ENOSPC) {
            let limit = watch_limit().map_or_else(String::new, |n| format!(" ({n} watches)"));
            return Some(format!(
                "inotify's per-user watch limit{limit} is reached: raise sysctl \
                 fs.inotify.max_user_watches (user.max_inotify_watches inside a user namespace)"
            ));
        }
        let errno = *self.unwatched.values().next()?;
        Some(format!(
            "inotify_add_watch failed: {}",
            io::Error::from_raw_os_error(errno)
        ))
    }
}

/// inotify's watch limit for this process's user, as the kernel applies it
/// (the user namespace's own where one is set).
fn watch_limit() -> Option<u64> {
    [
        "/proc/sys/user/max_inotify_watches",
        "/proc/sys/fs/inotify/max_user_watches",
    ]
    .iter()
    .find_map(|file| std::fs::read_to_string(file).ok()?.trim().parse().ok())
}

impl Discovery for Events {
    fn wait(&mut self, timeout: Duration) -> io::Result<Vec<Change>> {
        Events::wait(self, timeout)
    }

    fn watch_dir(&mut self, rel: &str) {
        Events::watch_dir(self, rel)
    }

    fn walked(&mut self, dirs: &[String]) {
        if !self.unwatched.is_empty() {
            let present: HashSet<&str> = dirs.iter().map(String::as_str).collect();
            self.unwatched
                .retain(|dir, _| present.contains(dir.as_str()));
        }
    }

    fn covers(&self, dir: &str) -> bool {
        !self.unwatched.contains_key(dir)
    }

    fn coverage(&self) -> Coverage {
        Coverage {
            events: EventSource::Inotify,
            watched_dirs: self.dirs.len(),
            unwatched_dirs: self.unwatched.len(),
            why_unwatched: self.why_unwatched(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::checks;
    use crate::testkit::Scratch;

    #[test]
    fn events_tell_writes_closes_removals_and_new_dirs() {
        let scratch = Scratch::new("events");
        let mut events = Events::new(scratch.path()).expect("inotify");
        checks::tells_writes_closes_removals_and_new_dirs(&mut events, scratch.path());
    }

    #[test]
    fn waiting_without_events_returns_nothing() {
        let scratch = Scratch::new("events-quiet");
        let mut events = Events::new(scratch.path()).expect("inotify");
        events.watch_dir("");
        assert!(events.wait(Duration::ZERO).expect("wait").is_empty());
    }

    #[test]
    fn a_directory_that_cannot_be_watched_is_counted_and_forgotten_once_gone() {
        let scratch = Scratch::new("events-unwatched");
        let root = scratch.path();
        std::fs::create_dir(root.join("ok")).expect("mkdir");
        std::fs::write(root.join("plain"), b"").expect("write");
        let mut events = Events::new(root).expect("inotify");
        events.watch_dir("");
        events.watch_dir("ok");
        // ONLYDIR refuses a file as a directory (ENOTDIR: gone, not counted);
        // a dangling symlink under DONT_FOLLOW is refused as ENOTDIR too, so
        // the unwatched state is made by hand, as an ENOSPC would.
        events.watch_dir("plain");
        assert_eq!(events.coverage().unwatched_dirs, 0);
        events.unwatched.insert("full".into(), libc::ENOSPC);
        let coverage = events.coverage();
        assert_eq!((coverage.watched_dirs, coverage.unwatched_dirs), (2, 1));
        assert!(!events.covers("full") && events.covers("ok"));
        let why = coverage.why_unwatched.expect("a reason");
        assert!(why.contains("fs.inotify.max_user_watches"), "{why}");
        events.walked(&["".into(), "ok".into()]);
        assert_eq!(events.coverage().unwatched_dirs, 0);
        assert!(events.coverage().why_unwatched.is_none());
    }
}
