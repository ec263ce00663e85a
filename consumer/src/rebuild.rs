//! Files rebuilt under a directory from the rows that describe them: data
//! written at its offset, renames applied, a superseded generation's file
//! removed, and each seal's size and digest checked against what was
//! rebuilt. Paths come from the sink and stay under the directory.

use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use flight_server::checksum::SealDigest;
use flight_server::subscription::RowKind;

use crate::rows::Row;

/// Files rebuilt under `out`, with the ones being written held open.
pub struct Rebuilt {
    out: PathBuf,
    open: HashMap<String, std::fs::File>,
}

impl Rebuilt {
    pub fn new(out: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        Ok(Self {
            out: out.to_owned(),
            open: HashMap::new(),
        })
    }

    /// Where a row's path lands: under the output directory, never outside.
    fn target(&self, path: &str) -> anyhow::Result<PathBuf> {
        let confined = !path.is_empty()
            && !path.starts_with('/')
            && path
                .split('/')
                .all(|part| !part.is_empty() && part != "." && part != "..");
        if !confined {
            bail!("the sink sent a path that would leave the output directory: {path:?}");
        }
        Ok(self.out.join(path))
    }

    fn file(&mut self, path: &str, truncate: bool) -> anyhow::Result<&std::fs::File> {
        let target = self.target(path)?;
        if truncate || !self.open.contains_key(path) {
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(truncate)
                .open(&target)
                .with_context(|| format!("opening {}", target.display()))?;
            self.open.insert(path.to_owned(), file);
        }
        self.open
            .get(path)
            .with_context(|| format!("{path} is not open"))
    }

    /// Applies one row.
    pub fn take(&mut self, row: &Row<'_>) -> anyhow::Result<()> {
        match row.kind {
            RowKind::Opened => {
                self.file(row.path, true)?;
            }
            RowKind::Data => {
                let target = self.target(row.path)?;
                self.file(row.path, false)?
                    .write_all_at(row.data, row.offset)
                    .with_context(|| {
                        format!("writing at offset {} of {}", row.offset, target.display())
                    })?;
            }
            RowKind::Renamed => self.rename(row)?,
            RowKind::Sealed => self.check_seal(row)?,
            // A generation the cursor knew that no longer exists at all:
            // nothing of it is here under a name the sink could give.
            RowKind::Superseded if row.path.is_empty() => {}
            RowKind::Superseded => {
                // The generation is void: its file goes (a newer one follows).
                self.open.remove(row.path);
                let target = self.target(row.path)?;
                match std::fs::remove_file(&target) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(e).with_context(|| format!("removing {}", target.display()));
                    }
                }
            }
        }
        Ok(())
    }

    fn rename(&mut self, row: &Row<'_>) -> anyhow::Result<()> {
        let from = row
            .from_path
            .context("the sink sent a renamed row without from_path")?;
        let (from_target, to_target) = (self.target(from)?, self.target(row.path)?);
        self.open.remove(from);
        self.open.remove(row.path);
        if let Some(parent) = to_target.parent() {
            std::fs::create_dir_all(parent)
                .with_context(|| format!("creating {}", parent.display()))?;
        }
        match std::fs::rename(&from_target, &to_target) {
            Ok(()) => Ok(()),
            // Applied already, by this consumer before it was stopped (its
            // cursor had not caught up yet).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && to_target.exists() => Ok(()),
            Err(e) => Err(e).with_context(|| {
                format!(
                    "renaming {} to {}",
                    from_target.display(),
                    to_target.display()
                )
            }),
        }
    }

    fn check_seal(&mut self, row: &Row<'_>) -> anyhow::Result<()> {
        let (size, digest) = (row.size.unwrap_or(0), row.digest.unwrap_or_default());
        let target = self.target(row.path)?;
        self.open.remove(row.path);
        let file = std::fs::File::open(&target)
            .with_context(|| format!("opening {} to check its seal", target.display()))?;
        let algorithm = SealDigest::of_digest(digest)
            .map_err(|e| anyhow::anyhow!("the seal of {}: {e}", row.path))?;
        let got = algorithm
            .of_file_prefix(&file, size)
            .with_context(|| format!("hashing {}", target.display()))?;
        let rebuilt = file
            .metadata()
            .with_context(|| format!("reading the size of {}", target.display()))?
            .len();
        if got != digest || rebuilt != size {
            bail!(
                "{} does not match its seal (key {} generation {}): {size} bytes with {digest}, \
                 rebuilt {rebuilt} bytes with {got}",
                target.display(),
                row.file_key,
                row.generation,
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own under the system's temporary one, removed
    /// when the test ends.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir()
                .join(format!("tailflight-consumer-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            Self(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn row<'a>(kind: RowKind, path: &'a str) -> Row<'a> {
        Row {
            kind,
            path,
            file_key: "k",
            generation: 1,
            offset: 0,
            data: &[],
            size: None,
            digest: None,
            from_path: None,
        }
    }

    fn data<'a>(path: &'a str, offset: u64, bytes: &'a [u8]) -> Row<'a> {
        Row {
            offset,
            data: bytes,
            ..row(RowKind::Data, path)
        }
    }

    fn seal<'a>(path: &'a str, content: &[u8], digest: &'a mut String) -> Row<'a> {
        let mut hasher = SealDigest::Crc64Nvme.hasher();
        hasher.update(content);
        *digest = hasher.finish();
        Row {
            size: Some(content.len() as u64),
            digest: Some(digest.as_str()),
            ..row(RowKind::Sealed, path)
        }
    }

    #[test]
    fn data_in_any_order_rebuilds_the_file_and_its_seal_holds() {
        let scratch = Scratch::new("rebuild");
        let mut rebuilt = Rebuilt::new(&scratch.0).unwrap();
        rebuilt.take(&row(RowKind::Opened, "d/a.dat")).unwrap();
        rebuilt.take(&data("d/a.dat", 5, b" world")).unwrap();
        rebuilt.take(&data("d/a.dat", 0, b"hello")).unwrap();
        let mut digest = String::new();
        rebuilt
            .take(&seal("d/a.dat", b"hello world", &mut digest))
            .unwrap();
        assert_eq!(
            std::fs::read(scratch.0.join("d/a.dat")).unwrap(),
            b"hello world"
        );
    }

    #[test]
    fn a_file_that_does_not_match_its_seal_is_an_error_naming_it() {
        let scratch = Scratch::new("bad-seal");
        let mut rebuilt = Rebuilt::new(&scratch.0).unwrap();
        rebuilt.take(&row(RowKind::Opened, "a.dat")).unwrap();
        rebuilt.take(&data("a.dat", 0, b"hellO world")).unwrap();
        let mut digest = String::new();
        let error = rebuilt
            .take(&seal("a.dat", b"hello world", &mut digest))
            .unwrap_err()
            .to_string();
        assert!(error.contains("a.dat does not match its seal"), "{error}");
    }

    #[test]
    fn a_rename_moves_the_file_and_applied_again_is_harmless() {
        let scratch = Scratch::new("rename");
        let mut rebuilt = Rebuilt::new(&scratch.0).unwrap();
        rebuilt.take(&row(RowKind::Opened, "a.tmp")).unwrap();
        rebuilt.take(&data("a.tmp", 0, b"bytes")).unwrap();
        let renamed = Row {
            from_path: Some("a.tmp"),
            ..row(RowKind::Renamed, "run/a.dat")
        };
        rebuilt.take(&renamed).unwrap();
        // A restart before the cursor caught up delivers it again.
        rebuilt.take(&renamed).unwrap();
        rebuilt.take(&data("run/a.dat", 5, b"!")).unwrap();
        assert!(!scratch.0.join("a.tmp").exists());
        assert_eq!(
            std::fs::read(scratch.0.join("run/a.dat")).unwrap(),
            b"bytes!"
        );
    }

    #[test]
    fn a_superseded_generation_leaves_and_the_next_starts_empty() {
        let scratch = Scratch::new("superseded");
        let mut rebuilt = Rebuilt::new(&scratch.0).unwrap();
        rebuilt.take(&row(RowKind::Opened, "a.dat")).unwrap();
        rebuilt.take(&data("a.dat", 0, b"old generation")).unwrap();
        rebuilt.take(&row(RowKind::Superseded, "a.dat")).unwrap();
        assert!(!scratch.0.join("a.dat").exists());
        // Superseded again (a resumed cursor), or one never seen here.
        rebuilt.take(&row(RowKind::Superseded, "a.dat")).unwrap();
        rebuilt.take(&row(RowKind::Superseded, "")).unwrap();
        let next = Row {
            generation: 2,
            ..row(RowKind::Opened, "a.dat")
        };
        rebuilt.take(&next).unwrap();
        rebuilt.take(&data("a.dat", 0, b"new")).unwrap();
        assert_eq!(std::fs::read(scratch.0.join("a.dat")).unwrap(), b"new");
    }

    #[test]
    fn paths_that_would_leave_the_output_directory_are_refused() {
        let scratch = Scratch::new("confined");
        let mut rebuilt = Rebuilt::new(&scratch.0).unwrap();
        for path in ["../escape", "/etc/passwd", "a/../../b", "a//b", "./a", ""] {
            let error = rebuilt
                .take(&row(RowKind::Opened, path))
                .expect_err(path)
                .to_string();
            assert!(
                error.contains("would leave the output directory"),
                "{path}: {error}"
            );
        }
        let renamed = Row {
            from_path: Some("../outside"),
            ..row(RowKind::Renamed, "inside")
        };
        assert!(rebuilt.take(&renamed).is_err());
    }
}
