//! Which destination root a sink's state was written with.
//!
//! The root holds a mark, `.tailflight-root-id` (a random id), made at the
//! first start and recorded in the manifest. A state opened against another
//! root is refused before anything is placed or replayed: a shared root not
//! mounted on this host (an empty directory stands in its place), a wrong
//! `--root`, a fleet standby whose host mounts another directory. Without
//! this, the sink would go on writing its files there from the offsets its
//! manifest says were placed, after holes where their first bytes were.
//! Several states may share one root (a fleet's identities): each records
//! the same mark.

use std::io::Write;
use std::path::Path;

use manifest_db::SinkManifest;

/// The mark's name in the root; the sink refuses it as a destination path.
pub const ROOT_MARK: &str = ".tailflight-root-id";

/// Why a root was refused, or could not be checked.
#[derive(Debug, thiserror::Error)]
pub enum RootMarkError {
    #[error(
        "the sink root {root} is not the root this state directory was written with: its \
         mark {ROOT_MARK} says {found}, the manifest {recorded}. Give the sink the root it wrote \
         to (for a fleet identity, the shared root every candidate host mounts), or a new state \
         directory for a new root"
    )]
    Another {
        root: String,
        found: String,
        recorded: String,
    },
    #[error(
        "the sink root {root} has no mark {ROOT_MARK}, but this state directory was written \
         with a root marked {recorded}: is the shared root mounted on this host? The sink will not \
         go on writing its files into another directory (they would start with holes where their \
         placed bytes were). If the root was emptied on purpose, start with a new state directory too"
    )]
    Unmarked { root: String, recorded: String },
    #[error(
        "the sink root {root} has no mark {ROOT_MARK} and holds none of the {looked_for} growing \
         files this state directory placed bytes of (e.g. {example}): is the shared root mounted \
         on this host? The sink will not go on writing them into another directory"
    )]
    Missing {
        root: String,
        example: String,
        looked_for: usize,
    },
    #[error("the root's mark {path}: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("the manifest: {0}")]
    Manifest(String),
}

/// Checks that `root` is the root `manifest` was written with; the first
/// time, marks the root (or adopts its mark) and records it.
pub fn check(root: &Path, manifest: &SinkManifest) -> Result<(), RootMarkError> {
    let found = read_mark(root)?;
    let recorded = manifest
        .root_id()
        .map_err(|e| RootMarkError::Manifest(e.to_string()))?;
    let shown = || root.display().to_string();
    match (recorded, found) {
        (Some(recorded), Some(found)) if recorded == found => Ok(()),
        (Some(recorded), Some(found)) => Err(RootMarkError::Another {
            root: shown(),
            found,
            recorded,
        }),
        (Some(recorded), None) => Err(RootMarkError::Unmarked {
            root: shown(),
            recorded,
        }),
        // A state new to this root, or one from before roots were marked.
        (None, Some(found)) => record(manifest, &found),
        (None, None) => {
            check_unmarked(root, manifest)?;
            let id = make_mark(root)?;
            record(manifest, &id)
        }
    }
}

/// Files a state from before roots were marked may be checked against: at
/// most this many of its growing files are looked for.
const UNMARKED_SAMPLE: usize = 64;

/// A state from before roots were marked has no mark to compare: the files
/// it is still writing tell whether this root holds them. If it has growing
/// files and none of them is here, the root is refused as an unmounted one
/// would be. (Sealed files may have been moved away by their readers.)
fn check_unmarked(root: &Path, manifest: &SinkManifest) -> Result<(), RootMarkError> {
    let files = manifest
        .all_files()
        .map_err(|e| RootMarkError::Manifest(e.to_string()))?;
    let growing: Vec<&str> = files
        .iter()
        .filter(|(_, record)| {
            record.sealed.is_none() && !record.superseded && !record.placed.is_empty()
        })
        .map(|(_, record)| record.dest_path.as_str())
        .take(UNMARKED_SAMPLE)
        .collect();
    let Some(example) = growing.first() else {
        return Ok(());
    };
    if growing.iter().any(|path| root.join(path).is_file()) {
        return Ok(());
    }
    Err(RootMarkError::Missing {
        root: root.display().to_string(),
        example: (*example).to_owned(),
        looked_for: growing.len(),
    })
}

fn record(manifest: &SinkManifest, id: &str) -> Result<(), RootMarkError> {
    manifest
        .record_root_id(id)
        .map_err(|e| RootMarkError::Manifest(e.to_string()))
}

fn unreadable(path: &Path, reason: impl std::fmt::Display) -> RootMarkError {
    RootMarkError::Unreadable {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn read_mark(root: &Path) -> Result<Option<String>, RootMarkError> {
    let path = root.join(ROOT_MARK);
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(unreadable(&path, e)),
        Ok(meta) if !meta.file_type().is_file() => {
            return Err(unreadable(&path, "not a regular file"));
        }
        Ok(_) => {}
    }
    let text = std::fs::read_to_string(&path).map_err(|e| unreadable(&path, e))?;
    let id = text.trim();
    if id.is_empty() || id.len() > 64 || !id.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(unreadable(&path, format!("not a mark: {:?}", truncate(id))));
    }
    Ok(Some(id.to_owned()))
}

fn truncate(text: &str) -> &str {
    text.char_indices()
        .nth(64)
        .map_or(text, |(at, _)| &text[..at])
}

/// Makes the root's mark: written and synced under a temporary name, then
/// linked into place, which fails if another sink marked the root first
/// (that mark is then adopted). Returns the root's mark.
fn make_mark(root: &Path) -> Result<String, RootMarkError> {
    use std::hash::BuildHasher;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let id = format!(
        "{:016x}",
        std::collections::hash_map::RandomState::new().hash_one((nanos, std::process::id()))
    );
    let path = root.join(ROOT_MARK);
    // Named after the id, not the pid: sinks on several hosts (or in
    // containers, all pid 1) may mark one shared root at once.
    let temporary = root.join(format!("{ROOT_MARK}.{id}.tmp"));
    let written = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(format!("{id}\n").as_bytes())?;
        file.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(unreadable(&temporary, format!("cannot write it: {e}")));
    }
    let linked = std::fs::hard_link(&temporary, &path);
    let _ = std::fs::remove_file(&temporary);
    match linked {
        Ok(()) => std::fs::File::open(root)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| unreadable(&path, format!("cannot sync its directory: {e}")))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(unreadable(&path, format!("cannot make it: {e}"))),
    }
    // Whoever made it, the mark is what the root holds now.
    read_mark(root)?.ok_or_else(|| unreadable(&path, "vanished right after it was made"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(dir: &Path) -> SinkManifest {
        SinkManifest::open(dir).unwrap()
    }

    #[test]
    fn a_root_is_marked_once_and_the_same_root_passes_again() {
        let dir = crate::test_support::scratch("root-mark-same");
        let root = dir.join("root");
        std::fs::create_dir_all(&root).unwrap();
        let state = manifest(&dir.join("state"));
        check(&root, &state).unwrap();
        let mark = std::fs::read_to_string(root.join(ROOT_MARK)).unwrap();
        check(&root, &state).unwrap();
        assert_eq!(std::fs::read_to_string(root.join(ROOT_MARK)).unwrap(), mark);
        assert_eq!(state.root_id().unwrap().as_deref(), Some(mark.trim()));
        // A second state on the same root (another identity) adopts its mark.
        let other = manifest(&dir.join("other-state"));
        check(&root, &other).unwrap();
        assert_eq!(other.root_id().unwrap().as_deref(), Some(mark.trim()));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_empty_root_in_place_of_the_marked_one_is_refused() {
        let dir = crate::test_support::scratch("root-mark-unmounted");
        let (root, stand_in) = (dir.join("root"), dir.join("stand-in"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&stand_in).unwrap();
        let state = manifest(&dir.join("state"));
        check(&root, &state).unwrap();
        let refused = check(&stand_in, &state).unwrap_err();
        assert!(
            matches!(refused, RootMarkError::Unmarked { .. }),
            "{refused}"
        );
        assert!(refused.to_string().contains("mounted"), "{refused}");
        // Nothing was made in the stand-in.
        assert!(!stand_in.join(ROOT_MARK).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn another_marked_root_is_refused_with_both_marks_named() {
        let dir = crate::test_support::scratch("root-mark-another");
        let (first, second) = (dir.join("first"), dir.join("second"));
        std::fs::create_dir_all(&first).unwrap();
        std::fs::create_dir_all(&second).unwrap();
        let state = manifest(&dir.join("state"));
        check(&first, &state).unwrap();
        check(&second, &manifest(&dir.join("state-of-second"))).unwrap();
        let refused = check(&second, &state).unwrap_err();
        let (found, recorded) = match &refused {
            RootMarkError::Another {
                found, recorded, ..
            } => (found.clone(), recorded.clone()),
            other => panic!("{other}"),
        };
        assert_ne!(found, recorded);
        assert!(refused.to_string().contains(&found), "{refused}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unmarked_root_without_the_growing_files_of_an_older_state_is_refused() {
        let dir = crate::test_support::scratch("root-mark-older-state");
        let (root, stand_in) = (dir.join("root"), dir.join("stand-in"));
        std::fs::create_dir_all(root.join("s")).unwrap();
        std::fs::create_dir_all(&stand_in).unwrap();
        let state = manifest(&dir.join("state"));
        // A state from before roots were marked: one growing file, no mark.
        let id = manifest_db::FileId {
            source: "s".into(),
            key: "f.dat".into(),
            generation: 1,
        };
        let mut record = manifest_db::FileRecord {
            dest_path: "s/f.dat".into(),
            ..Default::default()
        };
        record.placed.insert(0, 4);
        state
            .commit(&manifest_db::SinkCommit {
                records: vec![(id, record)],
                ..Default::default()
            })
            .unwrap();
        let refused = check(&stand_in, &state).unwrap_err();
        assert!(
            matches!(refused, RootMarkError::Missing { .. }),
            "{refused}"
        );
        assert!(refused.to_string().contains("s/f.dat"), "{refused}");
        assert!(!stand_in.join(ROOT_MARK).exists());
        // The root that holds it is marked and adopted.
        std::fs::write(root.join("s/f.dat"), b"abcd").unwrap();
        check(&root, &state).unwrap();
        assert!(root.join(ROOT_MARK).is_file());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_mark_that_is_not_one_is_named() {
        let dir = crate::test_support::scratch("root-mark-garbage");
        let root = dir.join("root");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join(ROOT_MARK), "../../etc/passwd\n").unwrap();
        let refused = check(&root, &manifest(&dir.join("state"))).unwrap_err();
        assert!(
            matches!(refused, RootMarkError::Unreadable { .. }),
            "{refused}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
