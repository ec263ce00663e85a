//! Live readers across new generations: while files grow and are
//! replaced at their paths (deleted and created again as they grow), a
//! reader of every destination file, old generations included, never reads
//! a byte that is not its generation's, under `--superseded keep` (old
//! generations moved aside) and `mirror` (old generations unlinked).
//!
//! Each generation's content describes itself: an 8-byte header names its
//! seed, and every later byte is a function of the seed and its offset,
//! never zero. So the reader needs no copy of the source (which has moved on
//! to the next generation by the time it reads the last one), and a hole
//! (zeros) or a byte of another generation can not pass for data.

mod common;

use std::io::Write;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Pipeline, PipelineOptions, assert_clean_audit, list_files};

const HEADER: u64 = 8;
const FILES: usize = 3;
const GENERATIONS: u32 = 4;
const APPEND: usize = 48 << 10;
const APPENDS_PER_GENERATION: usize = 40;
/// Far above what any run needs: only stops a hung test.
const TIMEOUT: Duration = Duration::from_secs(120);

fn seed_of(file: usize, generation: u32) -> u32 {
    0x1000_0000 + (file as u32) * 0x100 + generation
}

/// The byte a generation holds at `offset` (never zero).
fn expected_byte(seed: u32, offset: u64) -> u8 {
    if offset < HEADER {
        return format!("{seed:08x}").as_bytes()[offset as usize];
    }
    let mut x = (seed as u64) ^ offset.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    1 + (x % 255) as u8
}

fn generation_bytes(seed: u32, offset: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| expected_byte(seed, offset + i))
        .collect()
}

#[derive(Debug, Default)]
struct Report {
    bytes_checked: u64,
    files_seen: usize,
    mismatched: u64,
    examples: Vec<String>,
}

/// Reads every destination file up to its current size, as a live reader
/// does, and checks each byte against the generation its header names.
fn read_live(dest: &Path, stop: &AtomicBool) -> Report {
    // Per (device, inode): the open file, how far it was read, its seed.
    let mut files: std::collections::HashMap<(u64, u64), (std::fs::File, u64, Option<u32>)> =
        Default::default();
    let mut report = Report::default();
    loop {
        let last = stop.load(Ordering::Relaxed);
        for relative in list_files(dest) {
            let Ok(file) = std::fs::File::open(dest.join(&relative)) else {
                continue;
            };
            let Ok(meta) = file.metadata() else {
                continue;
            };
            let (file, read, seed) = files
                .entry((meta.dev(), meta.ino()))
                .or_insert((file, 0, None));
            let Ok(size) = file.metadata().map(|m| m.len()) else {
                continue;
            };
            if size <= *read {
                continue;
            }
            let mut bytes = vec![0u8; (size - *read).min(4 << 20) as usize];
            let Ok(got) = file.read_at(&mut bytes, *read) else {
                continue;
            };
            bytes.truncate(got);
            for (i, &byte) in bytes.iter().enumerate() {
                let offset = *read + i as u64;
                if seed.is_none() && offset == HEADER {
                    let mut header = [0u8; HEADER as usize];
                    if file.read_exact_at(&mut header, 0).is_ok() {
                        *seed = std::str::from_utf8(&header)
                            .ok()
                            .and_then(|h| u32::from_str_radix(h, 16).ok());
                    }
                }
                let good = match *seed {
                    Some(seed) => byte == expected_byte(seed, offset),
                    // The header: hex digits, never a hole.
                    None => offset < HEADER && byte.is_ascii_hexdigit(),
                };
                if !good {
                    report.mismatched += 1;
                    if report.examples.len() < 5 {
                        report.examples.push(format!(
                            "{relative} offset {offset}: read {byte:#04x} (generation {seed:x?})"
                        ));
                    }
                }
            }
            report.bytes_checked += got as u64;
            *read += got as u64;
        }
        if last {
            report.files_seen = files.len();
            return report;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Writes each file's generations one after another; a generation is
/// replaced only once part of it has reached the destination, so that
/// every generation is there to be superseded.
fn grow_and_replace(source: &Path, dest: &Path) {
    let paths: Vec<_> = (0..FILES)
        .map(|f| source.join(format!("gen/f{f}.dat")))
        .collect();
    std::fs::create_dir_all(source.join("gen")).unwrap();
    for generation in 1..=GENERATIONS {
        let mut open: Vec<(std::fs::File, u32)> = paths
            .iter()
            .enumerate()
            .map(|(f, path)| {
                // Deleted and created again: a new inode, a new generation.
                let _ = std::fs::remove_file(path);
                (std::fs::File::create(path).unwrap(), seed_of(f, generation))
            })
            .collect();
        for append in 0..APPENDS_PER_GENERATION {
            for (file, seed) in &mut open {
                let offset = (append * APPEND) as u64;
                file.write_all(&generation_bytes(*seed, offset, APPEND))
                    .unwrap();
            }
            std::thread::sleep(Duration::from_millis(3));
        }
        let deadline = Instant::now() + TIMEOUT;
        for (f, (_, seed)) in open.iter().enumerate() {
            let header = format!("{seed:08x}");
            let dest = dest.join(format!("gen/f{f}.dat"));
            loop {
                let mut head = [0u8; HEADER as usize];
                let arrived = std::fs::File::open(&dest)
                    .and_then(|file| file.read_exact_at(&mut head, 0))
                    .is_ok();
                if arrived && head == header.as_bytes() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} never arrived",
                    dest.display()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}

fn run(name: &str, superseded: &str) {
    let pipeline = Pipeline::in_scratch(
        name,
        PipelineOptions {
            extra_sink_args: common::strings(&["--superseded", superseded]),
            ..Default::default()
        },
    );
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (dest, stop) = (pipeline.dest(), stop.clone());
        std::thread::spawn(move || read_live(&dest, &stop))
    };
    grow_and_replace(&pipeline.source, &pipeline.dest());

    // The last generations arrive whole at the files' own names.
    let deadline = Instant::now() + TIMEOUT;
    let last_len = APPEND * APPENDS_PER_GENERATION;
    for f in 0..FILES {
        let expected = generation_bytes(seed_of(f, GENERATIONS), 0, last_len);
        let dest = pipeline.dest().join(format!("gen/f{f}.dat"));
        while std::fs::read(&dest).ok().as_deref() != Some(&expected[..]) {
            assert!(
                Instant::now() < deadline,
                "{} never held the last generation\n--- sink log ---\n{}",
                dest.display(),
                pipeline.sink.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let report = reader.join().expect("the live reader panicked");
    println!("{name}: {report:?}");
    let kept = list_files(&pipeline.dest())
        .into_iter()
        .filter(|f| f.contains(".gen"))
        .count();
    println!("{name}: {kept} old generations kept at the destination");
    assert!(
        report.bytes_checked >= (FILES * last_len) as u64,
        "the reader checked too little: {report:?}"
    );
    assert_eq!(
        report.mismatched, 0,
        "a live reader read bytes that are not its generation's: {report:?}"
    );
    if superseded == "keep" {
        assert!(
            kept > 0,
            "no old generation was kept under --superseded keep"
        );
    }
    let mut pipeline = pipeline;
    pipeline.watcher.stop();
    pipeline.sink.stop();
    assert_clean_audit(&pipeline.sink_state);
}

#[test]
fn replaced_files_under_superseded_keep() {
    run("live-generations-keep", "keep");
}

#[test]
fn replaced_files_under_superseded_mirror() {
    run("live-generations-mirror", "mirror");
}
