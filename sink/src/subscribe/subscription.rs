//! One subscription's state: the file generations it follows and where
//! each stands. It starts from what the manifest holds (catching up from
//! the ticket's start or cursor), moves on with the commit feed's rounds
//! (following live), and reads its files into batches, taking turns.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::SystemTime;

use flight_server::subscription::{
    ConsumerBatchBuilder, ConsumerRow, CursorUpdate, Globs, Position, RowKind, Start, Ticket,
};

use super::descriptors::{OWN_OPEN_FILES, SharedDescriptors};
use super::followed::{Control, Followed};
use super::listing::relative;
use super::rows::{base_row, read_at};
use super::stats::SubscriberStats;
use crate::config::Layout;
use crate::confine::Root;
use crate::error::SinkError;
use crate::feed::{CommitRound, DurableFile, FileChange};

/// A subscription's state: the files it follows, by (key, generation).
pub(super) struct Subscription {
    pub(super) ticket: Ticket,
    globs: Globs,
    layout: Layout,
    /// The sink's root, under which the files are read.
    root: Arc<Root>,
    files: BTreeMap<(String, u64), Followed>,
    /// Rows to send before any data, in the order they happened.
    control: std::collections::VecDeque<Control>,
    /// Generations superseded before or while this subscription followed
    /// them: what the feed says of them later (a kept one moving on) is not
    /// news to the consumer.
    retired: std::collections::BTreeSet<(String, u64)>,
    /// Where the last batch stopped, so files take turns.
    next_turn: Option<(String, u64)>,
    stats: Arc<SubscriberStats>,
    /// Where descriptors beyond its own come from, and how many it holds.
    shared_descriptors: Arc<SharedDescriptors>,
    borrowed_descriptors: usize,
}

impl Subscription {
    pub(super) fn new(
        ticket: Ticket,
        globs: Globs,
        root: Arc<Root>,
        layout: Layout,
        stats: Arc<SubscriberStats>,
        shared_descriptors: Arc<SharedDescriptors>,
    ) -> Self {
        Self {
            ticket,
            globs,
            layout,
            root,
            files: BTreeMap::new(),
            control: Default::default(),
            retired: Default::default(),
            next_turn: None,
            stats,
            shared_descriptors,
            borrowed_descriptors: 0,
        }
    }

    /// The path a consumer sees: relative to the source.
    fn relative<'a>(&self, dest_path: &'a str) -> &'a str {
        relative(self.layout, &self.ticket.source, dest_path)
    }

    fn matches(&self, key: &str, relative: &str) -> bool {
        match &self.ticket.file_key {
            Some(wanted) => wanted == key,
            None => self
                .globs
                .matches(&format!("{}/{relative}", self.ticket.source)),
        }
    }

    fn tell(&mut self, kind: RowKind, id: &(String, u64), path: String, from_path: Option<String>) {
        self.control.push_back(Control {
            kind,
            key: id.0.clone(),
            generation: id.1,
            path,
            from_path,
        });
    }

    /// Starts from what the manifest holds: every matching file of the
    /// source, at the ticket's start.
    pub(super) fn start(
        &mut self,
        files: Vec<DurableFile>,
    ) -> Result<Option<CursorUpdate>, SinkError> {
        let ours: Vec<DurableFile> = files
            .into_iter()
            .filter(|f| f.id.source == self.ticket.source)
            .collect();
        // The newest generation of each key.
        let mut newest: BTreeMap<String, u64> = BTreeMap::new();
        for file in &ours {
            let known = newest.entry(file.id.key.clone()).or_insert(0);
            *known = (*known).max(file.id.generation);
        }
        let cursor: BTreeMap<String, Position> = self
            .ticket
            .cursor
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.key.clone(), p))
            .collect();
        for (key, position) in &cursor {
            let Some(&newest) = newest.get(key) else {
                return Err(SinkError::Peer(format!(
                    "the cursor names file {key:?} of source {:?}, which this sink does not hold",
                    self.ticket.source
                )));
            };
            if position.generation > newest {
                return Err(SinkError::Peer(format!(
                    "the cursor names generation {} of file {key:?}, which this sink never held (newest: {newest})",
                    position.generation
                )));
            }
        }
        let mut initial = Vec::new();
        // Generations the consumer knew that are void now: told first.
        for (key, position) in &cursor {
            let id = (key.clone(), position.generation);
            let live = ours.iter().any(|f| {
                f.id.key == *key && f.id.generation == position.generation && !f.superseded
            });
            if !live {
                self.tell(RowKind::Superseded, &id, position.path.clone(), None);
                self.retired.insert(id);
            }
        }
        for file in &ours {
            let relative = self.relative(&file.path).to_owned();
            let id = (file.id.key.clone(), file.id.generation);
            let is_newest = newest.get(&id.0) == Some(&id.1);
            if file.superseded || !is_newest {
                self.retired.insert(id);
                continue;
            }
            let known = cursor.get(&id.0).filter(|p| p.generation == id.1);
            let followed = match (self.ticket.start, known) {
                (Start::Cursor, Some(position)) => {
                    if position.offset > file.contiguous_end {
                        return Err(SinkError::Peer(format!(
                            "the cursor is at offset {} of {relative:?} generation {}, past its durable end {}",
                            position.offset, id.1, file.contiguous_end
                        )));
                    }
                    let mut followed = Followed::new(file, relative.clone(), position.offset);
                    followed.seal_sent = position.sealed;
                    // Renamed since the consumer's last batch: told first.
                    if !position.path.is_empty() && position.path != relative {
                        self.tell(RowKind::Renamed, &id, relative, Some(position.path.clone()));
                    }
                    followed
                }
                _ if !self.matches(&id.0, &relative) => continue,
                (Start::Beginning | Start::Cursor, _) => {
                    self.tell(RowKind::Opened, &id, relative.clone(), None);
                    Followed::new(file, relative, 0)
                }
                (Start::Now, _) => {
                    let mut followed = Followed::new(file, relative, file.contiguous_end);
                    // Sealed before the consumer came: nothing of it is news.
                    followed.seal_sent = followed.sealed.is_some();
                    initial.push(followed.position(&id.0, id.1));
                    followed
                }
            };
            self.files.insert(id, followed);
        }
        Ok((self.ticket.start == Start::Now).then_some(CursorUpdate { cursor: initial }))
    }

    /// Takes in what a commit round made durable.
    pub(super) fn apply(&mut self, round: &CommitRound) {
        for commit in &round.files {
            if commit.id.source != self.ticket.source {
                continue;
            }
            let relative = self.relative(&commit.path).to_owned();
            let id = (commit.id.key.clone(), commit.id.generation);
            if self.retired.contains(&id) {
                continue;
            }
            if !self.files.contains_key(&id) {
                // A file that appears now, or first matches: from its start.
                if !self.matches(&id.0, &relative)
                    || commit.changes.contains(&FileChange::Superseded)
                {
                    continue;
                }
                self.tell(RowKind::Opened, &id, relative.clone(), None);
                self.files.insert(
                    id.clone(),
                    Followed::appearing(relative.clone(), commit.path.clone()),
                );
            }
            let mut told = Vec::new();
            let Some(followed) = self.files.get_mut(&id) else {
                continue;
            };
            followed.unreadable = false;
            if followed.sealed.is_none()
                && let Some(sealed) = &commit.sealed
            {
                // Sealed before it came to be followed (under a name the
                // globs did not match): its seal row is still due.
                followed.sealed = Some((sealed.size, sealed.digest.clone()));
            }
            if commit.inode.is_some() && commit.inode != followed.inode {
                followed.inode = commit.inode;
                followed.file = None;
            }
            if commit.contiguous_end > followed.durable {
                followed.durable = commit.contiguous_end;
                if followed.sent < followed.durable && followed.behind_since.is_none() {
                    followed.behind_since = Some(round.committed_at);
                }
            }
            for change in &commit.changes {
                match change {
                    FileChange::Opened => {}
                    FileChange::Renamed { .. } => {
                        if followed.path != relative {
                            told.push((
                                RowKind::Renamed,
                                relative.clone(),
                                Some(followed.path.clone()),
                            ));
                        }
                        followed.path = relative.clone();
                        followed.dest_path = commit.path.clone();
                    }
                    FileChange::Sealed { size, digest } => {
                        followed.sealed = Some((*size, digest.clone()));
                    }
                    FileChange::Superseded => {
                        followed.superseded = true;
                        told.push((RowKind::Superseded, followed.path.clone(), None));
                    }
                }
            }
            for (kind, path, from_path) in told {
                self.tell(kind, &id, path, from_path);
            }
            if self.files.get(&id).is_some_and(|f| f.superseded) {
                self.files.remove(&id);
                self.retired.insert(id);
            }
        }
        self.update_lag();
    }

    /// Takes in what the manifest holds now (after the feed dropped rounds).
    pub(super) fn resync(&mut self, files: Vec<DurableFile>) {
        let round = CommitRound {
            sequence: 0,
            committed_at: SystemTime::now(),
            stages: Default::default(),
            files: files
                .into_iter()
                .filter(|f| f.id.source == self.ticket.source)
                .map(|file| {
                    let id = (file.id.key.clone(), file.id.generation);
                    let mut changes = Vec::new();
                    if let Some(followed) = self.files.get(&id)
                        && followed.dest_path != file.path
                    {
                        changes.push(FileChange::Renamed {
                            from: followed.dest_path.clone(),
                        });
                    }
                    if let Some(sealed) = &file.sealed {
                        changes.push(FileChange::Sealed {
                            size: sealed.size,
                            digest: sealed.digest.clone(),
                        });
                    }
                    if file.superseded {
                        changes.push(FileChange::Superseded);
                    }
                    crate::feed::FileCommit {
                        id: file.id,
                        path: file.path,
                        ranges: Vec::new(),
                        contiguous_end: file.contiguous_end,
                        changes,
                        received: None,
                        inode: None,
                        sealed: file.sealed.clone(),
                    }
                })
                .collect(),
        };
        self.apply(&round);
    }

    pub(super) fn update_lag(&self) {
        let behind: u64 = self
            .files
            .values()
            .map(|f| f.durable.saturating_sub(f.sent))
            .sum();
        let since = self
            .files
            .values()
            .filter(|f| f.sent < f.durable)
            .filter_map(|f| f.behind_since)
            .min()
            .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_micros() as u64);
        self.stats.behind_bytes.store(behind, Ordering::Relaxed);
        self.stats.behind_since_us.store(since, Ordering::Relaxed);
    }

    pub(super) fn has_news(&self) -> bool {
        !self.control.is_empty() || self.files.values().any(Followed::has_news)
    }

    /// The next batch: first what happened to files other than their
    /// bytes, in order; then files take turns, each sending what it has
    /// until the batch is full. Blocking (reads the files).
    pub(super) fn next_batch(&mut self) -> Option<(arrow_array::RecordBatch, CursorUpdate)> {
        let budget = self.ticket.batch_bytes();
        let mut builder = ConsumerBatchBuilder::new(&self.ticket.source, budget as usize);
        let mut update = CursorUpdate::default();
        for control in self.control.drain(..) {
            let id = (control.key, control.generation);
            let offset = self.files.get(&id).map_or(0, |f| f.sent);
            builder.push(&ConsumerRow {
                kind: control.kind,
                path: &control.path,
                file_key: &id.0,
                generation: id.1,
                offset,
                data: &[],
                size: None,
                digest: None,
                from_path: control.from_path.as_deref(),
            });
            update.cursor.push(Position {
                key: id.0.clone(),
                generation: id.1,
                offset,
                path: control.path.clone(),
                sealed: self.files.get(&id).is_some_and(|f| f.seal_sent),
            });
        }
        let mut room = budget;
        let ids: Vec<(String, u64)> = {
            let start = self.next_turn.take();
            let mut ids: Vec<_> = self.files.keys().cloned().collect();
            if let Some(start) = start {
                let at = ids.partition_point(|id| *id < start);
                ids.rotate_left(at);
            }
            ids
        };
        for id in ids {
            if room == 0 {
                self.next_turn = Some(id);
                break;
            }
            let root = &self.root;
            let Some(file) = self.files.get_mut(&id) else {
                continue;
            };
            if !file.has_news() {
                continue;
            }
            let (key, generation) = (id.0.as_str(), id.1);
            if file.sent < file.durable && !file.unreadable {
                let len = (file.durable - file.sent).min(room);
                let offset = file.sent;
                let read = file.open(root).and_then(|opened| {
                    let row = base_row(RowKind::Data, file, key, generation);
                    builder.push_read(&row, len as usize, |buf| read_at(&opened, offset, buf))
                });
                match read {
                    Ok(got) if got > 0 => {
                        file.sent += got as u64;
                        room = room.saturating_sub(got as u64);
                        self.stats
                            .sent_bytes
                            .fetch_add(got as u64, Ordering::Relaxed);
                        if file.sent >= file.durable {
                            file.behind_since = None;
                        }
                    }
                    // Moved or replaced since the feed said where it is: the
                    // feed's next word on it says where to read.
                    Ok(_) | Err(_) => {
                        file.unreadable = true;
                        file.file = None;
                    }
                }
            }
            if file.seal_due()
                && let Some((size, digest)) = file.sealed.clone()
            {
                builder.push(&ConsumerRow {
                    size: Some(size),
                    digest: Some(&digest),
                    ..base_row(RowKind::Sealed, file, key, generation)
                });
                file.seal_sent = true;
                file.file = None;
            }
            update.cursor.push(file.position(key, generation));
        }
        self.close_spare_files();
        self.update_lag();
        (builder.rows() > 0).then(|| (builder.finish(), update))
    }

    /// Keeps at most its own [`OWN_OPEN_FILES`] descriptors and those it
    /// could borrow, closing those of files with nothing to send first.
    fn close_spare_files(&mut self) {
        let open = self.files.values().filter(|f| f.file.is_some()).count();
        let allowed = OWN_OPEN_FILES + self.borrowed_descriptors;
        if open > allowed {
            self.borrowed_descriptors += self.shared_descriptors.borrow(open - allowed);
        }
        let mut excess = open.saturating_sub(OWN_OPEN_FILES + self.borrowed_descriptors);
        for caught_up in [true, false] {
            for file in self.files.values_mut() {
                if excess == 0 {
                    break;
                }
                if file.file.is_some() && (file.sent >= file.durable) == caught_up {
                    file.file = None;
                    excess -= 1;
                }
            }
        }
        // What it no longer holds open (files sealed, superseded or gone)
        // goes back to the pool for other subscriptions.
        let open = self.files.values().filter(|f| f.file.is_some()).count();
        let needed = open.saturating_sub(OWN_OPEN_FILES);
        if self.borrowed_descriptors > needed {
            self.shared_descriptors
                .give_back(self.borrowed_descriptors - needed);
            self.borrowed_descriptors = needed;
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.shared_descriptors.give_back(self.borrowed_descriptors);
    }
}
