//! The watcher's side: what it reads from a sink (acks, watermarks JSON),
//! mutated from valid answers and read the way the watcher reads them. A
//! sink's answer is never trusted to be well formed: reading one must end
//! in a value or an error, never a panic.

use flight_server::{Ack, FileWatermark, RejectedRow};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// What a run of answer cases came to.
#[derive(Debug, Default)]
pub struct AnswersReport {
    pub cases: u64,
    pub acks_read: u64,
    pub watermarks_read: u64,
    pub refused: u64,
    /// Cases whose reading panicked, with what was read.
    pub crashers: Vec<String>,
}

fn valid_ack(rng: &mut SmallRng) -> Ack {
    Ack {
        seq: rng.random_range(0..1000),
        placed: rng.random_range(0..1 << 20),
        duplicate: rng.random_range(0..1 << 10),
        stale: 0,
        rejected: (0..rng.random_range(0..3))
            .map(|row| RejectedRow {
                row,
                error: "seal digest mismatch".into(),
                superseded: rng.random_bool(0.5),
            })
            .collect(),
    }
}

fn valid_watermarks(rng: &mut SmallRng) -> Vec<FileWatermark> {
    (0..rng.random_range(0..4))
        .map(|i| FileWatermark {
            key: format!("run/f{i}.xtc2"),
            generation: rng.random_range(1..3),
            path: format!("run/f{i}.xtc2"),
            contiguous_end: rng.random_range(0..1 << 30),
            placed_bytes: rng.random_range(0..1 << 30),
            sealed_size: rng.random_bool(0.3).then(|| rng.random_range(0..1 << 30)),
            superseded: rng.random_bool(0.1),
            head_crc32c: rng.random(),
            head_len: 4096,
        })
        .collect()
}

/// Extreme values JSON numbers take where the watcher expects u64s.
const NUMBERS: &[&str] = &[
    "18446744073709551615",
    "18446744073709551616",
    "-1",
    "1e400",
    "0.5",
    "null",
    "\"7\"",
    "99999999999999999999999999999",
];

/// Mutates a JSON text: a number swapped for an extreme one, a byte
/// flipped, cut short, or nested deep.
fn mutate_json(text: &str, rng: &mut SmallRng) -> Vec<u8> {
    let mut bytes = text.as_bytes().to_vec();
    match rng.random_range(0..5u32) {
        0 => {
            let digits: Vec<usize> = bytes
                .iter()
                .enumerate()
                .filter(|(i, b)| b.is_ascii_digit() && (*i == 0 || !bytes[i - 1].is_ascii_digit()))
                .map(|(i, _)| i)
                .collect();
            if let Some(&at) = digits.get(rng.random_range(0..digits.len().max(1))) {
                let end = (at..bytes.len())
                    .find(|&i| !bytes[i].is_ascii_digit())
                    .unwrap_or(bytes.len());
                let number = NUMBERS[rng.random_range(0..NUMBERS.len())];
                bytes.splice(at..end, number.bytes());
            }
        }
        1 if !bytes.is_empty() => {
            let at = rng.random_range(0..bytes.len());
            bytes[at] = rng.random();
        }
        2 if !bytes.is_empty() => {
            bytes.truncate(rng.random_range(0..bytes.len()));
        }
        3 => {
            let depth = rng.random_range(100..5000);
            bytes = "[".repeat(depth).into_bytes();
            bytes.extend("]".repeat(depth).bytes());
        }
        _ => {
            bytes = (0..rng.random_range(0..64)).map(|_| rng.random()).collect();
        }
    }
    bytes
}

/// Runs `cases` answer cases from `seed`.
pub fn run(cases: u64, seed: u64) -> AnswersReport {
    let mut report = AnswersReport::default();
    for case in 0..cases {
        let mut rng = SmallRng::seed_from_u64(seed ^ case.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        report.cases += 1;
        let (what, text) = if rng.random_bool(0.5) {
            ("ack", serde_json::to_string(&valid_ack(&mut rng)))
        } else {
            (
                "watermarks",
                serde_json::to_string(&valid_watermarks(&mut rng)),
            )
        };
        let Ok(text) = text else { continue };
        let bytes = mutate_json(&text, &mut rng);
        let read = std::panic::catch_unwind(|| {
            if what == "ack" {
                Ack::decode(&bytes).map(|ack| {
                    // What the watcher adds up from an ack.
                    let _ = ack
                        .placed
                        .saturating_add(ack.duplicate)
                        .saturating_add(ack.stale);
                })
            } else {
                serde_json::from_slice::<Vec<FileWatermark>>(&bytes)
                    .map(|_| ())
                    .map_err(|e| flight_server::WireError::Malformed {
                        what: "watermarks",
                        detail: e.to_string(),
                    })
            }
        });
        match read {
            Ok(Ok(())) if what == "ack" => report.acks_read += 1,
            Ok(Ok(())) => report.watermarks_read += 1,
            Ok(Err(_)) => report.refused += 1,
            Err(_) => report.crashers.push(format!(
                "case {case} (seed {seed}): reading {what} {:?} panicked",
                String::from_utf8_lossy(&bytes)
            )),
        }
    }
    report
}
