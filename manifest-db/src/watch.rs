//! Owns the watcher's checkpoint: one JSON `WatchedFile` per tracked source file in the
//! "watched" column family, keyed by the file's `key` bytes, so a restarted watcher resumes
//! each file at its acknowledged offset instead of re-sending or skipping data.

use std::path::Path;
use std::sync::Arc;

use rocksdb::WriteBatch;

use crate::store::Store;
use crate::{Result, WatchedFile};

const CF_WATCHED: &str = "watched";

/// Watcher-side checkpoint store (RocksDB, column family "watched"). Cheap to clone; clones
/// share one database.
#[derive(Clone)]
pub struct WatchState {
    store: Arc<Store>,
}

impl WatchState {
    pub fn open(dir: &Path) -> Result<Self> {
        Ok(Self {
            store: Arc::new(Store::open(dir, &[CF_WATCHED])?),
        })
    }

    /// Every saved file, ascending by key.
    pub fn load(&self) -> Result<Vec<WatchedFile>> {
        let entries = self
            .store
            .scan_prefix(CF_WATCHED, &[], "load watched files")?;
        entries
            .into_iter()
            .map(|(k, v)| {
                let file: WatchedFile = serde_json::from_slice(&v).map_err(|e| {
                    self.store
                        .corrupt(CF_WATCHED, &k, format!("bad watched-file record: {e}"))
                })?;
                // A record filed under another key would make `remove` miss it forever.
                if file.key.as_bytes() != &*k {
                    return Err(self.store.corrupt(
                        CF_WATCHED,
                        &k,
                        format!("record carries key {:?}", file.key),
                    ));
                }
                Ok(file)
            })
            .collect()
    }

    /// Writes in one WriteBatch. `sync` chooses a synced WAL.
    pub fn save(&self, files: &[WatchedFile], sync: bool) -> Result<()> {
        let cf = self.store.cf(CF_WATCHED)?;
        let mut batch = WriteBatch::default();
        for file in files {
            // WatchedFile holds only strings, integers and bools, which always serialise.
            let value = serde_json::to_vec(file).expect("WatchedFile serialises to JSON");
            batch.put_cf(cf, file.key.as_bytes(), value);
        }
        self.store.write(batch, sync, "save watched files")
    }

    /// Forgets the given keys; unknown keys are ignored.
    pub fn remove(&self, keys: &[String]) -> Result<()> {
        let cf = self.store.cf(CF_WATCHED)?;
        let mut batch = WriteBatch::default();
        for key in keys {
            batch.delete_cf(cf, key.as_bytes());
        }
        // Synced: a forgotten file that reappears after a crash would be tracked again.
        self.store.write(batch, true, "remove watched files")
    }

    pub fn is_empty(&self) -> Result<bool> {
        self.store
            .is_cf_empty(CF_WATCHED, "check for watched files")
    }
}

impl std::fmt::Debug for WatchState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchState")
            .field("path", &self.store.path())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use crate::testutil::TempDir;

    fn file(key: &str, acked: u64) -> WatchedFile {
        WatchedFile {
            key: key.to_owned(),
            path: format!("{key}.renamed"),
            dev: 2049,
            ino: 1234,
            fingerprint: 0xdead_beef,
            fingerprint_len: 4096,
            generation: 1,
            acked_offset: acked,
            sealed: false,
            deleted: false,
            born_ns: None,
        }
    }

    #[test]
    fn is_send_sync_clone() {
        fn check<T: Send + Sync + Clone>() {}
        check::<WatchState>();
    }

    #[test]
    fn save_load_remove_and_reopen() {
        let dir = TempDir::new("watch");
        {
            let w = WatchState::open(dir.path()).unwrap();
            assert!(w.is_empty().unwrap());
            assert!(w.load().unwrap().is_empty());
            w.save(&[file("run1/b", 10), file("run1/a", 5)], false)
                .unwrap();
            let mut a = file("run1/a", 50);
            a.sealed = true;
            w.clone().save(&[a], true).unwrap();
            assert!(!w.is_empty().unwrap());
        }
        let w = WatchState::open(dir.path()).unwrap();
        let mut a = file("run1/a", 50);
        a.sealed = true;
        assert_eq!(w.load().unwrap(), vec![a.clone(), file("run1/b", 10)]);
        w.remove(&["run1/b".to_owned(), "never-saved".to_owned()])
            .unwrap();
        assert_eq!(w.load().unwrap(), vec![a]);
        drop(w);
        let w = WatchState::open(dir.path()).unwrap();
        assert_eq!(w.load().unwrap().len(), 1);
        w.remove(&["run1/a".to_owned()]).unwrap();
        assert!(w.is_empty().unwrap());
    }

    #[test]
    fn garbage_record_is_reported_as_corrupt() {
        let dir = TempDir::new("watch-corrupt");
        let w = WatchState::open(dir.path()).unwrap();
        w.store.raw_put(CF_WATCHED, b"run9/x", b"[1,2");
        let err = w.load().unwrap_err();
        assert!(
            matches!(err, Error::Corrupt { cf: "watched", .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("run9/x"), "{err}");
    }
}
