//! Where a tail stands: the cursor of each stream, as far as the output
//! took its batches, and the state file that keeps the cursors across
//! restarts (replaced whole or not at all).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use flight_server::subscription::{Cursor, CursorUpdate, Position, Start, Ticket};

/// What the state file holds: the cursor of a sink's stream, or for a
/// fleet one per sink identity (a sink refuses a cursor naming files it
/// does not hold).
#[derive(Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SavedState {
    pub source: String,
    #[serde(default)]
    pub cursor: Vec<Position>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub identities: BTreeMap<String, Vec<Position>>,
}

/// The state file of a tail of `source`, over one sink or a fleet.
#[derive(Clone, Debug)]
pub struct StateFile {
    pub path: PathBuf,
    pub source: String,
    pub fleet: bool,
}

impl StateFile {
    /// What the file holds; none if there is no file yet. A file of
    /// another source, or of a fleet for a tail of one sink (and the other
    /// way round), is refused: its cursors would name files the sink does
    /// not hold.
    pub fn load(&self) -> anyhow::Result<Option<SavedState>> {
        let path = &self.path;
        let text = match std::fs::read(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("reading the cursor in {}", path.display())));
            }
        };
        let state: SavedState = serde_json::from_slice(&text)
            .with_context(|| format!("reading the cursor in {}", path.display()))?;
        if state.source != self.source {
            bail!(
                "{} holds a cursor of source {:?}, not {:?}",
                path.display(),
                state.source,
                self.source
            );
        }
        if self.fleet && !state.cursor.is_empty() {
            bail!(
                "{} holds the cursor of one sink (--from), not one per sink identity of a \
                 fleet (--coordinator): give another --state",
                path.display()
            );
        }
        if !self.fleet && !state.identities.is_empty() {
            bail!(
                "{} holds a fleet's cursors (--coordinator), not one sink's (--from): give \
                 another --state",
                path.display()
            );
        }
        Ok(Some(state))
    }

    /// Replaces the file with `cursors`.
    pub fn save(&self, cursors: &Cursors) -> anyhow::Result<()> {
        let positions = cursors.positions();
        let state = SavedState {
            source: self.source.clone(),
            cursor: if self.fleet {
                Vec::new()
            } else {
                positions.first().cloned().unwrap_or_default()
            },
            identities: if self.fleet {
                cursors.names.iter().cloned().zip(positions).collect()
            } else {
                BTreeMap::new()
            },
        };
        let bytes = serde_json::to_vec(&state)
            .with_context(|| format!("encoding the cursor for {}", self.path.display()))?;
        write_whole(&self.path, &bytes)
    }
}

/// Writes `bytes` to a file beside `path` and renames it over `path`: a
/// crash leaves the old state or the new one, never half of one.
fn write_whole(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, bytes).with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("replacing {}", path.display()))
}

/// The cursors of every stream, as far as the output took their batches.
#[derive(Debug, Default)]
pub struct Cursors {
    /// Each stream's identity (empty for a sink named by its endpoint).
    names: Vec<String>,
    cursors: Vec<Cursor>,
    /// Whether a stream's cursor says where to resume (it has carried an
    /// update, or came from the state file).
    resumable: Vec<bool>,
}

impl Cursors {
    /// The cursors of the streams `names`, from `saved` where it knows
    /// them; an identity it does not name starts as a new one.
    pub fn new(names: &[String], saved: Option<&SavedState>, fleet: bool) -> Self {
        let mut cursors = Self::default();
        for name in names {
            let positions = saved.and_then(|state| {
                if fleet {
                    state.identities.get(name).cloned()
                } else {
                    Some(state.cursor.clone())
                }
            });
            cursors.names.push(name.clone());
            cursors.resumable.push(positions.is_some());
            cursors
                .cursors
                .push(Cursor::from_positions(positions.unwrap_or_default()));
        }
        cursors
    }

    /// The output took a batch of `stream` that carried `update`.
    pub fn took(&mut self, stream: usize, update: &CursorUpdate) {
        if let (Some(cursor), Some(resumable)) =
            (self.cursors.get_mut(stream), self.resumable.get_mut(stream))
        {
            cursor.apply(update);
            *resumable = true;
        }
    }

    /// The ticket `stream` subscribes with now: `base` from where its
    /// cursor stands once it has one, from `base`'s start until then.
    pub fn ticket(&self, stream: usize, base: &Ticket) -> Ticket {
        let resumable = self.resumable.get(stream).copied().unwrap_or(false);
        Ticket {
            start: if resumable { Start::Cursor } else { base.start },
            cursor: resumable.then(|| {
                self.cursors
                    .get(stream)
                    .map(Cursor::positions)
                    .unwrap_or_default()
            }),
            ..base.clone()
        }
    }

    /// Every stream's positions, in stream order.
    pub fn positions(&self) -> Vec<Vec<Position>> {
        self.cursors.iter().map(Cursor::positions).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn position(key: &str, generation: u64, offset: u64) -> Position {
        Position {
            key: key.into(),
            generation,
            offset,
            path: format!("{key}.dat"),
            sealed: false,
        }
    }

    fn update(positions: Vec<Position>) -> CursorUpdate {
        CursorUpdate { cursor: positions }
    }

    fn base() -> Ticket {
        Ticket {
            source: "src".into(),
            globs: Vec::new(),
            file_key: None,
            start: Start::Now,
            cursor: None,
            follow: true,
            max_batch_bytes: None,
        }
    }

    #[test]
    fn a_stream_resumes_from_its_cursor_only_once_it_has_one() {
        let mut cursors = Cursors::new(&[String::new()], None, false);
        let first = cursors.ticket(0, &base());
        assert_eq!((first.start, first.cursor), (Start::Now, None));
        cursors.took(0, &update(vec![position("a", 1, 4096)]));
        let again = cursors.ticket(0, &base());
        assert_eq!(again.start, Start::Cursor);
        assert_eq!(again.cursor, Some(vec![position("a", 1, 4096)]));
        assert!(again.follow);
        // An empty update (a `now` start) still says where to resume.
        let mut joined = Cursors::new(&[String::new()], None, false);
        joined.took(0, &update(Vec::new()));
        assert_eq!(joined.ticket(0, &base()).start, Start::Cursor);
    }

    #[test]
    fn the_newest_generation_of_a_file_wins_and_files_merge() {
        let mut cursors = Cursors::new(&[String::new()], None, false);
        cursors.took(0, &update(vec![position("a", 2, 100), position("b", 1, 7)]));
        // A later batch telling of the generation before (it was
        // superseded) does not take the cursor back to it.
        cursors.took(0, &update(vec![position("a", 1, 900)]));
        cursors.took(0, &update(vec![position("a", 2, 300)]));
        assert_eq!(
            cursors.positions(),
            vec![vec![position("a", 2, 300), position("b", 1, 7)]]
        );
    }

    #[test]
    fn a_state_file_reads_back_what_was_saved() {
        let path = std::env::temp_dir().join(format!("tailflight-state-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let file = StateFile {
            path: path.clone(),
            source: "src".into(),
            fleet: true,
        };
        assert_eq!(file.load().unwrap(), None);
        let names = ["sink-a".to_string(), "sink-b".to_string()];
        let mut cursors = Cursors::new(&names, None, true);
        cursors.took(1, &update(vec![position("x", 1, 42)]));
        file.save(&cursors).unwrap();
        let saved = file.load().unwrap().expect("saved");
        assert_eq!(saved.identities["sink-b"], vec![position("x", 1, 42)]);
        assert!(saved.identities["sink-a"].is_empty());
        assert!(!path.with_extension("partial").exists());
        // A restart resumes each identity from its own cursor.
        let resumed = Cursors::new(&names, Some(&saved), true);
        assert_eq!(
            resumed.ticket(1, &base()).cursor,
            Some(vec![position("x", 1, 42)])
        );
        // An identity the file does not name starts as a new one.
        let grown = Cursors::new(&["sink-c".to_string()], Some(&saved), true);
        assert_eq!(grown.ticket(0, &base()).start, Start::Now);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_state_file_of_another_source_or_shape_is_refused() {
        let path =
            std::env::temp_dir().join(format!("tailflight-state-other-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let one_sink = StateFile {
            path: path.clone(),
            source: "src".into(),
            fleet: false,
        };
        let mut cursors = Cursors::new(&[String::new()], None, false);
        cursors.took(0, &update(vec![position("x", 1, 1)]));
        one_sink.save(&cursors).unwrap();
        let other_source = StateFile {
            source: "other".into(),
            ..one_sink.clone()
        };
        let error = other_source.load().unwrap_err().to_string();
        assert!(error.contains("not \"other\""), "{error}");
        let fleet = StateFile {
            fleet: true,
            ..one_sink.clone()
        };
        let error = fleet.load().unwrap_err().to_string();
        assert!(error.contains("give another --state"), "{error}");
        std::fs::write(&path, b"{not json").unwrap();
        assert!(one_sink.load().is_err());
        let _ = std::fs::remove_file(&path);
    }
}
