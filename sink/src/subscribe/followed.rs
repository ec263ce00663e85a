//! One file generation as a subscription follows it: where it stands,
//! its open descriptor, what is due; and the rows other than bytes a
//! subscription owes its consumer, in the order they happened.

use std::sync::Arc;
use std::time::SystemTime;

use flight_server::subscription::{Position, RowKind};

use crate::confine::Root;
use crate::feed::DurableFile;

/// One file generation a subscription follows.
#[derive(Debug)]
pub(super) struct Followed {
    /// Relative to the source (what the consumer sees).
    pub(super) path: String,
    /// Relative to the sink's root (where the bytes are read).
    pub(super) dest_path: String,
    /// The file, once opened: it follows the file across later moves.
    pub(super) file: Option<Arc<std::fs::File>>,
    /// (device, inode) of the file, when the feed said.
    pub(super) inode: Option<(u64, u64)>,
    /// Every byte below this was sent.
    pub(super) sent: u64,
    /// Every byte below this is durable.
    pub(super) durable: u64,
    /// When `durable` last moved past `sent` (the start of the lag).
    pub(super) behind_since: Option<SystemTime>,
    pub(super) sealed: Option<(u64, String)>,
    pub(super) seal_sent: bool,
    pub(super) superseded: bool,
    /// Reading it failed; tried again once the feed says more of it.
    pub(super) unreadable: bool,
}

impl Followed {
    pub(super) fn new(file: &DurableFile, path: String, sent: u64) -> Self {
        Self {
            path,
            dest_path: file.path.clone(),
            file: None,
            inode: None,
            sent,
            durable: file.contiguous_end,
            behind_since: (file.contiguous_end > sent).then(SystemTime::now),
            sealed: file.sealed.as_ref().map(|s| (s.size, s.digest.clone())),
            seal_sent: false,
            superseded: file.superseded,
            unreadable: false,
        }
    }

    /// A file the feed tells of for the first time, from its first byte.
    pub(super) fn appearing(path: String, dest_path: String) -> Self {
        Self {
            path,
            dest_path,
            file: None,
            inode: None,
            sent: 0,
            durable: 0,
            behind_since: None,
            sealed: None,
            seal_sent: false,
            superseded: false,
            unreadable: false,
        }
    }

    /// Whether bytes or its seal are left to send (now).
    pub(super) fn has_news(&self) -> bool {
        !self.superseded && (self.seal_due() || (!self.unreadable && self.sent < self.durable))
    }

    pub(super) fn seal_due(&self) -> bool {
        !self.seal_sent
            && !self.superseded
            && self
                .sealed
                .as_ref()
                .is_some_and(|(size, _)| self.sent >= *size)
    }

    pub(super) fn position(&self, key: &str, generation: u64) -> Position {
        Position {
            key: key.to_owned(),
            generation,
            offset: self.sent,
            path: self.path.clone(),
            sealed: self.seal_sent,
        }
    }

    /// The file to read: the one held open, or `dest_path` opened now and
    /// checked against the inode the feed gave (another file may hold the
    /// name after a move the feed has not told of yet).
    pub(super) fn open(&mut self, root: &Root) -> std::io::Result<Arc<std::fs::File>> {
        use std::os::unix::fs::MetadataExt;
        if let Some(file) = &self.file {
            return Ok(file.clone());
        }
        let file = root
            .open_for_read(&self.dest_path)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        if let Some(inode) = self.inode {
            let meta = file.metadata()?;
            if (meta.dev(), meta.ino()) != inode {
                return Err(std::io::Error::other(format!(
                    "{} holds another file now",
                    self.dest_path
                )));
            }
        }
        let file = Arc::new(file);
        self.file = Some(file.clone());
        Ok(file)
    }
}

/// What the consumer is told of a file besides its bytes, in the order it
/// happened (a rename onto a path another file left must come after that
/// file's rows, whatever their keys).
#[derive(Debug)]
pub(super) struct Control {
    pub(super) kind: RowKind,
    pub(super) key: String,
    pub(super) generation: u64,
    /// The path the row names, as the consumer knows it then.
    pub(super) path: String,
    pub(super) from_path: Option<String>,
}
