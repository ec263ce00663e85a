//! What a one-shot send is asked to copy: the files named on the command
//! line and the trees under the directories, each with the path it gets at
//! the sink, and every entry that is passed over with the reason.
//!
//! Naming follows `cp -r` and rsync: a directory `run7` lands as
//! `PATH/run7/...`, a directory named with a trailing slash (`run7/`) lands
//! its contents directly under `PATH/`.

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::discover;

/// A file to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Planned {
    pub local: PathBuf,
    /// Its path at the sink, relative to the source's directory.
    pub key: String,
    pub size: u64,
}

/// An entry that is not sent, and why (a missing path, a link, a directory
/// without `-r`...).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Passed {
    pub path: String,
    pub why: String,
}

#[derive(Debug, Default)]
pub struct Plan {
    pub files: Vec<Planned>,
    pub passed: Vec<Passed>,
}

/// Checks a destination prefix: plain relative components, nothing that
/// could climb out of the source's directory (the sink confines anyway;
/// this says so before anything is sent).
pub fn check_prefix(prefix: &str) -> Result<(), String> {
    if prefix.is_empty() {
        return Ok(());
    }
    for part in prefix.split('/') {
        if part.is_empty() || part == "." || part == ".." || part.contains('\0') {
            return Err(format!(
                "the destination path {prefix:?} must be plain names separated by '/' (no '.', '..' or empty parts)"
            ));
        }
    }
    Ok(())
}

fn join(prefix: &str, name: &str) -> String {
    match (prefix.is_empty(), name.is_empty()) {
        (true, _) => name.to_owned(),
        (false, true) => prefix.to_owned(),
        (false, false) => format!("{prefix}/{name}"),
    }
}

/// Walks `sources` into the files to send under `prefix`.
pub fn plan(sources: &[PathBuf], recursive: bool, prefix: &str) -> Plan {
    let mut plan = Plan::default();
    let mut keys: HashMap<String, PathBuf> = HashMap::new();
    let mut add = |plan: &mut Plan, local: PathBuf, key: String, size: u64| {
        if let Some(first) = keys.get(&key) {
            plan.passed.push(Passed {
                path: local.display().to_string(),
                why: format!(
                    "same destination ({key}) as {}, which is sent instead",
                    first.display()
                ),
            });
            return;
        }
        keys.insert(key.clone(), local.clone());
        plan.files.push(Planned { local, key, size });
    };
    for source in sources {
        let shown = source.display().to_string();
        let pass = |plan: &mut Plan, why: String| {
            plan.passed.push(Passed {
                path: shown.clone(),
                why,
            })
        };
        let meta = match std::fs::symlink_metadata(source) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                pass(&mut plan, "no such file or directory".into());
                continue;
            }
            Err(e) => {
                pass(&mut plan, format!("cannot be examined: {e}"));
                continue;
            }
        };
        let kind = meta.file_type();
        let trailing_slash = shown.ends_with('/');
        let name = source
            .file_name()
            .map(|name| name.to_str().map(str::to_owned));
        let name = match name {
            // "/" or "..": no name of its own; its contents land under the prefix.
            None => String::new(),
            Some(Some(name)) => name,
            Some(None) => {
                pass(
                    &mut plan,
                    "a name that is not UTF-8 (the wire carries UTF-8 paths)".into(),
                );
                continue;
            }
        };
        if kind.is_symlink() {
            pass(&mut plan, "a symbolic link (links are not followed)".into());
        } else if kind.is_file() {
            if name.is_empty() {
                pass(&mut plan, "a file path without a file name".into());
                continue;
            }
            add(&mut plan, source.clone(), join(prefix, &name), meta.size());
        } else if kind.is_dir() {
            if !recursive {
                pass(&mut plan, "a directory (give -r to send trees)".into());
                continue;
            }
            let base = if trailing_slash {
                prefix.to_owned()
            } else {
                join(prefix, &name)
            };
            match discover::walk_with(source, || {}) {
                Ok(walked) => {
                    for found in walked.files {
                        let local = source.join(&found.path);
                        add(&mut plan, local, join(&base, &found.path), found.size);
                    }
                    for skipped in walked.skipped {
                        plan.passed.push(Passed {
                            path: Path::new(source).join(&skipped.path).display().to_string(),
                            why: skipped.why.to_owned(),
                        });
                    }
                }
                Err(e) => pass(&mut plan, format!("cannot be walked: {e}")),
            }
        } else {
            pass(
                &mut plan,
                "not a regular file (a device, FIFO or socket)".into(),
            );
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("tailflight-plan-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn keys(plan: &Plan) -> Vec<String> {
        let mut keys: Vec<String> = plan.files.iter().map(|f| f.key.clone()).collect();
        keys.sort();
        keys
    }

    #[test]
    fn names_follow_cp_and_rsync() {
        let dir = scratch("names");
        std::fs::create_dir_all(dir.join("run7/sub")).unwrap();
        std::fs::write(dir.join("run7/a.xtc2"), b"a").unwrap();
        std::fs::write(dir.join("run7/sub/b.xtc2"), b"bb").unwrap();
        std::fs::write(dir.join("calib.h5"), b"c").unwrap();
        let tree = plan(&[dir.join("run7")], true, "exp/2026");
        assert_eq!(
            keys(&tree),
            ["exp/2026/run7/a.xtc2", "exp/2026/run7/sub/b.xtc2"]
        );
        let contents = plan(
            &[PathBuf::from(format!("{}/", dir.join("run7").display()))],
            true,
            "",
        );
        assert_eq!(keys(&contents), ["a.xtc2", "sub/b.xtc2"]);
        let file = plan(&[dir.join("calib.h5")], false, "c");
        assert_eq!(keys(&file), ["c/calib.h5"]);
        assert_eq!(file.files[0].size, 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn passed_over_entries_say_why() {
        let dir = scratch("passed");
        std::fs::create_dir_all(dir.join("tree")).unwrap();
        std::fs::write(dir.join("tree/a"), b"a").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("tree/link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("link")).unwrap();
        std::fs::write(dir.join("a"), b"other a").unwrap();
        let got = plan(
            &[dir.join("missing"), dir.join("tree"), dir.join("link")],
            false,
            "",
        );
        assert!(got.files.is_empty());
        let whys: Vec<&str> = got.passed.iter().map(|p| p.why.as_str()).collect();
        assert!(whys[0].contains("no such file"), "{whys:?}");
        assert!(whys[1].contains("-r"), "{whys:?}");
        assert!(whys[2].contains("symbolic link"), "{whys:?}");
        let got = plan(
            &[
                PathBuf::from(format!("{}/", dir.join("tree").display())),
                dir.join("a"),
            ],
            true,
            "",
        );
        assert_eq!(keys(&got), ["a"]);
        assert_eq!(got.files[0].local, dir.join("tree").join("a"));
        let whys: Vec<&str> = got.passed.iter().map(|p| p.why.as_str()).collect();
        assert!(whys.iter().any(|w| w.contains("symbolic link")), "{whys:?}");
        assert!(
            whys.iter().any(|w| w.contains("same destination")),
            "{whys:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn prefixes_stay_inside() {
        assert!(check_prefix("").is_ok());
        assert!(check_prefix("exp/run7").is_ok());
        for bad in ["../x", "a/../b", "/abs", "a//b", "a/", "./a"] {
            assert!(check_prefix(bad).is_err(), "{bad}");
        }
    }
}
