//! Mutations: what a broken or hostile peer changes in a valid stream.
//!
//! Structure-aware ones work on the [`Plan`] (a path that escapes, an
//! offset near `u64::MAX`, a batch sent twice, a hello for another
//! protocol), so they reach the checks behind decoding; byte-level ones
//! work on the encoded messages (the IPC header's lengths and offsets, the
//! body, non-UTF-8 bytes inside string columns), so they reach decoding
//! itself. Each says what it did, for the crasher's report.

use arrow_flight::FlightData;
use bytes::Bytes;
use flight_server::protocol::encode_seq;
use rand::Rng;
use rand::rngs::SmallRng;

use crate::plan::{Batch, Columns, Plan, Row, SOURCES, SchemaMessage, hello, other_schema};

/// Marks a string column's bytes so that a byte-level mutation can find
/// them in the encoded body and make them invalid UTF-8.
pub const UTF8_MARK: &str = "\u{1}MARK\u{1}";

/// Paths (and file keys, which are paths until an Open says otherwise) a
/// peer might try to escape the root or confuse the sink with.
const HOSTILE_PATHS: &[&str] = &[
    "",
    ".",
    "..",
    "../escape",
    "../../../../../../tmp/escape",
    "a/../../escape",
    "a/./../../escape",
    "/tmp/escape",
    "//escape",
    "/",
    "a/",
    "a//b",
    "./a",
    "a/.",
    "a/..",
    "a\0b",
    "\0",
    "..\\escape",
    "C:\\escape",
    "a\nb",
    "run/\u{202e}gnp.exe",
    "e\u{301}\u{301}\u{301}",
    "🦀/🦀/🦀",
    "\u{feff}bom",
    "a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q/r/s/t/u/v/w/x/y/z",
    "CON",
    "state",
    ".tailflight",
];

fn hostile_path(rng: &mut SmallRng) -> String {
    match rng.random_range(0..6u32) {
        0 => "x".repeat(rng.random_range(250..260)),
        1 => format!("{}/y", "x".repeat(256)),
        2 => "d/".repeat(rng.random_range(100..2100)),
        3 => format!("outside{}", UTF8_MARK),
        _ => HOSTILE_PATHS[rng.random_range(0..HOSTILE_PATHS.len())].to_owned(),
    }
}

fn extreme_u64(rng: &mut SmallRng, near: u64) -> u64 {
    match rng.random_range(0..10u32) {
        0 => u64::MAX,
        1 => u64::MAX - near,
        2 => u64::MAX - near.saturating_sub(1),
        3 => 1 << 63,
        4 => i64::MAX as u64,
        5 => (i64::MAX as u64) + 1,
        6 => 1 << 40,
        7 => 0,
        8 => near.wrapping_add(1),
        _ => rng.random(),
    }
}

/// Applies one structure-aware mutation to `plan`; returns what it did.
pub fn structure(plan: &mut Plan, rng: &mut SmallRng) -> String {
    let batches = plan.batches.len();
    let pick_row = |plan: &mut Plan, rng: &mut SmallRng| -> Option<(usize, usize)> {
        let candidates: Vec<(usize, usize)> = plan
            .batches
            .iter()
            .enumerate()
            .flat_map(|(b, batch)| (0..batch.rows.len()).map(move |r| (b, r)))
            .collect();
        (!candidates.is_empty()).then(|| candidates[rng.random_range(0..candidates.len())])
    };
    match rng.random_range(0..22u32) {
        0 => {
            plan.hello = None;
            "no descriptor on the first message".into()
        }
        1 => {
            let garbage: Vec<u8> = (0..rng.random_range(0..64)).map(|_| rng.random()).collect();
            plan.hello = Some(garbage);
            "a hello of random bytes".into()
        }
        2 => {
            let hellos = [
                serde_json::json!({ "protocol": 2, "source": "det-a" }),
                serde_json::json!({ "protocol": 1 }),
                serde_json::json!({ "source": "det-a" }),
                serde_json::json!({ "protocol": -1, "source": "det-a" }),
                serde_json::json!({ "protocol": 1, "source": 7 }),
                serde_json::json!({ "protocol": 1, "source": "det-a", "extra": [1, 2] }),
                serde_json::json!([1, "det-a"]),
                serde_json::json!(null),
            ];
            let pick = hellos[rng.random_range(0..hellos.len())].clone();
            plan.hello = Some(pick.to_string().into_bytes());
            format!("hello {pick}")
        }
        3 => {
            let source = match rng.random_range(0..4u32) {
                0 => "s".repeat(rng.random_range(200..70_000)),
                _ => hostile_path(rng),
            };
            plan.hello = Some(hello(&source));
            format!("source {:?}", truncated(&source))
        }
        4 => {
            plan.schema = SchemaMessage::Missing;
            "no schema message".into()
        }
        5 => {
            plan.schema = SchemaMessage::Other(other_schema(rng));
            "another schema".into()
        }
        6 => {
            let Some((b, r)) = pick_row(plan, rng) else {
                return "nothing to mutate".into();
            };
            let path = hostile_path(rng);
            let row = &mut plan.batches[b].rows[r];
            let note = format!("row {b}.{r} file_key {:?}", truncated(&path));
            row.file_key = path;
            note
        }
        7 => {
            let Some((b, r)) = pick_row(plan, rng) else {
                return "nothing to mutate".into();
            };
            let path = hostile_path(rng);
            let row = &mut plan.batches[b].rows[r];
            if row.kind == 0 {
                row.kind = if rng.random_bool(0.5) { 1 } else { 2 };
                row.data.clear();
                row.crc32c = 0;
            }
            let note = format!("row {b}.{r} kind {} path {:?}", row.kind, truncated(&path));
            row.path = Some(path);
            note
        }
        8 => {
            let Some((b, r)) = pick_row(plan, rng) else {
                return "nothing to mutate".into();
            };
            let row = &mut plan.batches[b].rows[r];
            row.offset = extreme_u64(rng, row.data.len() as u64);
            format!("row {b}.{r} offset {}", row.offset)
        }
        9 => {
            let Some((b, r)) = pick_row(plan, rng) else {
                return "nothing to mutate".into();
            };
            let row = &mut plan.batches[b].rows[r];
            row.generation = extreme_u64(rng, 1);
            format!("row {b}.{r} generation {}", row.generation)
        }
        10 => {
            let Some((b, r)) = pick_row(plan, rng) else {
                return "nothing to mutate".into();
            };
            let row = &mut plan.batches[b].rows[r];
            row.kind = rng.random();
            format!("row {b}.{r} kind {}", row.kind)
        }
        11 => {
            let Some((b, r)) = pick_row(plan, rng) else {
                return "nothing to mutate".into();
            };
            let row = &mut plan.batches[b].rows[r];
            if row.kind == 0 && rng.random_bool(0.5) {
                row.crc32c ^= 1 << rng.random_range(0..32);
                format!("row {b}.{r} crc32c wrong")
            } else {
                row.data = vec![0xAB; rng.random_range(1..100)];
                format!("row {b}.{r} kind {} with data", row.kind)
            }
        }
        12 if batches > 0 => {
            let b = rng.random_range(0..batches);
            let seq = &mut plan.batches[b].app_metadata;
            let note = match rng.random_range(0..5u32) {
                0 => {
                    seq.clear();
                    "no sequence number"
                }
                1 => {
                    seq.truncate(7);
                    "a 7-byte sequence number"
                }
                2 => {
                    seq.extend_from_slice(b"more");
                    "a 12-byte sequence number"
                }
                3 => {
                    *seq = encode_seq(u64::MAX).to_vec();
                    "sequence number u64::MAX"
                }
                _ => {
                    *seq = encode_seq(1).to_vec();
                    "sequence number 1 again"
                }
            };
            format!("batch {b}: {note}")
        }
        13 if batches > 0 => {
            let b = rng.random_range(0..batches);
            let copy = plan.batches[b].clone();
            let at = rng.random_range(b..=batches);
            plan.batches.insert(at, copy);
            format!("batch {b} sent again at {at} (a re-delivery)")
        }
        14 if batches > 1 => {
            let b = rng.random_range(0..batches - 1);
            plan.batches.swap(b, b + 1);
            format!("batches {b} and {} swapped", b + 1)
        }
        15 if batches > 0 => {
            let b = rng.random_range(0..batches);
            plan.batches.remove(b);
            format!("batch {b} left out (a gap)")
        }
        16 if batches > 0 => {
            let b = rng.random_range(0..batches);
            plan.batches[b].columns = Columns::NullsInRequired;
            format!("batch {b} with nulls in required columns")
        }
        17 => {
            // Two rows writing different bytes at one offset of one file.
            let Some((b, r)) = pick_row(plan, rng) else {
                return "nothing to mutate".into();
            };
            let mut twin = plan.batches[b].rows[r].clone();
            if twin.kind != 0 {
                return "nothing to mutate".into();
            }
            twin.data.iter_mut().for_each(|byte| *byte ^= 0x5A);
            twin.crc32c = flight_server::checksum::crc32c(&twin.data);
            plan.batches[b].rows.push(twin);
            format!("row {b}.{r} again with other bytes")
        }
        18 => {
            let Some((b, r)) = pick_row(plan, rng) else {
                return "nothing to mutate".into();
            };
            let row = &mut plan.batches[b].rows[r];
            row.kind = 3;
            row.data.clear();
            row.offset = extreme_u64(rng, 0);
            let digests = [
                "crc64nvme:0000000000000000",
                "crc64nvme:zz",
                "crc64nvme:",
                "blake3:00",
                "md5:d41d8cd98f00b204e9800998ecf8427e",
                "",
                "crc64nvme:ffffffffffffffffffffffffffffffffffff",
            ];
            row.digest = Some(digests[rng.random_range(0..digests.len())].to_owned());
            format!(
                "row {b}.{r} a seal of size {} digest {:?}",
                row.offset, row.digest
            )
        }
        19 => {
            // A file and a directory under one name: "p" and "p/q".
            let Some((b, _)) = pick_row(plan, rng) else {
                return "nothing to mutate".into();
            };
            let base = format!("clash{}", rng.random_range(0..4u32));
            let mut first = Row::data(&base, 1, 0, b"file".to_vec());
            first.path = None;
            let second = Row::data(&format!("{base}/inner"), 1, 0, b"under".to_vec());
            let rows = &mut plan.batches[b].rows;
            if rng.random_bool(0.5) {
                rows.push(first);
                rows.push(second);
            } else {
                rows.push(second);
                rows.push(first);
            }
            format!("batch {b}: {base} as a file and as a directory")
        }
        20 => {
            // Many tiny rows in one batch.
            let rows: Vec<Row> = (0..rng.random_range(1_000..20_000u64))
                .map(|i| Row::data("many", 1, i, vec![i as u8]))
                .collect();
            plan.batches.push(Batch {
                rows,
                app_metadata: encode_seq(plan.batches.len() as u64 + 1).to_vec(),
                columns: Columns::Range,
            });
            "a batch of thousands of one-byte rows".into()
        }
        _ => {
            let source = SOURCES[rng.random_range(0..SOURCES.len())];
            plan.hello = Some(hello(source));
            let Some((b, r)) = pick_row(plan, rng) else {
                return "nothing to mutate".into();
            };
            let row = &mut plan.batches[b].rows[r];
            row.file_key = format!("k0-{}", rng.random_range(0..3u32));
            format!("row {b}.{r} writes into another case's file")
        }
    }
}

/// Applies one byte-level mutation to the encoded `messages`.
pub fn bytes(messages: &mut [FlightData], rng: &mut SmallRng) -> String {
    if messages.is_empty() {
        return "nothing to mutate".into();
    }
    let m = rng.random_range(0..messages.len());
    let message = &mut messages[m];
    match rng.random_range(0..9u32) {
        0 => {
            let flips = rng.random_range(1..=8);
            message.data_header = flip(&message.data_header, flips, rng);
            format!("message {m}: {flips} header bytes flipped")
        }
        1 => {
            let flips = rng.random_range(1..=8);
            message.data_body = flip(&message.data_body, flips, rng);
            format!("message {m}: {flips} body bytes flipped")
        }
        2 => {
            let len = message.data_body.len();
            let keep = if len == 0 {
                0
            } else {
                rng.random_range(0..len)
            };
            message.data_body = message.data_body.slice(..keep);
            format!("message {m}: body cut from {len} to {keep} bytes")
        }
        3 => {
            let len = message.data_header.len();
            let keep = if len == 0 {
                0
            } else {
                rng.random_range(0..len)
            };
            message.data_header = message.data_header.slice(..keep);
            format!("message {m}: header cut from {len} to {keep} bytes")
        }
        4 => {
            // The IPC header's lengths and offsets are little-endian i64s:
            // overwrite one that matches a small count with an extreme one.
            let header = message.data_header.to_vec();
            let spots: Vec<usize> = (0..header.len().saturating_sub(7))
                .filter(|&i| {
                    let value = i64::from_le_bytes(header[i..i + 8].try_into().unwrap_or([0; 8]));
                    (1..=1 << 24).contains(&value) && i % 8 == 0
                })
                .collect();
            if spots.is_empty() {
                return format!("message {m}: no length in its header");
            }
            let at = spots[rng.random_range(0..spots.len())];
            let extreme: i64 = match rng.random_range(0..6u32) {
                0 => i64::MAX,
                1 => i64::MIN,
                2 => -1,
                3 => 1 << 40,
                4 => {
                    let old = i64::from_le_bytes(header[at..at + 8].try_into().unwrap_or([0; 8]));
                    old + rng.random_range(1..64)
                }
                _ => 0,
            };
            let mut header = header;
            header[at..at + 8].copy_from_slice(&extreme.to_le_bytes());
            message.data_header = Bytes::from(header);
            format!("message {m}: header length at byte {at} set to {extreme}")
        }
        5 => {
            // Marked strings in the body become invalid UTF-8.
            let body = message.data_body.to_vec();
            let mark = UTF8_MARK.as_bytes();
            let Some(at) = body.windows(mark.len()).position(|w| w == mark) else {
                return format!("message {m}: no marked string");
            };
            let mut body = body;
            body[at + 1] = 0xFF;
            body[at + 2] = 0xC0;
            message.data_body = Bytes::from(body);
            format!("message {m}: a string made invalid UTF-8")
        }
        6 => {
            let extra: Vec<u8> = (0..rng.random_range(1..4096))
                .map(|_| rng.random())
                .collect();
            let mut body = message.data_body.to_vec();
            body.extend(extra);
            message.data_body = Bytes::from(body);
            format!("message {m}: random bytes after the body")
        }
        7 => {
            let garbage: Vec<u8> = (0..rng.random_range(0..512))
                .map(|_| rng.random())
                .collect();
            message.data_header = Bytes::from(garbage);
            format!("message {m}: a header of random bytes")
        }
        _ => {
            let flips = rng.random_range(1..=4);
            message.app_metadata = flip(&message.app_metadata, flips, rng);
            format!("message {m}: app_metadata bytes flipped")
        }
    }
}

fn flip(bytes: &Bytes, flips: usize, rng: &mut SmallRng) -> Bytes {
    if bytes.is_empty() {
        return bytes.clone();
    }
    let mut owned = bytes.to_vec();
    for _ in 0..flips {
        let at = rng.random_range(0..owned.len());
        owned[at] = match rng.random_range(0..4u32) {
            0 => 0,
            1 => 0xFF,
            2 => owned[at] ^ (1 << rng.random_range(0..8)),
            _ => rng.random(),
        };
    }
    Bytes::from(owned)
}

fn truncated(text: &str) -> String {
    text.chars().take(40).collect()
}
