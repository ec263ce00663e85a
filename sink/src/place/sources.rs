//! The sources a sink serves: each one's files by key and path, and the
//! paths its files moved away from, loaded from the manifest on first use
//! and kept for the life of the process. Their number is bounded, and a
//! flat layout serves only one.

use std::collections::HashMap;
use std::sync::Arc;

use manifest_db::SinkManifest;

use super::moves::MovedAway;
use crate::SinkError;
use crate::config::Layout;
use crate::lock_order::{Rank, Ranked};
use crate::state::{Slot, lock};

/// Slots kept in memory before sealed, idle ones are dropped.
const SLOT_CACHE: usize = 4096;

/// Most sources one sink serves: each keeps some state for the life of the
/// process, and a peer must not make that grow without end. Far more than
/// the beamlines and hutches one sink serves.
const MAX_SOURCES: usize = 4096;

/// A slot's key and generation, looked up in [`SourceFiles::slots`]
/// without a copy of the key: every data row looks its file up.
#[derive(Hash)]
pub(super) struct SlotLookup<'a>(pub &'a str, pub u64);

impl hashbrown::Equivalent<(String, u64)> for SlotLookup<'_> {
    fn equivalent(&self, key: &(String, u64)) -> bool {
        self.0 == key.0 && self.1 == key.1
    }
}

#[derive(Default)]
pub(super) struct SourceFiles {
    /// Sweep the slot cache when it grows past this.
    sweep_above: usize,
    /// Hashed as `(&str, u64)` is, so that [`SlotLookup`] finds them.
    pub(super) slots: hashbrown::HashMap<(String, u64), Arc<Slot>>,
    /// Live (not superseded) generation at each destination path.
    pub(super) by_path: HashMap<String, (String, u64)>,
    /// Superseded generations kept aside (`--superseded keep`), by the
    /// path they were moved to: a new file or a rename there moves them on.
    pub(super) kept: HashMap<String, (String, u64)>,
}

/// Which path index of a source.
#[derive(Clone, Copy)]
pub(super) enum PathIndex {
    Live,
    Kept,
}

impl SourceFiles {
    pub(super) fn index(&mut self, which: PathIndex) -> &mut HashMap<String, (String, u64)> {
        match which {
            PathIndex::Live => &mut self.by_path,
            PathIndex::Kept => &mut self.kept,
        }
    }

    /// Keeps a slot in memory; past a size, drops sealed slots nobody holds
    /// (their record is in the manifest and they take no more writes).
    pub(super) fn cache(&mut self, key: (String, u64), slot: Arc<Slot>) {
        self.slots.insert(key, slot);
        if self.slots.len() > self.sweep_above.max(SLOT_CACHE) {
            self.slots.retain(|_, slot| {
                let idle_and_sealed = Arc::strong_count(slot) == 1
                    && slot.state.try_lock().is_ok_and(|state| {
                        state.record.sealed.is_some() && state.pending.is_empty()
                    })
                    && slot
                        .unsynced
                        .try_lock()
                        .is_ok_and(|unsynced| unsynced.is_empty());
                !idle_and_sealed
            });
            self.sweep_above = self.slots.len() * 2;
        }
    }
}

pub(crate) struct Source {
    pub(super) name: String,
    pub(super) files: Ranked<SourceFiles>,
    /// Taken after any other lock but `unsynced` (see [`crate::lock_order`]).
    pub(super) moved_away: Ranked<MovedAway>,
}

/// A source's state once loaded; locked while it loads.
type SourceCell = Ranked<Option<Arc<Source>>>;

/// The sources served, and what loading one needs.
pub(super) struct Sources {
    /// Per source, its state once loaded: each behind a lock of its own,
    /// so that loading one source holds up only that source's batches.
    sources: Ranked<HashMap<String, Arc<SourceCell>>>,
    /// With the flat layout, the one source this sink serves (the first
    /// one seen, in the manifest or on the wire).
    flat_source: Ranked<Option<String>>,
    /// Most sources served at once (their state stays for the process).
    max_sources: usize,
    manifest: SinkManifest,
    layout: Layout,
}

impl Sources {
    pub(super) fn new(manifest: SinkManifest, layout: Layout) -> Self {
        Self {
            sources: Ranked::new(Rank::Sources, HashMap::new()),
            flat_source: Ranked::new(Rank::FlatSource, None),
            max_sources: MAX_SOURCES,
            manifest,
            layout,
        }
    }

    /// Bounds the sources served to fewer than the sink's own bound.
    #[cfg(test)]
    pub(super) fn set_max_sources(&mut self, max: usize) {
        self.max_sources = max;
    }

    /// The names of the sources served or being loaded.
    #[cfg(test)]
    pub(super) fn names(&self) -> Vec<String> {
        lock(&self.sources).keys().cloned().collect()
    }

    /// The source's state, loaded from the manifest on first use.
    pub(super) fn source(&self, name: &str) -> Result<Arc<Source>, SinkError> {
        loop {
            let cell = self.cell(name)?;
            // Held across the scan: no batch of this source is placed, and so
            // none of its records rewritten in the manifest (in place, see
            // manifest_db's store), while they are read. Other sources go on:
            // the scan reads no key past this source's.
            let mut loaded = lock(&cell);
            if let Some(source) = loaded.as_ref() {
                return Ok(source.clone());
            }
            let current = |sources: &HashMap<_, Arc<_>>| {
                sources.get(name).is_some_and(|c| Arc::ptr_eq(c, &cell))
            };
            if !current(&lock(&self.sources)) {
                // Its load failed and it left the map: one state per source,
                // so start over with the map's.
                continue;
            }
            return match self.load_source(name) {
                Ok(source) => {
                    *loaded = Some(source.clone());
                    Ok(source)
                }
                Err(error) => {
                    // Names that fail (refused, unreadable) keep no entry:
                    // the map holds only sources being served.
                    let mut sources = lock(&self.sources);
                    if current(&sources) {
                        sources.remove(name);
                    }
                    Err(error)
                }
            };
        }
    }

    /// The cell of source `name`, made empty if it has none yet, unless
    /// that would serve more sources than the bound.
    pub(super) fn cell(&self, name: &str) -> Result<Arc<SourceCell>, SinkError> {
        let mut sources = lock(&self.sources);
        if sources.len() >= self.max_sources && !sources.contains_key(name) {
            return Err(SinkError::Peer(format!(
                "this sink serves at most {} sources, and source {name:?} is not one of them",
                self.max_sources
            )));
        }
        Ok(sources
            .entry(name.to_owned())
            .or_insert_with(|| Arc::new(Ranked::new(Rank::SourceCell, None)))
            .clone())
    }

    fn load_source(&self, name: &str) -> Result<Arc<Source>, SinkError> {
        if self.layout == Layout::Flat {
            self.claim_flat_root(name)?;
        }
        self.read_source(name)
    }

    /// A source's state as the manifest has it (no claim on a flat root).
    pub(super) fn read_source(&self, name: &str) -> Result<Arc<Source>, SinkError> {
        let records = self.manifest.files_of_source(name).map_err(|e| {
            SinkError::Storage(format!("loading the manifest of source {name:?}: {e}"))
        })?;
        // Only the path index is kept for every file; slots are loaded on
        // demand and sealed ones are dropped again, so memory follows the
        // files in use, not every file the source ever sent.
        let mut files = SourceFiles {
            sweep_above: SLOT_CACHE,
            ..SourceFiles::default()
        };
        let mut moved_away = MovedAway::default();
        for (id, record) in records {
            if let Some(from) = &record.renamed_from {
                moved_away
                    .recorded
                    .insert(from.clone(), (id.key.clone(), id.generation));
            }
            if !record.superseded {
                files
                    .by_path
                    .insert(record.dest_path, (id.key, id.generation));
            } else if record.kept {
                files.kept.insert(record.dest_path, (id.key, id.generation));
            }
        }
        Ok(Arc::new(Source {
            name: name.to_owned(),
            files: Ranked::new(Rank::SourceFiles, files),
            moved_away: Ranked::new(Rank::MovedAway, moved_away),
        }))
    }

    /// The flat layout puts every source's files straight under the root,
    /// where two sources' files of the same name would be one file: the
    /// first source (in the manifest's order, else on the wire) is the only
    /// one, whichever connects first.
    fn claim_flat_root(&self, name: &str) -> Result<(), SinkError> {
        let mut owner = lock(&self.flat_source);
        if owner.is_none() {
            let first = self
                .manifest
                .first_source()
                .map_err(|e| SinkError::Storage(format!("reading the manifest's sources: {e}")))?;
            *owner = Some(first.unwrap_or_else(|| name.to_owned()));
        }
        match owner.as_deref() {
            Some(only) if only != name => Err(SinkError::Peer(format!(
                "this sink writes the flat layout, which serves one source, {only:?}: \
                 source {name:?} needs a sink of its own or the per-source layout"
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_found_by_its_borrowed_key() {
        let mut slots: hashbrown::HashMap<(String, u64), u8> = hashbrown::HashMap::new();
        slots.insert(("run7/a.xtc".to_owned(), 2), 1);
        slots.insert(("run7/a.xtc".to_owned(), 3), 2);
        assert_eq!(slots.get(&SlotLookup("run7/a.xtc", 2)), Some(&1));
        assert_eq!(slots.get(&SlotLookup("run7/a.xtc", 3)), Some(&2));
        assert_eq!(slots.get(&SlotLookup("run7/a.xtc", 4)), None);
        assert_eq!(slots.get(&SlotLookup("run7/b.xtc", 2)), None);
    }
}
