//! Keeps every destination path under the sink's root.
//!
//! Paths from the wire are checked component by component (no `..`, no `.`,
//! no empty or absolute paths, no NUL), then opened with `openat` one directory
//! at a time with `O_NOFOLLOW`, so neither a crafted path nor a symlink planted
//! inside the root can reach outside it.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

/// A path that failed confinement or could not be opened under the root.
#[derive(Debug, thiserror::Error)]
pub enum ConfineError {
    #[error("path {path:?} refused: {reason}")]
    Refused { path: String, reason: &'static str },
    #[error(
        "path {path:?}: component {component:?} is a symlink or not a directory; refusing to follow it"
    )]
    NotADirectory { path: String, component: String },
    #[error("path {path:?}: {op} failed under {root}: {source}")]
    Io {
        path: String,
        op: &'static str,
        root: PathBuf,
        source: std::io::Error,
    },
}

impl ConfineError {
    /// Whether the peer caused this (as opposed to the sink's storage).
    pub fn is_peer_error(&self) -> bool {
        !matches!(self, ConfineError::Io { .. })
    }
}

/// Checks a relative, '/'-separated path and returns its components.
pub fn components(path: &str) -> Result<Vec<&str>, ConfineError> {
    let refuse = |reason| {
        Err(ConfineError::Refused {
            path: path.to_owned(),
            reason,
        })
    };
    if path.is_empty() {
        return refuse("empty path");
    }
    if path.starts_with('/') {
        return refuse("absolute paths are not allowed");
    }
    if path.contains('\0') {
        return refuse("NUL byte in path");
    }
    if path.len() > 4096 {
        return refuse("longer than 4096 bytes");
    }
    let parts: Vec<&str> = path.split('/').collect();
    for part in &parts {
        match *part {
            "" => return refuse("empty path component (\"//\" or trailing '/')"),
            "." | ".." => return refuse("'.' and '..' components are not allowed"),
            p if p.len() > 255 => return refuse("a component is longer than 255 bytes"),
            _ => {}
        }
    }
    Ok(parts)
}

/// Checks a path under the root: [`components`], and not the root's mark,
/// which is the sink's own.
fn under_root(path: &str) -> Result<Vec<&str>, ConfineError> {
    let parts = components(path)?;
    if parts == [crate::root_mark::ROOT_MARK] {
        return Err(ConfineError::Refused {
            path: path.to_owned(),
            reason: "the root's mark is the sink's own",
        });
    }
    Ok(parts)
}

/// The sink's root directory, held open.
pub struct Root {
    dir: OwnedFd,
    path: PathBuf,
}

/// A file opened under the root, with the directories whose entries changed
/// (and so need an fsync before the change is durable).
pub struct Opened {
    pub file: File,
    pub dirs_to_sync: Vec<OwnedFd>,
}

impl Root {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        std::fs::create_dir_all(path)?;
        let dir = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self {
            dir,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The root directory itself.
    pub fn dir(&self) -> &OwnedFd {
        &self.dir
    }

    fn io_error(&self, path: &str, op: &'static str, errno: Errno) -> ConfineError {
        ConfineError::Io {
            path: path.to_owned(),
            op,
            root: self.path.clone(),
            source: errno.into(),
        }
    }

    /// Opens the directory holding the last component, creating missing
    /// directories when `create` is set. Created directories' parents are
    /// pushed to `dirs_to_sync`.
    fn parent(
        &self,
        path: &str,
        parts: &[&str],
        create: bool,
        dirs_to_sync: &mut Vec<OwnedFd>,
    ) -> Result<OwnedFd, ConfineError> {
        let mut dir = self.dir.try_clone().map_err(|e| ConfineError::Io {
            path: path.to_owned(),
            op: "dup root",
            root: self.path.clone(),
            source: e,
        })?;
        for part in &parts[..parts.len() - 1] {
            let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
            let next = match rustix::fs::openat(&dir, *part, flags, Mode::empty()) {
                Err(Errno::NOENT) if create => {
                    match rustix::fs::mkdirat(&dir, *part, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(self.io_error(path, "mkdir", e)),
                    }
                    let opened = rustix::fs::openat(&dir, *part, flags, Mode::empty());
                    dirs_to_sync.push(dir);
                    opened
                }
                other => other,
            };
            dir = match next {
                Ok(fd) => fd,
                Err(Errno::LOOP | Errno::NOTDIR) => {
                    return Err(ConfineError::NotADirectory {
                        path: path.to_owned(),
                        component: (*part).to_owned(),
                    });
                }
                Err(e) => return Err(self.io_error(path, "open directory", e)),
            };
        }
        Ok(dir)
    }

    /// Opens `path` for writing, creating it (and its directories) if missing.
    pub fn open_for_write(&self, path: &str) -> Result<Opened, ConfineError> {
        let parts = under_root(path)?;
        let mut dirs_to_sync = Vec::new();
        let dir = self.parent(path, &parts, true, &mut dirs_to_sync)?;
        let name = parts[parts.len() - 1];
        let flags = OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = match rustix::fs::openat(&dir, name, flags, Mode::empty()) {
            Err(Errno::NOENT) => {
                let fd = rustix::fs::openat(
                    &dir,
                    name,
                    flags | OFlags::CREATE,
                    Mode::from_raw_mode(0o644),
                )
                .map_err(|e| self.refine(path, name, "create", e))?;
                dirs_to_sync.push(dir);
                fd
            }
            other => other.map_err(|e| self.refine(path, name, "open", e))?,
        };
        Ok(Opened {
            file: File::from(fd),
            dirs_to_sync,
        })
    }

    /// Opens `path` read-only, refusing symlinks anywhere on the way.
    pub fn open_for_read(&self, path: &str) -> Result<File, ConfineError> {
        let parts = under_root(path)?;
        let dir = self.parent(path, &parts, false, &mut Vec::new())?;
        let name = parts[parts.len() - 1];
        let fd = rustix::fs::openat(
            &dir,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| self.refine(path, name, "open", e))?;
        Ok(File::from(fd))
    }

    /// Renames `from` to `to` (replacing `to`), returning the directories to
    /// fsync. A rename already done (only `to` exists) is not an error, so a
    /// re-delivered rename after a crash completes cleanly.
    pub fn rename(&self, from: &str, to: &str) -> Result<Vec<OwnedFd>, ConfineError> {
        let from_parts = under_root(from)?;
        let to_parts = under_root(to)?;
        let mut dirs = Vec::new();
        let from_dir = self.parent(from, &from_parts, false, &mut dirs)?;
        let to_dir = self.parent(to, &to_parts, true, &mut dirs)?;
        let from_name = from_parts[from_parts.len() - 1];
        let to_name = to_parts[to_parts.len() - 1];
        match rustix::fs::renameat(&from_dir, from_name, &to_dir, to_name) {
            Ok(()) => {}
            // Done before: only a file at `to` is one this rename made.
            Err(Errno::NOENT)
                if rustix::fs::statat(&to_dir, to_name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(
                    |st| {
                        rustix::fs::FileType::from_raw_mode(st.st_mode)
                            != rustix::fs::FileType::Directory
                    },
                ) => {}
            // The peer named a path where a directory lives.
            Err(Errno::ISDIR | Errno::NOTEMPTY | Errno::EXIST) => {
                return Err(ConfineError::Refused {
                    path: to.to_owned(),
                    reason: "a directory is in the way of the rename",
                });
            }
            Err(e) => return Err(self.io_error(from, "rename", e)),
        }
        dirs.push(from_dir);
        dirs.push(to_dir);
        Ok(dirs)
    }

    /// The inode of the regular file at `path`, if one is there.
    pub fn inode_at(&self, path: &str) -> Result<Option<u64>, ConfineError> {
        let parts = under_root(path)?;
        let dir = match self.parent(path, &parts, false, &mut Vec::new()) {
            Ok(dir) => dir,
            Err(ConfineError::NotADirectory { .. }) => return Ok(None),
            Err(ConfineError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        match rustix::fs::statat(&dir, parts[parts.len() - 1], AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st)
                if rustix::fs::FileType::from_raw_mode(st.st_mode)
                    == rustix::fs::FileType::RegularFile =>
            {
                Ok(Some(st.st_ino))
            }
            Ok(_) | Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(self.io_error(path, "stat", e)),
        }
    }

    /// Finishes a move of the file `inode` from `from` to `to` that may or
    /// may not have been made (before a crash): the name that holds that
    /// file decides. It is moved only if `from` holds it, so a file another
    /// move has since put at `from` stays where it is. (A rename never
    /// crosses filesystems, and device numbers may change across a reboot:
    /// the inode number alone tells.)
    pub fn settle_move(
        &self,
        from: &str,
        to: &str,
        inode: u64,
    ) -> Result<SettledMove, ConfineError> {
        if self.inode_at(to)? == Some(inode) {
            // Made, perhaps not durably yet (a process crash): every
            // directory on the way to `to` (the move may have made some)
            // and the one it left are flushed.
            let to_parts = under_root(to)?;
            let mut dirs = Vec::with_capacity(to_parts.len() + 1);
            // The directory holding each component, from the root down.
            for depth in 0..to_parts.len() {
                let parts = &to_parts[..=depth];
                dirs.push(self.parent(&parts.join("/"), parts, false, &mut Vec::new())?);
            }
            let from_parts = under_root(from)?;
            match self.parent(from, &from_parts, false, &mut Vec::new()) {
                Ok(dir) => dirs.push(dir),
                Err(ConfineError::NotADirectory { .. }) => {}
                Err(ConfineError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            return Ok(SettledMove::Made(dirs));
        }
        if self.inode_at(from)? != Some(inode) {
            return Ok(SettledMove::Missing);
        }
        self.rename(from, to).map(SettledMove::Made)
    }

    /// Whether a rename to `path` needs no new directory and finds no
    /// directory in its way (nothing there, or a file it would replace).
    pub fn can_move_to(&self, path: &str) -> bool {
        let Ok(parts) = under_root(path) else {
            return false;
        };
        let Ok(dir) = self.parent(path, &parts, false, &mut Vec::new()) else {
            return false;
        };
        match rustix::fs::statat(&dir, parts[parts.len() - 1], AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => {
                rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Directory
            }
            Err(errno) => errno == Errno::NOENT,
        }
    }

    /// Removes `path` if it exists; returns its directory to fsync.
    pub fn remove(&self, path: &str) -> Result<Option<OwnedFd>, ConfineError> {
        let parts = under_root(path)?;
        let dir = match self.parent(path, &parts, false, &mut Vec::new()) {
            Ok(dir) => dir,
            Err(ConfineError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        match rustix::fs::unlinkat(&dir, parts[parts.len() - 1], AtFlags::empty()) {
            Ok(()) => Ok(Some(dir)),
            Err(Errno::NOENT) => Ok(None),
            Err(e) => Err(self.io_error(path, "unlink", e)),
        }
    }

    fn refine(&self, path: &str, name: &str, op: &'static str, errno: Errno) -> ConfineError {
        if errno == Errno::LOOP {
            ConfineError::NotADirectory {
                path: path.to_owned(),
                component: name.to_owned(),
            }
        } else {
            self.io_error(path, op, errno)
        }
    }
}

/// How [`Root::settle_move`] found a move.
#[derive(Debug)]
pub enum SettledMove {
    /// The file is at its new name now; the directories to fsync.
    Made(Vec<OwnedFd>),
    /// Neither name holds the file.
    Missing,
}

/// fsyncs a directory so that entries created, renamed or removed in it are durable.
pub fn sync_dir(dir: &impl AsFd) -> std::io::Result<()> {
    rustix::fs::fsync(dir).map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::scratch;

    #[test]
    fn escaping_paths_are_refused() {
        for bad in [
            "",
            "/etc/passwd",
            "a/../../b",
            "..",
            "a//b",
            "a/./b",
            "a/",
            "a\0b",
        ] {
            assert!(components(bad).is_err(), "{bad:?} was accepted");
        }
        assert_eq!(components("run1/a.xtc2").unwrap(), vec!["run1", "a.xtc2"]);
    }

    #[test]
    fn the_roots_mark_is_no_destination() {
        let base = scratch("confine-mark");
        let root = Root::open(&base.join("root")).unwrap();
        let mark = crate::root_mark::ROOT_MARK;
        assert!(matches!(
            root.open_for_write(mark),
            Err(ConfineError::Refused { .. })
        ));
        assert!(root.rename("a", mark).is_err());
        assert!(root.remove(mark).is_err());
        // Deeper down, the name is an ordinary file's.
        root.open_for_write(&format!("run1/{mark}")).unwrap();
    }

    #[test]
    fn symlinks_inside_the_root_are_not_followed() {
        let base = scratch("confine-symlink");
        let outside = base.join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        let root_path = base.join("root");
        let root = Root::open(&root_path).unwrap();
        std::os::unix::fs::symlink(&outside, root_path.join("link")).unwrap();
        std::os::unix::fs::symlink(outside.join("f"), root_path.join("filelink")).unwrap();
        assert!(matches!(
            root.open_for_write("link/f"),
            Err(ConfineError::NotADirectory { .. })
        ));
        assert!(matches!(
            root.open_for_write("filelink"),
            Err(ConfineError::NotADirectory { .. })
        ));
        assert!(!outside.join("f").exists());
        let opened = root.open_for_write("d1/d2/f").unwrap();
        assert_eq!(opened.dirs_to_sync.len(), 3);
        assert!(root_path.join("d1/d2/f").is_file());
        root.rename("d1/d2/f", "d1/g").unwrap();
        root.rename("d1/d2/f", "d1/g").unwrap();
        assert!(root_path.join("d1/g").is_file());
        assert!(root.remove("d1/g").unwrap().is_some());
        assert!(root.remove("d1/g").unwrap().is_none());
    }
}
