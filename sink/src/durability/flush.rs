//! Making placed bytes durable: fdatasync each file (and fsync each changed
//! directory), or, for rounds that touch many files, one `syncfs(2)` of the
//! filesystem under the root.
//!
//! Every fdatasync of a file that grew ends in its own device flush, and a
//! virtual or parallel disk serialises those: a round of a hundred small
//! appends costs about a hundred flushes in a row. `syncfs` writes back every
//! dirty page of the filesystem and commits its journal once, so the same
//! round costs one. The price is that it also waits for dirty data other
//! writers left on that filesystem, which is why [`SyncStrategy::Auto`] only
//! uses it on local filesystems, for rounds with several files, and while
//! the machine holds little dirty data.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::blocking::join_error;
use crate::confine::{Root, sync_dir};
use crate::error::SinkError;
use crate::health::Health;

/// How a commit round makes its files durable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SyncStrategy {
    /// `syncfs` for rounds touching several files when the root is on a
    /// local filesystem (ext4, XFS, btrfs, tmpfs), the kernel reports
    /// writeback errors through it (5.8+) and the machine holds at most
    /// 64 MiB of dirty data (a `syncfs` would write back all of it); per
    /// file otherwise.
    #[default]
    Auto,
    /// fdatasync every file and fsync every changed directory, in parallel.
    Files,
    /// One `syncfs` of the root's filesystem per round (files on other
    /// filesystems under the root are still flushed one by one).
    Filesystem,
}

/// Rounds with at least this many files and directories use `syncfs` under
/// [`SyncStrategy::Auto`]: below it, a few parallel fdatasyncs cost about the
/// same and never wait for other writers' data.
const AUTO_SYNCFS_FROM: usize = 4;

/// `syncfs` writes back every dirty page of the filesystem, whoever left
/// it there. With more than this much dirty data on the machine (the
/// kernel lets it grow to a tenth of memory before writing back on its
/// own), `Auto` flushes a round's files one by one instead: a `syncfs`
/// then waits for everyone's writeback while writes pile up behind it
/// (docs/measurements.md).
const AUTO_SYNCFS_DIRTY_MAX: u64 = 64 << 20;

/// Flushes at once for a round of many files that does not use `syncfs`
/// because the machine is dirty. Each runs on a thread of tokio's blocking
/// pool, which placement then also uses, and every thread that has handled
/// batches keeps a heap of its own: more at once grows the pool, and the
/// sink's memory with it (docs/measurements.md).
const DIRTY_FALLBACK_PARALLELISM: usize = 8;

/// Most journaled files a background flush flushes one by one (see
/// [`Flusher::flush_in_background`]).
const BACKGROUND_EACH_UP_TO: usize = 256;

/// Filesystems whose `syncfs` is a local journal commit. Network and
/// parallel filesystems (NFS, Lustre, GPFS, ...) may implement it as a
/// client-wide flush or not at all, so `Auto` stays with per-file flushes there.
pub(crate) const LOCAL_FILESYSTEMS: [(i64, &str); 4] = [
    (0xEF53, "ext2/3/4"),
    (0x5846_5342, "xfs"),
    (0x9123_683E, "btrfs"),
    (0x0102_1994, "tmpfs"),
];

/// A file or directory a round must make durable.
#[derive(Clone)]
pub(crate) enum SyncTarget {
    File(Arc<File>),
    Dir(Arc<OwnedFd>),
}

impl SyncTarget {
    /// Which open file or directory this is (two targets may share one).
    pub(crate) fn address(&self) -> usize {
        match self {
            SyncTarget::File(file) => Arc::as_ptr(file) as usize,
            SyncTarget::Dir(dir) => Arc::as_ptr(dir) as usize,
        }
    }

    pub(crate) fn sync(&self) -> Result<(), SinkError> {
        match self {
            SyncTarget::File(file) => fdatasync(file).map_err(|e| {
                SinkError::storage(format_args!("fdatasync of {}", describe(file)), e)
            }),
            SyncTarget::Dir(dir) => sync_dir(dir.as_ref()).map_err(|e| {
                SinkError::storage(format_args!("fsync of the directory {}", describe(dir)), e)
            }),
        }
    }

    fn device(&self) -> Option<u64> {
        let stat = match self {
            SyncTarget::File(file) => rustix::fs::fstat(file.as_fd()),
            SyncTarget::Dir(dir) => rustix::fs::fstat(dir.as_fd()),
        };
        stat.ok().map(|st| st.st_dev)
    }
}

fn fdatasync(file: &File) -> std::io::Result<()> {
    #[cfg(test)]
    crate::fault::io(crate::fault::Point::FileSync, describe(file))?;
    file.sync_data()
}

/// The path an open descriptor refers to, for error messages.
pub(crate) fn describe(fd: &impl AsRawFd) -> String {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_or_else(|_| "an open file".to_string(), |p| p.display().to_string())
}

/// `syncfs` reports writeback errors (an I/O error while the kernel wrote a
/// page out) only since Linux 5.8; before, it returned success regardless,
/// and a lost page would be acknowledged as durable.
const SYNCFS_REPORTS_ERRORS_SINCE: (u32, u32) = (5, 8);

/// The running kernel's (major, minor), if it can be read.
fn kernel_version() -> Option<(u32, u32)> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    parse_kernel_release(&release)
}

fn parse_kernel_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Flushes rounds' targets the way the sink's [`SyncStrategy`] says.
#[derive(Clone)]
pub(crate) struct Flusher {
    /// Held open from the start so `syncfs` reports every writeback error
    /// on the filesystem since then.
    root: Arc<OwnedFd>,
    root_device: u64,
    /// Rounds with at least this many targets use `syncfs`; `None`: never.
    syncfs_from: Option<usize>,
    /// Only while the machine holds little dirty data (`Auto`).
    syncfs_only_if_clean: bool,
    /// Poisoned the moment any flush fails. The kernel reports a writeback
    /// error once per open file description, and every flush of a file (or
    /// of the filesystem) shares one: a flush that succeeds after another one
    /// failed may have succeeded only because the other took the error.
    health: Health,
}

impl Flusher {
    pub fn new(root: &Root, strategy: SyncStrategy, health: Health) -> std::io::Result<Self> {
        let fd = root.dir().try_clone()?;
        let root_device = rustix::fs::fstat(&fd)?.st_dev;
        let filesystem = rustix::fs::fstatfs(&fd)?.f_type as i64;
        let local = LOCAL_FILESYSTEMS
            .iter()
            .find(|(magic, _)| *magic == filesystem);
        let kernel = kernel_version();
        let reports_errors = kernel.is_some_and(|k| k >= SYNCFS_REPORTS_ERRORS_SINCE);
        let syncfs_from = match strategy {
            SyncStrategy::Files => None,
            SyncStrategy::Filesystem => {
                if !reports_errors {
                    tracing::warn!(
                        ?kernel,
                        "--sync filesystem on a kernel older than 5.8: syncfs does not report \
                         writeback errors there, so a failed write-out could go unnoticed"
                    );
                }
                Some(1)
            }
            SyncStrategy::Auto => local.filter(|_| reports_errors).map(|_| AUTO_SYNCFS_FROM),
        };
        tracing::info!(
            ?strategy,
            ?kernel,
            filesystem = local.map_or_else(|| format!("{filesystem:#x}"), |(_, n)| n.to_string()),
            syncfs = syncfs_from.is_some(),
            "durability of placed files"
        );
        Ok(Self {
            root: Arc::new(fd),
            root_device,
            syncfs_from,
            syncfs_only_if_clean: strategy == SyncStrategy::Auto,
            health,
        })
    }

    /// Whether any flush has failed since the sink started (or anything
    /// else poisoned the sink).
    pub fn has_failed(&self) -> bool {
        self.health.is_poisoned()
    }

    /// Makes journaled files durable behind the commit rounds, a few at a
    /// time. Up to [`BACKGROUND_EACH_UP_TO`] files are flushed one by one,
    /// not with one `syncfs`: a `syncfs` writes back all of them at once,
    /// and the commit rounds' journal fdatasyncs wait behind that whole
    /// writeback (docs/measurements.md). One file's flush is short, and
    /// rounds slip in between.
    /// Past that many files, flushing each would no longer fit between two
    /// background flushes: one `syncfs` is cheaper, or, while the machine
    /// holds much dirty data (see [`AUTO_SYNCFS_DIRTY_MAX`]), flushing them
    /// [`DIRTY_FALLBACK_PARALLELISM`] at a time, as a round would.
    pub async fn flush_in_background(
        &self,
        targets: Vec<SyncTarget>,
        parallelism: usize,
    ) -> Result<(), SinkError> {
        if targets.len() <= BACKGROUND_EACH_UP_TO {
            return flush_each(targets, parallelism, &self.health).await;
        }
        self.flush(targets, parallelism.max(DIRTY_FALLBACK_PARALLELISM))
            .await
    }

    /// Makes every target durable, with at most `parallelism` per-file
    /// flushes at once.
    pub async fn flush(
        &self,
        targets: Vec<SyncTarget>,
        parallelism: usize,
    ) -> Result<(), SinkError> {
        if targets.is_empty() {
            return Ok(());
        }
        let many = self.syncfs_from.is_some_and(|from| targets.len() >= from);
        if many && self.syncfs_is_cheap() {
            let root_device = self.root_device;
            // A mount point inside the root is another filesystem: its
            // files need their own flush.
            let elsewhere: Vec<SyncTarget> = targets
                .into_iter()
                .filter(|target| target.device() != Some(root_device))
                .collect();
            let root = self.root.clone();
            let health = self.health.clone();
            let whole = tokio::task::spawn_blocking(move || {
                rustix::fs::syncfs(&root).map_err(|e| {
                    let error = SinkError::storage("syncfs of the sink root", e);
                    health.poison(error.clone().into_detail());
                    error
                })
            });
            let rest = flush_each(elsewhere, parallelism, &self.health).await;
            whole
                .await
                .map_err(|e| join_error(e).context("the syncfs task"))??;
            return rest;
        }
        // A round too dirty for syncfs: its many files a few at a time.
        let parallelism = if many {
            parallelism.min(DIRTY_FALLBACK_PARALLELISM)
        } else {
            parallelism
        };
        flush_each(targets, parallelism, &self.health).await
    }

    /// Whether a `syncfs` would write back little besides the round's own
    /// files (always, unless the strategy is `Auto`).
    fn syncfs_is_cheap(&self) -> bool {
        if !self.syncfs_only_if_clean {
            return true;
        }
        let dirty = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|meminfo| dirty_bytes(&meminfo));
        // Unknown: as before this check, syncfs.
        let cheap = dirty.is_none_or(|dirty| dirty <= AUTO_SYNCFS_DIRTY_MAX);
        if !cheap {
            tracing::debug!(
                ?dirty,
                "much dirty data on the machine: flushing the round's files one by one"
            );
        }
        cheap
    }
}

/// Dirty and under-writeback bytes, from the text of `/proc/meminfo`.
fn dirty_bytes(meminfo: &str) -> Option<u64> {
    let field = |name: &str| {
        meminfo.lines().find_map(|line| {
            let value = line.strip_prefix(name)?.strip_prefix(':')?;
            let kib: u64 = value.trim().strip_suffix("kB")?.trim().parse().ok()?;
            Some(kib * 1024)
        })
    };
    Some(field("Dirty")? + field("Writeback")?)
}

/// fdatasyncs files (and fsyncs directories) all at once, on tokio's
/// blocking threads: concurrent flushes share the filesystem's journal
/// commits (ext4 and XFS batch them).
async fn flush_each(
    targets: Vec<SyncTarget>,
    parallelism: usize,
    health: &Health,
) -> Result<(), SinkError> {
    if targets.is_empty() {
        return Ok(());
    }
    let per_task = targets.len().div_ceil(parallelism.max(1));
    let mut tasks = Vec::new();
    let mut targets = targets.into_iter().peekable();
    while targets.peek().is_some() {
        let part: Vec<SyncTarget> = targets.by_ref().take(per_task).collect();
        let health = health.clone();
        tasks.push(tokio::task::spawn_blocking(move || {
            part.iter()
                .try_for_each(SyncTarget::sync)
                .inspect_err(|error| {
                    health.poison(error.clone().into_detail());
                })
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| join_error(e).context("a sync task"))??;
    }
    Ok(())
}

/// Flushes targets one after another on the calling thread (for the
/// journal replay at startup, before any round runs).
pub(crate) fn flush_now(targets: &[SyncTarget]) -> Result<(), SinkError> {
    targets.iter().try_for_each(SyncTarget::sync)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::scratch;

    #[test]
    fn dirty_bytes_come_from_meminfo() {
        let meminfo = "MemTotal:       24683648 kB\nDirty:             41932 kB\n\
                       Writeback:          1024 kB\nWritebackTmp:          0 kB\n";
        assert_eq!(dirty_bytes(meminfo), Some((41_932 + 1_024) * 1024));
        assert_eq!(dirty_bytes("Dirty: 5 kB\n"), None, "no Writeback line");
        assert_eq!(dirty_bytes("Dirty: many kB\nWriteback: 0 kB\n"), None);
        let here = std::fs::read_to_string("/proc/meminfo").unwrap();
        assert!(dirty_bytes(&here).is_some(), "this kernel's meminfo parses");
    }

    #[test]
    fn kernel_releases_parse() {
        assert_eq!(parse_kernel_release("6.18.44-fc-v595\n"), Some((6, 18)));
        assert_eq!(
            parse_kernel_release("4.18.0-553.el8_10.x86_64"),
            Some((4, 18))
        );
        assert_eq!(parse_kernel_release("5.8-rc1"), Some((5, 8)));
        assert_eq!(parse_kernel_release("garbage"), None);
        assert!(parse_kernel_release("5.7.19").unwrap() < SYNCFS_REPORTS_ERRORS_SINCE);
    }

    #[tokio::test]
    async fn every_strategy_flushes_files_and_directories() {
        let dir = scratch("flush-strategies");
        let root = Root::open(&dir).unwrap();
        for strategy in [
            SyncStrategy::Auto,
            SyncStrategy::Files,
            SyncStrategy::Filesystem,
        ] {
            let flusher = Flusher::new(&root, strategy, Health::default()).unwrap();
            if strategy == SyncStrategy::Files {
                assert_eq!(flusher.syncfs_from, None);
            }
            if strategy == SyncStrategy::Filesystem {
                assert_eq!(flusher.syncfs_from, Some(1));
            }
            let mut targets = Vec::new();
            for i in 0..8 {
                let file = File::create(dir.join(format!("{strategy:?}-{i}"))).unwrap();
                targets.push(SyncTarget::File(Arc::new(file)));
            }
            targets.push(SyncTarget::Dir(Arc::new(root.dir().try_clone().unwrap())));
            flusher.flush(targets, 4).await.unwrap();
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
