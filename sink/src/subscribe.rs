//! Live-tail subscriptions (Flight DoGet): a consumer follows the files of
//! one source as their bytes become durable.
//!
//! Each subscription is a task that owns its position in every file it
//! follows. It learns what became durable from the commit feed (and from
//! the manifest when it starts, or when it fell so far behind that the
//! feed dropped rounds for it) and reads the bytes from the destination
//! files when it sends them: nothing is kept in memory for a consumer, so
//! one that stops reading costs a batch, and simply falls behind. Only
//! bytes below a file's durable contiguous end are sent (read-committed),
//! per file in offset order, never twice in one stream.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use arrow_flight::FlightData;
use flight_server::subscription::{
    ConsumerBatchBuilder, ConsumerRow, CursorUpdate, Globs, Position, RowKind, Start, Ticket,
    encode_batch, schema_message,
};
use futures::stream::BoxStream;
use serde::Serialize;
use tokio::sync::{broadcast, mpsc};

use crate::config::Layout;
use crate::confine::Root;
use crate::feed::{CommitRound, DurableFile, FileChange};
use crate::place::Placer;
use crate::{Sink, SinkError};

/// Subscriptions served at once; more are refused as unavailable.
pub const MAX_SUBSCRIBERS: usize = 64;

/// What the sink knows of its subscriptions, for `status`.
#[derive(Default)]
pub(crate) struct Subscribers {
    next_id: AtomicU64,
    live: std::sync::Mutex<BTreeMap<u64, Arc<SubscriberStats>>>,
    permits: Option<Arc<tokio::sync::Semaphore>>,
    descriptors: Arc<SharedDescriptors>,
}

impl Subscribers {
    /// `shared_descriptors`: what subscriptions may keep open together
    /// beyond their own [`OWN_OPEN_FILES`] each.
    pub fn new(shared_descriptors: usize) -> Self {
        Self {
            permits: Some(Arc::new(tokio::sync::Semaphore::new(MAX_SUBSCRIBERS))),
            descriptors: Arc::new(SharedDescriptors {
                limit: shared_descriptors,
                lent: AtomicU64::new(0),
            }),
            ..Self::default()
        }
    }

    pub fn status(&self) -> Vec<SubscriptionStatus> {
        let now = SystemTime::now();
        crate::state::lock(&self.live)
            .iter()
            .map(|(&id, stats)| stats.status(id, now))
            .collect()
    }
}

/// One subscription's progress, shared between its task and `status`.
pub(crate) struct SubscriberStats {
    source: String,
    globs: Vec<String>,
    peer: String,
    sent_bytes: AtomicU64,
    behind_bytes: AtomicU64,
    /// When the oldest durable byte not yet sent became durable (µs since
    /// the epoch; 0 when caught up).
    behind_since_us: AtomicU64,
}

/// A subscription as `status` shows it.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct SubscriptionStatus {
    pub id: u64,
    pub peer: String,
    pub source: String,
    pub globs: Vec<String>,
    pub sent_bytes: u64,
    /// Durable bytes of its files not sent to it yet.
    pub behind_bytes: u64,
    /// How long the oldest of those has been durable.
    pub behind_seconds: f64,
}

impl SubscriberStats {
    fn status(&self, id: u64, now: SystemTime) -> SubscriptionStatus {
        let since = self.behind_since_us.load(Ordering::Relaxed);
        let behind_seconds = match since {
            0 => 0.0,
            us => now.duration_since(SystemTime::UNIX_EPOCH).map_or(0.0, |d| {
                (d.as_micros() as u64).saturating_sub(us) as f64 / 1e6
            }),
        };
        SubscriptionStatus {
            id,
            peer: self.peer.clone(),
            source: self.source.clone(),
            globs: self.globs.clone(),
            sent_bytes: self.sent_bytes.load(Ordering::Relaxed),
            behind_bytes: self.behind_bytes.load(Ordering::Relaxed),
            behind_seconds,
        }
    }
}

/// One file generation a subscription follows.
#[derive(Debug)]
struct Followed {
    /// Relative to the source (what the consumer sees).
    path: String,
    /// Relative to the sink's root (where the bytes are read).
    dest_path: String,
    /// The file, once opened: it follows the file across later moves.
    file: Option<Arc<std::fs::File>>,
    /// (device, inode) of the file, when the feed said.
    inode: Option<(u64, u64)>,
    /// Every byte below this was sent.
    sent: u64,
    /// Every byte below this is durable.
    durable: u64,
    /// When `durable` last moved past `sent` (the start of the lag).
    behind_since: Option<SystemTime>,
    sealed: Option<(u64, String)>,
    seal_sent: bool,
    superseded: bool,
    /// Reading it failed; tried again once the feed says more of it.
    unreadable: bool,
}

impl Followed {
    fn new(file: &DurableFile, path: String, sent: u64) -> Self {
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
    fn appearing(path: String, dest_path: String) -> Self {
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
    fn has_news(&self) -> bool {
        !self.superseded && (self.seal_due() || (!self.unreadable && self.sent < self.durable))
    }

    fn seal_due(&self) -> bool {
        !self.seal_sent
            && !self.superseded
            && self
                .sealed
                .as_ref()
                .is_some_and(|(size, _)| self.sent >= *size)
    }

    fn position(&self, key: &str, generation: u64) -> Position {
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
    fn open(&mut self, root: &Root) -> std::io::Result<Arc<std::fs::File>> {
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
struct Control {
    kind: RowKind,
    key: String,
    generation: u64,
    /// The path the row names, as the consumer knows it then.
    path: String,
    from_path: Option<String>,
}

/// Descriptors a subscription may always keep open between batches. It
/// borrows more from [`SharedDescriptors`] while there are any: a
/// subscription that closed and reopened files at every batch spent most
/// of its time doing that (docs/measurements.md). Beyond what it holds,
/// files caught up are closed first, and opened again (and checked) when
/// they grow.
const OWN_OPEN_FILES: usize = 64;

/// Descriptors that subscriptions keep open between batches beyond their
/// own, lent from one pool for the whole sink (its `--max-open-files`), so
/// that what many subscriptions of many files hold stays bounded. (While a
/// batch is read, every file it reads from is open too.)
#[derive(Default)]
pub(crate) struct SharedDescriptors {
    limit: usize,
    lent: AtomicU64,
}

impl SharedDescriptors {
    /// Lends up to `wanted`; returns how many it lent.
    fn borrow(&self, wanted: usize) -> usize {
        let mut lent = 0;
        let _ = self
            .lent
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                lent = (self.limit as u64).saturating_sub(now).min(wanted as u64);
                (lent > 0).then_some(now + lent)
            });
        lent as usize
    }

    fn give_back(&self, count: usize) {
        self.lent.fetch_sub(count as u64, Ordering::AcqRel);
    }
}

/// A subscription's state: the files it follows, by (key, generation).
struct Subscription {
    ticket: Ticket,
    globs: Globs,
    layout: Layout,
    /// Whose root the files are read under.
    placer: Arc<Placer>,
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
    fn start(&mut self, files: Vec<DurableFile>) -> Result<Option<CursorUpdate>, SinkError> {
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
    fn apply(&mut self, round: &CommitRound) {
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
    fn resync(&mut self, files: Vec<DurableFile>) {
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

    fn update_lag(&self) {
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

    fn has_news(&self) -> bool {
        !self.control.is_empty() || self.files.values().any(Followed::has_news)
    }

    /// The next batch: first what happened to files other than their
    /// bytes, in order; then files take turns, each sending what it has
    /// until the batch is full. Blocking (reads the files).
    fn next_batch(&mut self) -> Option<(arrow_array::RecordBatch, CursorUpdate)> {
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
            let root = &self.placer.root;
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

/// A row of `kind` about `file`, at its position, without data.
fn base_row<'a>(
    kind: RowKind,
    file: &'a Followed,
    key: &'a str,
    generation: u64,
) -> ConsumerRow<'a> {
    ConsumerRow {
        kind,
        path: &file.path,
        file_key: key,
        generation,
        offset: file.sent,
        data: &[],
        size: None,
        digest: None,
        from_path: None,
    }
}

/// A destination path relative to its source, as consumers see it.
fn relative<'a>(layout: Layout, source: &str, dest_path: &'a str) -> &'a str {
    match layout {
        Layout::PerSource => dest_path
            .strip_prefix(source)
            .and_then(|rest| rest.strip_prefix('/'))
            .unwrap_or(dest_path),
        Layout::Flat => dest_path,
    }
}

/// What a listed file says of itself, as its FlightInfo's `app_metadata`.
#[derive(Serialize)]
struct ListedFile<'a> {
    source: &'a str,
    path: &'a str,
    file_key: &'a str,
    generation: u64,
    durable_bytes: u64,
    sealed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    digest: Option<&'a str>,
    /// When the sink last recorded a change to it (ms since the Unix epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    last_commit_unix_ms: Option<u64>,
}

impl Sink {
    /// The files a ListFlights criteria names: a glob over
    /// `<source>/<path>` (empty: every file), superseded generations left
    /// out. Each comes with a ticket that reads it from its start (and
    /// follows it while it is not sealed). Blocking.
    pub(crate) fn list_files(
        &self,
        criteria: &str,
    ) -> Result<Vec<arrow_flight::FlightInfo>, SinkError> {
        use arrow_flight::{FlightDescriptor, FlightEndpoint, FlightInfo};
        let filter = match criteria {
            "" => None,
            glob => {
                let source = glob.split('/').next().unwrap_or_default();
                if source.contains(['*', '?', '[', '{']) {
                    return Err(SinkError::Peer(format!(
                        "criteria {glob:?} must start with a source name (<source>/<glob>)"
                    )));
                }
                let globs = Globs::new(source, &[glob.to_owned()]).map_err(SinkError::Peer)?;
                Some((source.to_owned(), globs))
            }
        };
        let snapshot = self.durable_files()?;
        let layout = self.placer.layout;
        let mut infos = Vec::new();
        for file in &snapshot.files {
            let source = file.id.source.as_str();
            let path = relative(layout, source, &file.path);
            if file.superseded {
                continue;
            }
            if let Some((wanted, globs)) = &filter
                && (wanted != source || !globs.matches(&format!("{source}/{path}")))
            {
                continue;
            }
            let ticket = Ticket {
                source: source.to_owned(),
                globs: Vec::new(),
                file_key: Some(file.id.key.clone()),
                start: Start::Beginning,
                cursor: None,
                follow: file.sealed.is_none(),
                max_batch_bytes: None,
            };
            let listed = ListedFile {
                source,
                path,
                file_key: &file.id.key,
                generation: file.id.generation,
                durable_bytes: file.contiguous_end,
                sealed: file.sealed.is_some(),
                size: file.sealed.as_ref().map(|s| s.size),
                digest: file.sealed.as_ref().map(|s| s.digest.as_str()),
                last_commit_unix_ms: file.committed_unix_ms,
            };
            let info = FlightInfo::new()
                .try_with_schema(&flight_server::subscription::consumer_schema())
                .map_err(|e| SinkError::Internal(format!("encoding the consumer schema: {e}")))?
                .with_descriptor(FlightDescriptor::new_path(vec![
                    source.to_owned(),
                    path.to_owned(),
                ]))
                .with_endpoint(
                    FlightEndpoint::new().with_ticket(arrow_flight::Ticket::new(ticket.encode())),
                )
                .with_total_bytes(file.contiguous_end as i64)
                .with_app_metadata(serde_json::to_vec(&listed).unwrap_or_default());
            infos.push(info);
        }
        Ok(infos)
    }
}

/// Reads into `buf` from a file at `offset`, as much as there is.
fn read_at(file: &std::fs::File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64)? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}

/// A message of a subscription's stream, or the error that ends it (the
/// service says it in gRPC terms).
type Sent = Result<FlightData, SinkError>;

impl Sink {
    /// Starts a subscription: the stream of its Flight messages.
    pub(crate) async fn subscribe(
        &self,
        ticket: Ticket,
        peer: String,
    ) -> Result<BoxStream<'static, Sent>, SinkError> {
        let globs = Globs::new(&ticket.source, &ticket.globs).map_err(SinkError::Peer)?;
        // Asked before anything else is read, and without the commit gate.
        let (placer, source) = (self.placer.clone(), ticket.source.clone());
        let known = tokio::task::spawn_blocking(move || placer.manifest.files_of_source(&source))
            .await
            .map_err(|e| SinkError::Internal(format!("reading the manifest: {e}")))?
            .map_err(|e| SinkError::Storage(format!("reading the manifest: {e}")))?;
        if known.is_empty() {
            return Err(SinkError::Peer(format!(
                "source {:?} is unknown to this sink",
                ticket.source
            )));
        }
        let permit = self
            .subscribers
            .permits
            .clone()
            .and_then(|permits| permits.try_acquire_owned().ok())
            .ok_or_else(|| {
                SinkError::Storage(format!(
                    "the sink serves its maximum of {MAX_SUBSCRIBERS} subscriptions; retry later"
                ))
            })?;
        // Subscribed before the snapshot is read: no round falls between.
        let feed = self.feed().subscribe().ok_or(SinkError::Shutdown)?;
        let sink = self.clone();
        let snapshot = tokio::task::spawn_blocking(move || sink.durable_files())
            .await
            .map_err(|e| SinkError::Internal(format!("reading the manifest: {e}")))??;
        let id = self.subscribers.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let stats = Arc::new(SubscriberStats {
            source: ticket.source.clone(),
            globs: ticket.globs.clone(),
            peer,
            sent_bytes: AtomicU64::new(0),
            behind_bytes: AtomicU64::new(0),
            behind_since_us: AtomicU64::new(0),
        });
        let mut subscription = Subscription {
            ticket,
            globs,
            layout: self.placer.layout,
            placer: self.placer.clone(),
            files: BTreeMap::new(),
            control: Default::default(),
            retired: Default::default(),
            next_turn: None,
            stats: stats.clone(),
            shared_descriptors: self.subscribers.descriptors.clone(),
            borrowed_descriptors: 0,
        };
        let initial = subscription.start(snapshot.files)?;
        subscription.update_lag();
        crate::state::lock(&self.subscribers.live).insert(id, stats);
        let (tx, rx) = mpsc::channel::<Sent>(2);
        let sink = self.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let outcome = serve(subscription, snapshot.sequence, feed, initial, &tx, &sink).await;
            crate::state::lock(&sink.subscribers.live).remove(&id);
            if let Err(error) = outcome {
                let _ = tx.send(Err(error)).await;
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }
}

/// Runs one subscription until its consumer goes away, it is done (without
/// `follow`), or the sink stops.
async fn serve(
    mut subscription: Subscription,
    snapshot_sequence: u64,
    mut feed: broadcast::Receiver<Arc<CommitRound>>,
    initial: Option<CursorUpdate>,
    tx: &mpsc::Sender<Sent>,
    sink: &Sink,
) -> Result<(), SinkError> {
    let internal = SinkError::Internal;
    if tx.send(Ok(schema_message())).await.is_err() {
        return Ok(());
    }
    if let Some(update) = initial {
        let empty = ConsumerBatchBuilder::new(&subscription.ticket.source, 0).finish();
        let message = encode_batch(&empty, &update).map_err(|e| internal(e.to_string()))?;
        if tx.send(Ok(message)).await.is_err() {
            return Ok(());
        }
    }
    let mut seen = snapshot_sequence;
    let follow = subscription.ticket.follow;
    loop {
        // Rounds that came meanwhile are taken in first, so a batch reads
        // as far as is durable. Without `follow` the stream sends what was
        // durable when it started, and ends.
        if follow {
            loop {
                let received = match feed.try_recv() {
                    Err(broadcast::error::TryRecvError::Empty) => break,
                    Ok(round) => Ok(round),
                    Err(broadcast::error::TryRecvError::Lagged(n)) => {
                        Err(broadcast::error::RecvError::Lagged(n))
                    }
                    Err(broadcast::error::TryRecvError::Closed) => {
                        Err(broadcast::error::RecvError::Closed)
                    }
                };
                take_in(&mut subscription, sink, &mut seen, received).await?;
            }
        }
        if subscription.has_news() {
            let (batch, subscription_back) = crate::blocking::run_blocking(move || {
                let batch = subscription.next_batch();
                (batch, subscription)
            })
            .await
            .map_err(|e| e.context("reading files for a subscriber"))?;
            subscription = subscription_back;
            if let Some((batch, update)) = batch {
                let message = encode_batch(&batch, &update).map_err(|e| internal(e.to_string()))?;
                // The consumer's pace: a full channel waits here (HTTP/2
                // flow control stops it filling beyond that), while the
                // feed's rounds are still taken in, so that its lag shows.
                loop {
                    tokio::select! {
                        permit = tx.reserve() => {
                            let Ok(permit) = permit else {
                                return Ok(());
                            };
                            permit.send(Ok(message));
                            break;
                        }
                        received = feed.recv(), if follow => {
                            take_in(&mut subscription, sink, &mut seen, received).await?;
                        }
                    }
                }
                continue;
            }
        }
        if !follow {
            return Ok(());
        }
        tokio::select! {
            received = feed.recv() => take_in(&mut subscription, sink, &mut seen, received).await?,
            () = tx.closed() => return Ok(()),
        }
    }
}

/// Takes in what the feed said: a round not seen yet, or, when the feed
/// dropped rounds for this subscriber, what the manifest holds now.
async fn take_in(
    subscription: &mut Subscription,
    sink: &Sink,
    seen: &mut u64,
    received: Result<Arc<CommitRound>, broadcast::error::RecvError>,
) -> Result<(), SinkError> {
    match received {
        Ok(round) => {
            if round.sequence > *seen {
                *seen = round.sequence;
                subscription.apply(&round);
            }
            Ok(())
        }
        Err(broadcast::error::RecvError::Lagged(_)) => resync(subscription, sink, seen).await,
        Err(broadcast::error::RecvError::Closed) => Err(SinkError::Shutdown),
    }
}

/// The feed dropped rounds for this subscriber (it was that far behind):
/// what the manifest holds now stands in for them.
async fn resync(
    subscription: &mut Subscription,
    sink: &Sink,
    seen: &mut u64,
) -> Result<(), SinkError> {
    let reading = sink.clone();
    let snapshot = tokio::task::spawn_blocking(move || reading.durable_files())
        .await
        .map_err(|e| SinkError::Internal(format!("reading the manifest: {e}")))??;
    *seen = snapshot.sequence;
    subscription.resync(snapshot.files);
    Ok(())
}
