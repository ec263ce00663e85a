//! Owns the RocksDB plumbing shared by the sink manifest and the watcher state: opening a
//! database with tailflight's options, column-family lookup, prefix scans, and mapping every
//! failure to an `Error` that names the database path.

use std::path::{Path, PathBuf};

use rocksdb::{
    ColumnFamily, ColumnFamilyDescriptor, DB, DBCompressionType, Direction, IteratorMode,
    MemtableFactory, Options, WriteBatch, WriteOptions,
};

use crate::{Error, Result};

/// Small memtables: the manifests hold little data, and many may run on one host.
const WRITE_BUFFER_SIZE: usize = 8 << 20;

/// Column families whose entries are short-lived bulk data get room to be
/// written and deleted again within one memtable, so they rarely reach disk
/// beyond the write-ahead log.
pub(crate) const BULK_CFS: &[&str] = &["journal"];

/// Column families only ever appended to, or written and deleted, and read
/// only by scans at startup or offline. Their memtables are plain vectors:
/// an insert is an append instead of a skip-list search (a large share of
/// the sink's CPU, docs/measurements.md), and the sort happens once, when
/// the memtable is written out.
pub(crate) const LOG_CFS: &[&str] = &["placements", "journal_rounds"];
const BULK_WRITE_BUFFER_SIZE: usize = 64 << 20;
/// Column families of a few records each rewritten over and over (a file's
/// record in every commit round that touched the file, running counters):
/// a new value that fits in the old one's memtable entry overwrites it, so
/// the memtable holds about one entry per key instead of one per write, and
/// an insert searches a skip list of hundreds of entries instead of tens of
/// thousands (that search was a large share of the sink's CPU).
/// Point-in-time iteration over them is given up; they are scanned only
/// when no commit can touch the keys scanned (a source's files are scanned
/// before the source takes batches; everything else at startup or offline).
pub(crate) const REWRITTEN_CFS: &[&str] = &["files", "counters"];
/// How much RocksDB writes to a file before it asks the kernel to start
/// writing it back (`sync_file_range`, which does not wait).
const INCREMENTAL_SYNC_BYTES: u64 = 256 << 10;
/// Write-ahead log kept before the families holding its oldest file are flushed.
const WAL_LIMIT: u64 = 128 << 20;

/// The smallest key greater than every key starting with `prefix`, if any
/// (none for an empty prefix or one of all 0xFF bytes).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

pub(crate) struct Store {
    db: DB,
    path: PathBuf,
}

/// A raw key/value pair as read from RocksDB.
pub(crate) type Entry = (Box<[u8]>, Box<[u8]>);

fn options() -> Options {
    let mut opts = Options::default();
    // The crate is built without compression libraries; RocksDB must not try to use them.
    opts.set_compression_type(DBCompressionType::None);
    opts.set_write_buffer_size(WRITE_BUFFER_SIZE);
    opts
}

impl Store {
    pub(crate) fn open(dir: &Path, cfs: &[&'static str]) -> Result<Self> {
        let mut opts = options();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        // Prefer refusing to start over silently serving a damaged manifest: placement
        // decisions made on bad state would break exactly-once.
        opts.set_paranoid_checks(true);
        // A family written little (the counters) keeps every log file alive
        // until the logs reach max_total_wal_size, which by default is four
        // times all memtables: with journal data flowing that is gigabytes,
        // and the forced flush of every family then stalls writes.
        // Small and often is cheap: the families it flushes are small.
        opts.set_max_total_wal_size(WAL_LIMIT);
        // The sink's journal rounds write unsynced and rely on a crash
        // leaving a prefix of the log: point-in-time recovery stops at the
        // first damaged record (RocksDB's default, named here because the
        // redo depends on it).
        opts.set_wal_recovery_mode(rocksdb::DBRecoveryMode::PointInTime);
        // Log files are reused instead of created and deleted; overwriting
        // one in place also spares each synced write a file-size update.
        // (Recycling with point-in-time recovery was once disabled for a
        // hole it could leave; RocksDB fixed that and re-enabled it.)
        opts.set_recycle_log_file_num(4);
        // Write-back starts every few hundred KiB as RocksDB writes its files
        // instead of all at once: at the end of a memtable flush or a
        // compaction (an fsync of megabytes), or when the kernel's flusher
        // finds the unsynced log's pages expired. Either burst queues every
        // fdatasync the sink is waiting for behind tens of milliseconds of
        // writes on the same disk (docs/measurements.md).
        opts.set_bytes_per_sync(INCREMENTAL_SYNC_BYTES);
        opts.set_wal_bytes_per_sync(INCREMENTAL_SYNC_BYTES);
        // Vector memtables take no concurrent inserts; every manifest has a
        // single writer at a time anyway.
        opts.set_allow_concurrent_memtable_write(false);
        let descriptors = cfs.iter().map(|name| {
            let mut cf_options = options();
            if BULK_CFS.contains(name) {
                cf_options.set_write_buffer_size(BULK_WRITE_BUFFER_SIZE);
            }
            if LOG_CFS.contains(name) {
                cf_options.set_memtable_factory(MemtableFactory::Vector);
            }
            if REWRITTEN_CFS.contains(name) {
                cf_options.set_inplace_update_support(true);
            }
            ColumnFamilyDescriptor::new(*name, cf_options)
        });
        let db =
            DB::open_cf_descriptors(&opts, dir, descriptors).map_err(|source| Error::Open {
                path: dir.to_path_buf(),
                source,
            })?;
        Ok(Self {
            db,
            path: dir.to_path_buf(),
        })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes RocksDB holds in memory for `cfs`: their memtables (active,
    /// being flushed and kept), and the block cache they share.
    pub(crate) fn memory_bytes(&self, cfs: &[&'static str]) -> u64 {
        let mut bytes = 0;
        let mut cache = 0;
        for name in cfs {
            let Some(cf) = self.db.cf_handle(name) else {
                continue;
            };
            let property = |key: &str| {
                self.db
                    .property_int_value_cf(&cf, key)
                    .ok()
                    .flatten()
                    .unwrap_or(0)
            };
            bytes += property("rocksdb.size-all-mem-tables");
            cache = cache.max(property("rocksdb.block-cache-usage"));
        }
        bytes + cache
    }

    pub(crate) fn cf(&self, name: &'static str) -> Result<&ColumnFamily> {
        // Every family is opened by `open`, so absence means the directory was tampered with
        // between open and use; report it rather than panic.
        self.db.cf_handle(name).ok_or_else(|| Error::Corrupt {
            path: self.path.clone(),
            cf: name,
            key: String::new(),
            detail: "column family is missing".to_owned(),
        })
    }

    pub(crate) fn corrupt(&self, cf: &'static str, key: &[u8], detail: impl Into<String>) -> Error {
        Error::Corrupt {
            path: self.path.clone(),
            cf,
            key: String::from_utf8_lossy(key).into_owned(),
            detail: detail.into(),
        }
    }

    fn db_err(&self, op: &'static str) -> impl FnOnce(rocksdb::Error) -> Error + '_ {
        move |source| Error::Db {
            path: self.path.clone(),
            op,
            source,
        }
    }

    pub(crate) fn get(
        &self,
        cf: &'static str,
        key: &[u8],
        op: &'static str,
    ) -> Result<Option<Vec<u8>>> {
        let handle = self.cf(cf)?;
        self.db.get_cf(handle, key).map_err(self.db_err(op))
    }

    /// Every entry whose key starts with `prefix`, ascending by key.
    pub(crate) fn scan_prefix(
        &self,
        cf: &'static str,
        prefix: &[u8],
        op: &'static str,
    ) -> Result<Vec<Entry>> {
        let handle = self.cf(cf)?;
        let mut out = Vec::new();
        // No prefix extractor is configured: the upper bound ends the scan
        // before the first key past the prefix, whose value is never read
        // (it may be another source's record, rewritten in place meanwhile;
        // see REWRITTEN_CFS).
        let mut options = rocksdb::ReadOptions::default();
        if let Some(end) = prefix_end(prefix) {
            options.set_iterate_upper_bound(end);
        }
        for item in self.db.iterator_cf_opt(
            handle,
            options,
            IteratorMode::From(prefix, Direction::Forward),
        ) {
            let (k, v) = item.map_err(self.db_err(op))?;
            if !k.starts_with(prefix) {
                break;
            }
            out.push((k, v));
        }
        Ok(out)
    }

    /// Entries from `start` on, ascending by key, until `limit` entries or
    /// `byte_limit` bytes of values (at least one entry, if there is one).
    pub(crate) fn scan_from(
        &self,
        cf: &'static str,
        start: &[u8],
        limit: usize,
        byte_limit: usize,
        op: &'static str,
    ) -> Result<Vec<Entry>> {
        let handle = self.cf(cf)?;
        let mut out = Vec::new();
        let mut bytes = 0;
        for item in self
            .db
            .iterator_cf(handle, IteratorMode::From(start, Direction::Forward))
        {
            if out.len() >= limit || (bytes >= byte_limit && !out.is_empty()) {
                break;
            }
            let (k, v) = item.map_err(self.db_err(op))?;
            bytes += v.len();
            out.push((k, v));
        }
        Ok(out)
    }

    /// How many entries `[from, to)` holds, and the bytes of their values,
    /// without keeping them.
    pub(crate) fn sum_values(
        &self,
        cf: &'static str,
        from: &[u8],
        to: &[u8],
        op: &'static str,
    ) -> Result<(u64, u64)> {
        let handle = self.cf(cf)?;
        let mut options = rocksdb::ReadOptions::default();
        options.set_iterate_upper_bound(to.to_vec());
        let mut sums = (0, 0);
        for item in self.db.iterator_cf_opt(
            handle,
            options,
            IteratorMode::From(from, Direction::Forward),
        ) {
            let (_, value) = item.map_err(self.db_err(op))?;
            sums.0 += 1;
            sums.1 += value.len() as u64;
        }
        Ok(sums)
    }

    pub(crate) fn is_cf_empty(&self, cf: &'static str, op: &'static str) -> Result<bool> {
        Ok(self.first_key(cf, op)?.is_none())
    }

    /// The lowest key of a column family, if any; no other key is read.
    pub(crate) fn first_key(
        &self,
        cf: &'static str,
        op: &'static str,
    ) -> Result<Option<Box<[u8]>>> {
        let handle = self.cf(cf)?;
        match self.db.iterator_cf(handle, IteratorMode::Start).next() {
            None => Ok(None),
            Some(Ok((key, _))) => Ok(Some(key)),
            Some(Err(source)) => Err(self.db_err(op)(source)),
        }
    }

    pub(crate) fn write(&self, batch: WriteBatch, sync: bool, op: &'static str) -> Result<()> {
        let mut wo = WriteOptions::default();
        wo.set_sync(sync);
        self.db.write_opt(batch, &wo).map_err(self.db_err(op))
    }

    #[cfg(test)]
    pub(crate) fn raw_put(&self, cf: &'static str, key: &[u8], value: &[u8]) {
        let handle = self.cf(cf).expect("column family");
        self.db.put_cf(handle, key, value).expect("raw put");
    }
}

/// Decodes an 8-byte big-endian integer value, the encoding of every length and counter.
pub(crate) fn decode_u64(bytes: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(bytes).ok().map(u64::from_be_bytes)
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn a_prefix_ends_at_its_successor() {
        assert_eq!(prefix_end(b"src\0"), Some(b"src\x01".to_vec()));
        assert_eq!(prefix_end(b"a\xff\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }
}
