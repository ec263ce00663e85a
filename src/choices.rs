//! The command line's names for the sink's and the watcher's enumerated
//! settings. The libraries take their own validated types and know nothing
//! of clap; these mirror them for parsing and `--help`, and convert.

use clap::ValueEnum;

/// Where files land under the sink's root.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Layout {
    /// `<root>/<source>/<relative path>`.
    PerSource,
    /// `<root>/<relative path>`: for a sink that serves one source (the
    /// first it sees; others are refused).
    Flat,
}

impl From<Layout> for sink::Layout {
    fn from(layout: Layout) -> Self {
        match layout {
            Layout::PerSource => Self::PerSource,
            Layout::Flat => Self::Flat,
        }
    }
}

/// What happens to a generation a newer one replaces.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Superseded {
    /// Mirror the source: the old generation's file is removed.
    Mirror,
    /// Keep the old generation beside the new one as `<path>.gen<N>`.
    Keep,
}

impl From<Superseded> for sink::SupersededPolicy {
    fn from(policy: Superseded) -> Self {
        match policy {
            Superseded::Mirror => Self::Mirror,
            Superseded::Keep => Self::Keep,
        }
    }
}

/// How commit rounds make their files durable.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Sync {
    /// One syncfs for rounds touching several files on a local filesystem
    /// (Linux 5.8+) while little of the machine's memory is dirty; per file
    /// otherwise.
    Auto,
    /// fdatasync every file and fsync every changed directory.
    Files,
    /// Always one syncfs of the root's filesystem per round.
    Filesystem,
}

impl From<Sync> for sink::SyncStrategy {
    fn from(strategy: Sync) -> Self {
        match strategy {
            Sync::Auto => Self::Auto,
            Sync::Files => Self::Files,
            Sync::Filesystem => Self::Filesystem,
        }
    }
}

/// How the watcher hears of changes in its tree.
#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum Events {
    /// A watch per directory (fs.inotify.max_user_watches bounds them;
    /// directories past the limit are polled).
    Inotify,
    /// One filesystem mark for the whole tree (CAP_SYS_ADMIN; inotify
    /// without it).
    Fanotify,
    /// No events: every file is polled (network and parallel filesystems).
    Poll,
}

impl From<Events> for watcher::EventSource {
    fn from(events: Events) -> Self {
        match events {
            Events::Inotify => Self::Inotify,
            Events::Fanotify => Self::Fanotify,
            Events::Poll => Self::Poll,
        }
    }
}
