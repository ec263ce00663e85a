//! fanotify: one filesystem mark per filesystem the watched tree lies on,
//! each event reported as its directory's file handle and the entry's
//! name, and the tree's directories known by their handles.
//!
//! A mark costs no kernel watch per directory, so no limit is reached
//! however large the tree, and a new directory is heard from the moment
//! it exists. The price: a filesystem mark hears **every process's**
//! changes anywhere on that filesystem. Events of directories outside the
//! tree are dropped after one hash lookup, but on a busy filesystem they
//! are still read, and the kernel's queue (`fs.fanotify.max_queued_events`,
//! 16384 by default) can overflow, which makes the tailer walk the tree.
//! Needs CAP_SYS_ADMIN (and Linux 5.9+ for names in events).
//!
//! No crate parses fanotify's file-handle info records (nix 0.32 reads
//! only the event metadata), so this module calls the three syscalls
//! itself through `libc` and parses the records from bytes.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Change, Coverage, Discovery, EventSource, join, wait_readable};

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// What the marks ask to hear of: entries created, written, closed after
/// writing, moved and deleted, for subdirectories too (FAN_ONDIR).
const MASK: u64 = libc::FAN_CREATE
    | libc::FAN_MODIFY
    | libc::FAN_CLOSE_WRITE
    | libc::FAN_MOVED_FROM
    | libc::FAN_MOVED_TO
    | libc::FAN_DELETE
    | libc::FAN_ONDIR;

/// `name_to_handle_at` flag (Linux 6.5+): a handle encoded as fanotify
/// encodes the ones it reports. Not in `libc` yet.
const AT_HANDLE_FID: libc::c_int = 0x200;

/// `struct fanotify_event_metadata`: event_len u32, vers u8, reserved u8,
/// metadata_len u16, mask u64, fd i32, pid i32.
const METADATA_LEN: usize = 24;
/// An info record's header (type u8, pad u8, len u16), then the
/// filesystem id (two i32), then `struct file_handle` (handle_bytes u32,
/// handle_type i32, f_handle[handle_bytes]), then, for names, the name
/// and a NUL.
const RECORD_HEADER_LEN: usize = 4;
const FSID_LEN: usize = 8;
const HANDLE_HEADER_LEN: usize = 8;

/// Reads per wait at most: on a busy filesystem events may never stop
/// coming, and the tailer has other work.
const MAX_READS_PER_WAIT: usize = 64;

/// A directory's identity as event records carry it: filesystem id,
/// handle length, handle type and handle bytes, so that a record is looked
/// up as a slice of the read buffer.
type HandleKey = Box<[u8]>;

/// fanotify filesystem marks over a directory tree.
pub struct FsEvents {
    fd: OwnedFd,
    root: PathBuf,
    dirs: Map<HandleKey, String>,
    by_path: Map<String, HandleKey>,
    /// Filesystem ids with a mark.
    marked: Vec<[u8; FSID_LEN]>,
    /// Directories that could not be watched, and why.
    unwatched: Map<String, String>,
    buffer: Vec<u8>,
}

impl FsEvents {
    /// Marks the filesystem of `root`; fails, saying why, where fanotify
    /// cannot be had (no CAP_SYS_ADMIN, an old kernel, a filesystem
    /// without file handles).
    pub fn new(root: &Path) -> io::Result<Self> {
        let fd = init()?;
        let mut events = Self {
            fd,
            root: root.to_owned(),
            dirs: Map::default(),
            by_path: Map::default(),
            marked: Vec::new(),
            unwatched: Map::default(),
            buffer: vec![0; 64 << 10],
        };
        // Marked now, not at the first walk, so that a filesystem fanotify
        // cannot serve is known before anything starts.
        let (_, fsid) = handle_of(root)?;
        events.mark(root, fsid)?;
        Ok(events)
    }

    /// Knows a directory (relative to the root) by its handle, marking its
    /// filesystem if the tree crossed onto another one.
    pub fn watch_dir(&mut self, rel: &str) {
        let path = self.root.join(rel);
        let known = handle_of(&path).and_then(|(key, fsid)| {
            self.mark(&path, fsid)?;
            Ok(key)
        });
        match known {
            Ok(key) => {
                self.register(rel, key);
                self.unwatched.remove(rel);
            }
            Err(error) if matches!(error.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) => {
                self.forget(rel);
            }
            Err(error) => {
                if self
                    .unwatched
                    .insert(rel.to_owned(), error.to_string())
                    .is_none()
                {
                    tracing::warn!(dir = %path.display(), %error, "cannot watch directory through fanotify; its files are polled and new ones found by rescans");
                }
            }
        }
    }

    fn register(&mut self, rel: &str, key: HandleKey) {
        // The path held another directory (replaced), or the directory was
        // known under another path (moved): neither name may linger.
        if let Some(previous) = self.by_path.get(rel)
            && *previous != key
        {
            let previous = previous.clone();
            self.dirs.remove(&previous);
        }
        if let Some(other) = self.dirs.insert(key.clone(), rel.to_owned())
            && other != rel
        {
            self.by_path.remove(&other);
        }
        self.by_path.insert(rel.to_owned(), key);
    }

    /// A directory was removed or moved away: it and everything under it
    /// are no longer known by these paths.
    fn forget(&mut self, rel: &str) {
        if !self.by_path.contains_key(rel) && !self.unwatched.contains_key(rel) {
            // Its subdirectories are only ever known after it.
            return;
        }
        let prefix = format!("{rel}/");
        let under = |path: &str| path == rel || path.starts_with(&prefix);
        let gone: Vec<String> = self.by_path.keys().filter(|p| under(p)).cloned().collect();
        for path in gone {
            if let Some(key) = self.by_path.remove(&path)
                && self.dirs.get(&key).is_some_and(|d| *d == path)
            {
                self.dirs.remove(&key);
            }
        }
        self.unwatched.retain(|path, _| !under(path));
    }

    fn mark(&mut self, path: &Path, fsid: [u8; FSID_LEN]) -> io::Result<()> {
        if self.marked.contains(&fsid) {
            return Ok(());
        }
        let c_path = c_path(path)?;
        // SAFETY: a descriptor we own and a NUL-terminated path, both valid
        // for the call; the kernel keeps no pointer.
        let done = unsafe {
            libc::fanotify_mark(
                self.fd.as_raw_fd(),
                libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM,
                MASK,
                libc::AT_FDCWD,
                c_path.as_ptr(),
            )
        };
        if done < 0 {
            let error = io::Error::last_os_error();
            let why = match error.raw_os_error() {
                Some(libc::EPERM) => " (a filesystem mark needs CAP_SYS_ADMIN)",
                Some(libc::ENODEV | libc::EXDEV | libc::EOPNOTSUPP) => {
                    " (this filesystem cannot report file handles to fanotify)"
                }
                _ => "",
            };
            return Err(io::Error::new(
                error.kind(),
                format!("marking the filesystem of {}: {error}{why}", path.display()),
            ));
        }
        self.marked.push(fsid);
        Ok(())
    }

    /// Waits up to `timeout` for events and returns what they say.
    pub fn wait(&mut self, timeout: Duration) -> io::Result<Vec<Change>> {
        if !wait_readable(self.fd.as_fd(), timeout)? {
            return Ok(Vec::new());
        }
        let mut changes = Vec::new();
        let mut buffer = std::mem::take(&mut self.buffer);
        let mut outcome = Ok(());
        for _ in 0..MAX_READS_PER_WAIT {
            // SAFETY: reads into our own buffer, at most its length.
            let read = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    buffer.as_mut_ptr().cast(),
                    buffer.len(),
                )
            };
            if read <= 0 {
                let error = io::Error::last_os_error();
                if read < 0
                    && !matches!(
                        error.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                    )
                {
                    outcome = Err(io::Error::new(
                        error.kind(),
                        format!("reading fanotify events: {error}"),
                    ));
                }
                break;
            }
            match parse_events(&buffer[..read as usize]) {
                Ok(events) => {
                    for event in events {
                        self.apply(event, &mut changes);
                    }
                }
                Err(error) => {
                    outcome = Err(error);
                    break;
                }
            }
        }
        self.buffer = buffer;
        outcome.map(|()| changes)
    }

    fn apply(&mut self, event: RawEvent<'_>, changes: &mut Vec<Change>) {
        if event.mask & libc::FAN_Q_OVERFLOW != 0 {
            changes.push(Change::Overflow);
            return;
        }
        let Some((dir, name)) = event.dir_and_name else {
            return;
        };
        // Events of directories outside the tree (everyone's, on this
        // filesystem) end here.
        let Some(dir) = self.dirs.get(dir) else {
            return;
        };
        // "." names the directory itself, which nothing here asks about.
        let Ok(name) = std::str::from_utf8(name) else {
            return;
        };
        if name == "." || name.is_empty() {
            return;
        }
        let path = join(dir, name);
        let gone = event.mask & (libc::FAN_DELETE | libc::FAN_MOVED_FROM) != 0;
        let here = event.mask
            & (libc::FAN_CREATE | libc::FAN_MODIFY | libc::FAN_CLOSE_WRITE | libc::FAN_MOVED_TO)
            != 0;
        // Events the kernel merged may say both; the tailer checks the
        // path itself either way, so both are passed on, the going first.
        if event.mask & libc::FAN_ONDIR != 0 {
            if gone {
                self.forget(&path);
            }
            if event.mask & (libc::FAN_CREATE | libc::FAN_MOVED_TO) != 0 {
                changes.push(Change::NewDir { path });
            }
            return;
        }
        if gone {
            changes.push(Change::Gone { path: path.clone() });
        }
        if here {
            // A file renamed into place was closed by whoever wrote it.
            let closed = event.mask & (libc::FAN_CLOSE_WRITE | libc::FAN_MOVED_TO) != 0;
            changes.push(Change::Touched { path, closed });
        }
    }
}

impl Discovery for FsEvents {
    fn wait(&mut self, timeout: Duration) -> io::Result<Vec<Change>> {
        FsEvents::wait(self, timeout)
    }

    fn watch_dir(&mut self, rel: &str) {
        FsEvents::watch_dir(self, rel)
    }

    /// Directories removed while events were lost would stay known
    /// forever: a walk prunes them.
    fn walked(&mut self, dirs: &[String]) {
        let present: std::collections::HashSet<&str> = dirs.iter().map(String::as_str).collect();
        let stale: Vec<String> = self
            .by_path
            .keys()
            .filter(|p| !present.contains(p.as_str()))
            .cloned()
            .collect();
        for path in stale {
            if let Some(key) = self.by_path.remove(&path)
                && self.dirs.get(&key).is_some_and(|d| *d == path)
            {
                self.dirs.remove(&key);
            }
        }
        self.unwatched
            .retain(|dir, _| present.contains(dir.as_str()));
    }

    fn covers(&self, dir: &str) -> bool {
        !self.unwatched.contains_key(dir)
    }

    fn coverage(&self) -> Coverage {
        Coverage {
            events: EventSource::Fanotify,
            watched_dirs: self.by_path.len(),
            unwatched_dirs: self.unwatched.len(),
            why_unwatched: self.unwatched.values().next().cloned(),
        }
    }
}

/// One event as read: its mask, and its directory's handle key and the
/// entry's name where it carries them.
#[derive(Debug, PartialEq, Eq)]
struct RawEvent<'a> {
    mask: u64,
    dir_and_name: Option<(&'a [u8], &'a [u8])>,
}

/// Parses what one `read` returned. The kernel writes whole events; a
/// length that does not fit is a bug (ours or its), told as an error
/// rather than guessed past.
fn parse_events(mut bytes: &[u8]) -> io::Result<Vec<RawEvent<'_>>> {
    let malformed = |what: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("malformed fanotify event: {what}"),
        )
    };
    let mut events = Vec::new();
    while !bytes.is_empty() {
        if bytes.len() < METADATA_LEN {
            return Err(malformed("shorter than its metadata"));
        }
        let event_len = u32::from_ne_bytes(field(bytes, 0)) as usize;
        let version = bytes[4];
        let metadata_len = u16::from_ne_bytes(field(bytes, 6)) as usize;
        let mask = u64::from_ne_bytes(field(bytes, 8));
        if version != libc::FANOTIFY_METADATA_VERSION {
            return Err(malformed(&format!(
                "metadata version {version}, this build reads {}",
                libc::FANOTIFY_METADATA_VERSION
            )));
        }
        if event_len < METADATA_LEN
            || event_len > bytes.len()
            || metadata_len < METADATA_LEN
            || metadata_len > event_len
        {
            return Err(malformed(&format!(
                "length {event_len} (metadata {metadata_len}) in {} bytes",
                bytes.len()
            )));
        }
        let mut records = &bytes[metadata_len..event_len];
        let mut dir_and_name = None;
        while records.len() >= RECORD_HEADER_LEN {
            let info_type = records[0];
            let record_len = u16::from_ne_bytes(field(records, 2)) as usize;
            if record_len < RECORD_HEADER_LEN || record_len > records.len() {
                return Err(malformed(&format!("info record length {record_len}")));
            }
            let record = &records[..record_len];
            if info_type == libc::FAN_EVENT_INFO_TYPE_DFID_NAME && dir_and_name.is_none() {
                dir_and_name = Some(dir_handle_and_name(record).ok_or_else(|| {
                    malformed(&format!("directory handle record of {record_len} bytes"))
                })?);
            }
            records = &records[record_len..];
        }
        events.push(RawEvent { mask, dir_and_name });
        bytes = &bytes[event_len..];
    }
    Ok(events)
}

/// The handle key and name of a `FAN_EVENT_INFO_TYPE_DFID_NAME` record.
fn dir_handle_and_name(record: &[u8]) -> Option<(&[u8], &[u8])> {
    let handle_start = RECORD_HEADER_LEN + FSID_LEN;
    let handle_bytes = u32::from_ne_bytes(
        record
            .get(handle_start..handle_start + 4)?
            .try_into()
            .ok()?,
    ) as usize;
    let key_end = handle_start
        .checked_add(HANDLE_HEADER_LEN)?
        .checked_add(handle_bytes)?;
    let key = record.get(RECORD_HEADER_LEN..key_end)?;
    let name = record.get(key_end..)?;
    let name = &name[..name.iter().position(|&b| b == 0)?];
    Some((key, name))
}

/// `N` bytes at `at`; the caller checked the length.
fn field<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

fn init() -> io::Result<OwnedFd> {
    // SAFETY: flags only; on success the kernel hands us a new descriptor.
    let fd = unsafe {
        libc::fanotify_init(
            libc::FAN_CLASS_NOTIF
                | libc::FAN_REPORT_DFID_NAME
                | libc::FAN_CLOEXEC
                | libc::FAN_NONBLOCK,
            libc::O_RDONLY as libc::c_uint,
        )
    };
    if fd < 0 {
        let error = io::Error::last_os_error();
        let why = match error.raw_os_error() {
            Some(libc::EPERM) => " (fanotify needs CAP_SYS_ADMIN)",
            Some(libc::EINVAL) => " (names in fanotify events need Linux 5.9 or later)",
            Some(libc::ENOSYS) => " (this kernel is built without fanotify)",
            _ => "",
        };
        return Err(io::Error::new(
            error.kind(),
            format!("fanotify_init: {error}{why}"),
        ));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn c_path(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} holds a NUL byte", path.display()),
        )
    })
}

/// A directory's handle key and its filesystem's id.
fn handle_of(path: &Path) -> io::Result<(HandleKey, [u8; FSID_LEN])> {
    let c_path = c_path(path)?;
    let fsid = fsid_of(path, &c_path)?;
    #[repr(C)]
    struct Handle {
        handle_bytes: libc::c_uint,
        handle_type: libc::c_int,
        f_handle: [u8; libc::MAX_HANDLE_SZ as usize],
    }
    let mut handle = Handle {
        handle_bytes: libc::MAX_HANDLE_SZ as libc::c_uint,
        handle_type: 0,
        f_handle: [0; libc::MAX_HANDLE_SZ as usize],
    };
    let mut mount_id: libc::c_int = 0;
    let mut named = |flags| {
        // SAFETY: a NUL-terminated path, a handle buffer whose
        // `handle_bytes` says how much room follows, and an int, all valid
        // for the call.
        unsafe {
            libc::name_to_handle_at(
                libc::AT_FDCWD,
                c_path.as_ptr(),
                (&raw mut handle).cast(),
                &mut mount_id,
                flags,
            )
        }
    };
    let mut done = named(AT_HANDLE_FID);
    if done < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
        // Before Linux 6.5: the plain encoding, the same on the
        // filesystems that support fanotify's.
        done = named(0);
    }
    if done < 0 {
        let error = io::Error::last_os_error();
        let why = match error.raw_os_error() {
            Some(libc::EOPNOTSUPP) => " (this filesystem gives no file handles)",
            _ => "",
        };
        return Err(io::Error::new(
            error.kind(),
            format!("name_to_handle_at({}): {error}{why}", path.display()),
        ));
    }
    let len = (handle.handle_bytes as usize).min(handle.f_handle.len());
    let mut key = Vec::with_capacity(FSID_LEN + HANDLE_HEADER_LEN + len);
    key.extend_from_slice(&fsid);
    key.extend_from_slice(&handle.handle_bytes.to_ne_bytes());
    key.extend_from_slice(&handle.handle_type.to_ne_bytes());
    key.extend_from_slice(&handle.f_handle[..len]);
    Ok((key.into_boxed_slice(), fsid))
}

/// The filesystem id fanotify's records carry (statfs's `f_fsid`).
fn fsid_of(path: &Path, c_path: &CString) -> io::Result<[u8; FSID_LEN]> {
    let mut stat = MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: a NUL-terminated path and room for a statfs, valid for the call.
    if unsafe { libc::statfs(c_path.as_ptr(), stat.as_mut_ptr()) } < 0 {
        let error = io::Error::last_os_error();
        return Err(io::Error::new(
            error.kind(),
            format!("statfs({}): {error}", path.display()),
        ));
    }
    // SAFETY: statfs succeeded, so it filled the struct.
    let stat = unsafe { stat.assume_init() };
    // SAFETY: `fsid_t` is two C ints (its fields are private in `libc`),
    // laid out as the kernel's `__kernel_fsid_t` in event records.
    Ok(unsafe { std::mem::transmute::<libc::fsid_t, [u8; FSID_LEN]>(stat.f_fsid) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::checks::{self, changes_until};
    use crate::discover::discovery;
    use crate::testkit::Scratch;

    /// fanotify on `root`, or None (told) where the process lacks the
    /// capability: these tests then have nothing to test.
    fn fanotify_or_skip(root: &Path) -> Option<FsEvents> {
        match FsEvents::new(root) {
            Ok(events) => Some(events),
            Err(error) if error.kind() == io::ErrorKind::PermissionDenied => {
                eprintln!("skipped: {error}");
                None
            }
            Err(error) => panic!("fanotify on {}: {error}", root.display()),
        }
    }

    #[test]
    fn fanotify_tells_writes_closes_removals_and_new_dirs() {
        let scratch = Scratch::new("fanotify");
        let Some(mut events) = fanotify_or_skip(scratch.path()) else {
            return;
        };
        checks::tells_writes_closes_removals_and_new_dirs(&mut events, scratch.path());
        assert_eq!(events.coverage().events, EventSource::Fanotify);
        assert_eq!(events.coverage().watched_dirs, 2);
    }

    #[test]
    fn events_outside_the_tree_are_dropped() {
        let scratch = Scratch::new("fanotify-outside");
        let (inside, outside) = (scratch.path().join("in"), scratch.path().join("out"));
        std::fs::create_dir_all(&inside).expect("mkdir");
        std::fs::create_dir_all(&outside).expect("mkdir");
        let Some(mut events) = fanotify_or_skip(&inside) else {
            return;
        };
        events.watch_dir("");
        std::fs::write(outside.join("elsewhere"), b"x").expect("write");
        std::fs::write(inside.join("here"), b"x").expect("write");
        let seen = changes_until(
            &mut events,
            |c| matches!(c, Change::Touched { path, closed: true } if path == "here"),
        );
        assert!(
            seen.iter()
                .all(|c| matches!(c, Change::Touched { path, .. } if path == "here")),
            "{seen:?}"
        );
    }

    #[test]
    fn a_moved_directory_is_heard_under_its_new_path_and_a_removed_one_forgotten() {
        let scratch = Scratch::new("fanotify-dirs");
        let root = scratch.path();
        std::fs::create_dir_all(root.join("a/deep")).expect("mkdir");
        let Some(mut events) = fanotify_or_skip(root) else {
            return;
        };
        for dir in ["", "a", "a/deep"] {
            events.watch_dir(dir);
        }
        std::fs::rename(root.join("a"), root.join("b")).expect("rename");
        changes_until(
            &mut events,
            |c| matches!(c, Change::NewDir { path } if path == "b"),
        );
        // What the tailer does on a new directory: watch it, then walk it.
        events.watch_dir("b");
        events.watch_dir("b/deep");
        assert_eq!(events.coverage().watched_dirs, 3);
        std::fs::write(root.join("b/deep/f"), b"x").expect("write");
        let seen = changes_until(
            &mut events,
            |c| matches!(c, Change::Touched { path, closed: true } if path == "b/deep/f"),
        );
        assert!(
            !seen
                .iter()
                .any(|c| matches!(c, Change::Touched { path, .. } if path.starts_with("a/"))),
            "{seen:?}"
        );
        std::fs::remove_file(root.join("b/deep/f")).expect("remove");
        std::fs::remove_dir(root.join("b/deep")).expect("rmdir");
        changes_until(
            &mut events,
            |c| matches!(c, Change::Gone { path } if path == "b/deep/f"),
        );
        // The directory's removal comes after its file's; wait for it.
        for _ in 0..200 {
            if events.coverage().watched_dirs == 2 {
                break;
            }
            events.wait(Duration::from_millis(10)).expect("wait");
        }
        assert_eq!(events.coverage().watched_dirs, 2);
        events.walked(&["".into()]);
        assert_eq!(events.coverage().watched_dirs, 1);
    }

    #[test]
    fn a_filesystem_without_file_handles_falls_back_to_inotify() {
        let error = FsEvents::new(Path::new("/proc"))
            .err()
            .expect("no fanotify on /proc");
        let text = error.to_string();
        assert!(
            text.contains("file handles") || text.contains("CAP_SYS_ADMIN"),
            "{text}"
        );
        let fallback = discovery(Path::new("/proc"), EventSource::Fanotify).expect("inotify");
        assert_eq!(fallback.coverage().events, EventSource::Inotify);
    }

    /// An event as the kernel lays it out, with a DFID_NAME record.
    fn event_bytes(mask: u64, handle: &[u8], name: &[u8]) -> Vec<u8> {
        let mut record = vec![libc::FAN_EVENT_INFO_TYPE_DFID_NAME, 0, 0, 0];
        record.extend_from_slice(&[7; FSID_LEN]);
        record.extend_from_slice(&(handle.len() as u32).to_ne_bytes());
        record.extend_from_slice(&1i32.to_ne_bytes());
        record.extend_from_slice(handle);
        record.extend_from_slice(name);
        record.push(0);
        while record.len() % 4 != 0 {
            record.push(0);
        }
        let record_len = record.len() as u16;
        record[2..4].copy_from_slice(&record_len.to_ne_bytes());
        let mut event = Vec::new();
        event.extend_from_slice(&((METADATA_LEN + record.len()) as u32).to_ne_bytes());
        event.push(libc::FANOTIFY_METADATA_VERSION);
        event.push(0);
        event.extend_from_slice(&(METADATA_LEN as u16).to_ne_bytes());
        event.extend_from_slice(&mask.to_ne_bytes());
        event.extend_from_slice(&libc::FAN_NOFD.to_ne_bytes());
        event.extend_from_slice(&0i32.to_ne_bytes());
        event.extend_from_slice(&record);
        event
    }

    #[test]
    fn records_parse_and_lengths_that_do_not_fit_are_refused() {
        let mut bytes = event_bytes(libc::FAN_CREATE, &[1, 2, 3, 4, 5, 6, 7, 8], b"f.dat");
        let first_len = bytes.len();
        bytes.extend(event_bytes(libc::FAN_Q_OVERFLOW, &[9; 8], b"x"));
        let events = parse_events(&bytes).expect("parse");
        assert_eq!(events.len(), 2);
        let (key, name) = events[0].dir_and_name.expect("a directory and a name");
        assert_eq!(name, b"f.dat");
        assert_eq!(key.len(), FSID_LEN + HANDLE_HEADER_LEN + 8);
        assert_eq!(
            &key[FSID_LEN + HANDLE_HEADER_LEN..],
            &[1, 2, 3, 4, 5, 6, 7, 8]
        );
        assert_eq!(events[1].mask, libc::FAN_Q_OVERFLOW);
        // Every truncation, and a handle length past its record, is an
        // error, never a panic or a read past the buffer.
        for cut in 1..bytes.len() {
            if cut != first_len {
                assert!(parse_events(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
        let mut lying = event_bytes(libc::FAN_MODIFY, &[1; 8], b"g");
        let handle_len_at = METADATA_LEN + RECORD_HEADER_LEN + FSID_LEN;
        lying[handle_len_at..handle_len_at + 4].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(parse_events(&lying).is_err());
    }
}
