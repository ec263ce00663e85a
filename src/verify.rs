//! Compares a source tree with a destination tree, byte for byte (`tailflight verify`).
//!
//! Each source file is compared with the file at the same relative path under the
//! destination over the length both have; differing bytes are reported as merged
//! ranges, and a length mismatch as the range one side has beyond the other. Sizes are
//! taken once per file when it is opened, so a source that is still growing is compared
//! as of that moment rather than chased.

use anyhow::{Context, Result, bail};
use serde::Serialize;
use std::fmt;
use std::fs::{self, File};
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};

/// Files are read and compared in blocks of this size.
const BLOCK: usize = 1 << 20;
/// Differing blocks are narrowed down in sub-blocks of this size before going byte by byte.
const SUB_BLOCK: usize = 4096;
/// At most this many differing ranges are kept per file; `differing_bytes` still counts all.
const MAX_RANGES: usize = 100;
/// Ranges shown per file by the human summary.
const SHOWN_RANGES: usize = 5;

#[derive(Debug, Default, Serialize)]
pub struct FileDiff {
    /// Relative path, '/'-separated.
    pub path: String,
    pub source_size: Option<u64>,
    /// None when the destination has no regular file at this path.
    pub dest_size: Option<u64>,
    /// Byte ranges [start, end) whose contents differ within the common length, merged
    /// and capped at 100 entries.
    pub differing: Vec<(u64, u64)>,
    /// Total differing bytes within the common length, including any past the cap.
    pub differing_bytes: u64,
    /// Bytes the source has beyond the destination's end.
    pub missing: Option<(u64, u64)>,
    /// Bytes the destination has beyond the source's end.
    pub extra: Option<(u64, u64)>,
}

#[derive(Debug, Default, Serialize)]
pub struct VerifyReport {
    pub files_compared: u64,
    pub bytes_compared: u64,
    pub identical: u64,
    pub diffs: Vec<FileDiff>,
}

impl VerifyReport {
    pub fn is_identical(&self) -> bool {
        self.diffs.is_empty()
    }
}

#[derive(Debug, Clone, Default)]
pub struct VerifyOptions {
    /// Skip source files that the destination does not have at all.
    pub ignore_missing_in_dest: bool,
    /// File-name suffixes to skip, e.g. ".end.json" or ".inprogress".
    pub ignore: Vec<String>,
}

/// Walks `src` recursively (regular files only; symlinks are not followed) and compares
/// each file with `dest/<same relative path>`. A source file missing at the destination
/// is a [`FileDiff`] with `dest_size` None; files only at the destination are not
/// reported. If `src` is a single file it is compared with `dest` itself, or with
/// `dest/<file name>` when `dest` is a directory.
pub fn verify_trees(src: &Path, dest: &Path, opts: &VerifyOptions) -> Result<VerifyReport> {
    let meta =
        fs::symlink_metadata(src).with_context(|| format!("reading source {}", src.display()))?;
    let mut files = Vec::new();
    if meta.is_file() {
        let name = src
            .file_name()
            .with_context(|| format!("source {} has no file name", src.display()))?;
        let dest_file = if dest.is_dir() {
            dest.join(name)
        } else {
            dest.to_path_buf()
        };
        files.push((
            name.to_string_lossy().into_owned(),
            src.to_path_buf(),
            dest_file,
        ));
    } else if meta.is_dir() {
        walk(src, dest, "", &mut files)?;
    } else {
        bail!(
            "source {} is neither a directory nor a regular file",
            src.display()
        );
    }

    let mut report = VerifyReport::default();
    let mut bufs = (vec![0u8; BLOCK], vec![0u8; BLOCK]);
    for (rel, src_file, dest_file) in files {
        let file_name = rel.rsplit('/').next().unwrap_or(&rel);
        if opts.ignore.iter().any(|s| file_name.ends_with(s.as_str())) {
            continue;
        }
        let diff = compare_file(&rel, &src_file, &dest_file, &mut bufs)?;
        if diff.dest_size.is_none() && opts.ignore_missing_in_dest {
            continue;
        }
        report.files_compared += 1;
        if let (Some(s), Some(d)) = (diff.source_size, diff.dest_size) {
            report.bytes_compared += s.min(d);
        }
        let same = diff.dest_size.is_some()
            && diff.source_size == diff.dest_size
            && diff.differing_bytes == 0;
        if same {
            report.identical += 1;
        } else {
            report.diffs.push(diff);
        }
    }
    Ok(report)
}

/// Collects (relative path, source path, dest path) for every regular file under
/// `dir`, in name order so reports are stable.
fn walk(
    dir: &Path,
    dest: &Path,
    prefix: &str,
    out: &mut Vec<(String, PathBuf, PathBuf)>,
) -> Result<()> {
    let mut entries = fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<Vec<_>>>()
        .with_context(|| format!("listing {}", dir.display()))?;
    entries.sort();
    for name in entries {
        let path = dir.join(&name);
        let rel = format!("{prefix}{}", name.to_string_lossy());
        let meta =
            fs::symlink_metadata(&path).with_context(|| format!("reading {}", path.display()))?;
        if meta.is_dir() {
            walk(&path, &dest.join(&name), &format!("{rel}/"), out)?;
        } else if meta.is_file() {
            out.push((rel, path, dest.join(&name)));
        }
    }
    Ok(())
}

fn compare_file(
    rel: &str,
    src: &Path,
    dest: &Path,
    (a, b): &mut (Vec<u8>, Vec<u8>),
) -> Result<FileDiff> {
    let mut src_file = File::open(src).with_context(|| format!("opening {}", src.display()))?;
    let source_size = src_file
        .metadata()
        .with_context(|| format!("reading size of {}", src.display()))?
        .len();
    let mut diff = FileDiff {
        path: rel.to_string(),
        source_size: Some(source_size),
        ..FileDiff::default()
    };

    // Anything but a regular file (absent, a directory, a dangling link) counts as
    // missing; other errors (permissions, I/O) are real failures. Checking before
    // opening keeps a FIFO at the destination from blocking the walk.
    let dest_file = match fs::metadata(dest) {
        Ok(m) if m.is_file() => {
            let f = File::open(dest).with_context(|| format!("opening {}", dest.display()))?;
            Some((f, m.len()))
        }
        Ok(_) => None,
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => None,
        Err(e) => return Err(e).with_context(|| format!("reading {}", dest.display())),
    };
    let Some((mut dest_file, dest_size)) = dest_file else {
        if source_size > 0 {
            diff.missing = Some((0, source_size));
        }
        return Ok(diff);
    };
    diff.dest_size = Some(dest_size);
    if source_size > dest_size {
        diff.missing = Some((dest_size, source_size));
    } else if dest_size > source_size {
        diff.extra = Some((source_size, dest_size));
    }

    let common = source_size.min(dest_size);
    let mut offset = 0u64;
    while offset < common {
        let n = (common - offset).min(BLOCK as u64) as usize;
        read_block(&mut src_file, &mut a[..n], src, offset)?;
        read_block(&mut dest_file, &mut b[..n], dest, offset)?;
        if a[..n] != b[..n] {
            record_differences(&mut diff, offset, &a[..n], &b[..n]);
        }
        offset += n as u64;
    }
    Ok(diff)
}

fn read_block(file: &mut File, buf: &mut [u8], path: &Path, offset: u64) -> Result<()> {
    file.read_exact(buf).with_context(|| {
        format!(
            "reading {} bytes at offset {offset} of {} (did it shrink while being verified?)",
            buf.len(),
            path.display()
        )
    })
}

/// Adds the differing ranges of two equal-length blocks that start at `base`.
fn record_differences(diff: &mut FileDiff, base: u64, a: &[u8], b: &[u8]) {
    let mut sub_start = 0usize;
    for (sa, sb) in a.chunks(SUB_BLOCK).zip(b.chunks(SUB_BLOCK)) {
        if sa != sb {
            let mut i = 0usize;
            while i < sa.len() {
                if sa[i] == sb[i] {
                    i += 1;
                    continue;
                }
                let start = i;
                while i < sa.len() && sa[i] != sb[i] {
                    i += 1;
                }
                let at = base + (sub_start + start) as u64;
                add_range(diff, at, at + (i - start) as u64);
            }
        }
        sub_start += sa.len();
    }
}

/// Appends [start, end), merging with the previous range when they touch (ranges
/// arrive in increasing order). Past the cap only the byte count grows.
fn add_range(diff: &mut FileDiff, start: u64, end: u64) {
    diff.differing_bytes += end - start;
    if let Some(last) = diff.differing.last_mut()
        && last.1 == start
    {
        last.1 = end;
        return;
    }
    if diff.differing.len() < MAX_RANGES {
        diff.differing.push((start, end));
    }
}

fn fmt_size(size: Option<u64>) -> String {
    size.map_or_else(|| "absent".to_string(), |s| s.to_string())
}

impl fmt::Display for FileDiff {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: source {} B, dest {}",
            self.path,
            fmt_size(self.source_size),
            match self.dest_size {
                Some(d) => format!("{d} B"),
                None => "missing".to_string(),
            }
        )?;
        if !self.differing.is_empty() {
            write!(f, "; {} bytes differ at", self.differing_bytes)?;
            for (s, e) in self.differing.iter().take(SHOWN_RANGES) {
                write!(f, " [{s}, {e})")?;
            }
            if self.differing.len() > SHOWN_RANGES {
                write!(
                    f,
                    " and {} more ranges",
                    self.differing.len() - SHOWN_RANGES
                )?;
            }
            if self.differing.len() >= MAX_RANGES {
                write!(f, " (list capped at {MAX_RANGES})")?;
            }
        }
        if let Some((s, e)) = self.missing {
            write!(f, "; dest lacks [{s}, {e})")?;
        }
        if let Some((s, e)) = self.extra {
            write!(f, "; dest has extra [{s}, {e})")?;
        }
        Ok(())
    }
}

impl fmt::Display for VerifyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for d in &self.diffs {
            writeln!(f, "{d}")?;
        }
        write!(
            f,
            "{} files identical, {} differ ({} bytes compared)",
            self.identical,
            self.diffs.len(),
            self.bytes_compared
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A fresh directory under the system temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let dir = std::env::temp_dir().join(format!(
                "tailflight-verify-{tag}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).expect("create scratch dir");
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn pattern(len: usize, salt: u8) -> Vec<u8> {
        (0..len)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 13) as u8 ^ salt)
            .collect()
    }

    fn put(root: &Path, rel: &str, data: &[u8]) {
        let p = root.join(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).expect("mkdir");
        }
        fs::write(p, data).expect("write");
    }

    /// src and dest with the same three files, one large enough to span blocks.
    fn twin_trees(tag: &str) -> (Scratch, PathBuf, PathBuf) {
        let s = Scratch::new(tag);
        let (src, dest) = (s.0.join("src"), s.0.join("dest"));
        for root in [&src, &dest] {
            put(root, "a.xtc2", &pattern(1000, 1));
            put(root, "sub/b.xtc2", &pattern(BLOCK * 2 + 17, 2));
            put(root, "sub/deeper/empty", b"");
        }
        (s, src, dest)
    }

    #[test]
    fn identical_trees() {
        let (_s, src, dest) = twin_trees("same");
        put(&dest, "only-in-dest", b"ignored");
        let r = verify_trees(&src, &dest, &VerifyOptions::default()).expect("verify");
        assert!(r.is_identical(), "{r}");
        assert_eq!(r.files_compared, 3);
        assert_eq!(r.identical, 3);
        assert_eq!(r.bytes_compared, 1000 + (BLOCK * 2 + 17) as u64);
        assert!(
            r.to_string()
                .ends_with("3 files identical, 0 differ (2098169 bytes compared)"),
            "{r}"
        );
    }

    #[test]
    fn flipped_bytes_are_located() {
        let (_s, src, dest) = twin_trees("flip");
        let mut data = pattern(BLOCK * 2 + 17, 2);
        // One byte, then a run straddling the first block boundary.
        data[5] ^= 0xFF;
        for b in &mut data[BLOCK - 3..BLOCK + 4] {
            *b ^= 0x01;
        }
        put(&dest, "sub/b.xtc2", &data);
        let r = verify_trees(&src, &dest, &VerifyOptions::default()).expect("verify");
        assert!(!r.is_identical());
        assert_eq!(r.identical, 2);
        assert_eq!(r.diffs.len(), 1);
        let d = &r.diffs[0];
        assert_eq!(d.path, "sub/b.xtc2");
        let b = BLOCK as u64;
        assert_eq!(d.differing, vec![(5, 6), (b - 3, b + 4)]);
        assert_eq!(d.differing_bytes, 8);
        assert_eq!((d.missing, d.extra), (None, None));
        let text = r.to_string();
        assert!(
            text.contains("sub/b.xtc2") && text.contains("[5, 6)"),
            "{text}"
        );
        assert!(
            text.ends_with("2 files identical, 1 differ (2098169 bytes compared)"),
            "{text}"
        );
    }

    #[test]
    fn truncated_and_extended_dest() {
        let (_s, src, dest) = twin_trees("trunc");
        put(&dest, "a.xtc2", &pattern(600, 1));
        let mut longer = pattern(BLOCK * 2 + 17, 2);
        longer.extend_from_slice(b"tail");
        put(&dest, "sub/b.xtc2", &longer);
        let r = verify_trees(&src, &dest, &VerifyOptions::default()).expect("verify");
        assert_eq!(r.diffs.len(), 2);
        let a = &r.diffs[0];
        assert_eq!(a.path, "a.xtc2");
        assert_eq!((a.source_size, a.dest_size), (Some(1000), Some(600)));
        assert_eq!(a.missing, Some((600, 1000)));
        assert!(a.differing.is_empty());
        let b = &r.diffs[1];
        let n = (BLOCK * 2 + 17) as u64;
        assert_eq!(b.extra, Some((n, n + 4)));
        assert_eq!(b.missing, None);
        assert_eq!(r.bytes_compared, 600 + n);
    }

    #[test]
    fn missing_file_in_dest() {
        let (_s, src, dest) = twin_trees("missing");
        fs::remove_file(dest.join("a.xtc2")).expect("rm");
        let r = verify_trees(&src, &dest, &VerifyOptions::default()).expect("verify");
        assert_eq!(r.diffs.len(), 1);
        let d = &r.diffs[0];
        assert_eq!((d.path.as_str(), d.dest_size), ("a.xtc2", None));
        assert_eq!(d.missing, Some((0, 1000)));
        assert!(
            r.to_string()
                .contains("a.xtc2: source 1000 B, dest missing"),
            "{r}"
        );

        let opts = VerifyOptions {
            ignore_missing_in_dest: true,
            ..VerifyOptions::default()
        };
        let r = verify_trees(&src, &dest, &opts).expect("verify");
        assert!(r.is_identical(), "{r}");
        assert_eq!(r.files_compared, 2);
    }

    #[test]
    fn ignored_suffixes_and_symlinks_are_skipped() {
        let (_s, src, dest) = twin_trees("ignore");
        put(&src, "r0001.end.json", b"{}");
        #[cfg(unix)]
        std::os::unix::fs::symlink(src.join("a.xtc2"), src.join("link.xtc2")).expect("symlink");
        let opts = VerifyOptions {
            ignore: vec![".end.json".into()],
            ..VerifyOptions::default()
        };
        let r = verify_trees(&src, &dest, &opts).expect("verify");
        assert!(r.is_identical(), "{r}");
        assert_eq!(r.files_compared, 3);
    }

    #[test]
    fn many_differences_are_capped_but_counted() {
        let s = Scratch::new("cap");
        let data = pattern(10_000, 3);
        let mut bad = data.clone();
        for i in (0..10_000).step_by(10) {
            bad[i] ^= 0x80;
        }
        put(&s.0.join("src"), "f", &data);
        put(&s.0.join("dest"), "f", &bad);
        let r = verify_trees(
            &s.0.join("src"),
            &s.0.join("dest"),
            &VerifyOptions::default(),
        )
        .expect("verify");
        let d = &r.diffs[0];
        assert_eq!(d.differing.len(), MAX_RANGES);
        assert_eq!(d.differing[99], (990, 991));
        assert_eq!(d.differing_bytes, 1000);
        assert!(r.to_string().contains("capped"), "{r}");
    }

    #[test]
    fn single_file_source() {
        let (_s, src, dest) = twin_trees("single");
        let r =
            verify_trees(&src.join("a.xtc2"), &dest, &VerifyOptions::default()).expect("verify");
        assert!(r.is_identical(), "{r}");
        assert_eq!(r.files_compared, 1);
        let r = verify_trees(
            &src.join("a.xtc2"),
            &dest.join("sub/b.xtc2"),
            &VerifyOptions::default(),
        )
        .expect("verify");
        assert_eq!(r.diffs.len(), 1);
    }
}
