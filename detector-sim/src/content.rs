//! Deterministic file content.
//!
//! Every byte of every simulated file is a pure function of (seed, final file name,
//! offset). A receiver can therefore check any range it holds without having seen the
//! rest of the file, the writer's state or the order in which ranges arrived.
//!
//! The file is a sequence of little-endian u64 words; word `i` is the splitmix64 output
//! for state `key + (i + 1) * GAMMA`, where `key` mixes the seed with a hash of the name.
//! Generating consecutive words is one add and the splitmix finaliser per 8 bytes, so
//! filling runs at memory-copy-like speeds and never needs a table.

const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// The splitmix64 finaliser: a bijective mix with full avalanche.
#[inline(always)]
fn finalize(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Per-file key. The name hash and the seed are each mixed before combining so that
/// nearby seeds (0, 1, 2...) or similar names do not yield shifted copies of one stream.
fn file_key(seed: u64, name: &str) -> u64 {
    // FNV-1a: stable across platforms and Rust versions, unlike std's hasher.
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for &b in name.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    finalize(finalize(h).wrapping_add(GAMMA) ^ seed.wrapping_mul(GAMMA))
}

#[inline(always)]
fn word_at(key: u64, index: u64) -> u64 {
    finalize(key.wrapping_add(index.wrapping_add(1).wrapping_mul(GAMMA)))
}

/// Fills `buf` with the bytes at `[offset, offset + buf.len())` of the simulated file
/// whose final name (without ".inprogress") is `name`.
pub fn fill(seed: u64, name: &str, offset: u64, buf: &mut [u8]) {
    let key = file_key(seed, name);
    let mut index = offset / 8;
    let skip = (offset % 8) as usize;
    let mut rest: &mut [u8] = buf;

    if skip != 0 {
        let word = word_at(key, index).to_le_bytes();
        let n = (8 - skip).min(rest.len());
        rest[..n].copy_from_slice(&word[skip..skip + n]);
        rest = &mut rest[n..];
        index = index.wrapping_add(1);
    }

    // `state` is the splitmix state of the word *before* `index`, so each step is one add.
    let mut state = key.wrapping_add(index.wrapping_mul(GAMMA));
    let mut words = rest.chunks_exact_mut(8);
    for out in &mut words {
        state = state.wrapping_add(GAMMA);
        out.copy_from_slice(&finalize(state).to_le_bytes());
    }
    let tail = words.into_remainder();
    if !tail.is_empty() {
        state = state.wrapping_add(GAMMA);
        let word = finalize(state).to_le_bytes();
        let n = tail.len();
        tail.copy_from_slice(&word[..n]);
    }
}

/// Returns the file offset of the first byte of `data` (which claims to be the bytes at
/// `offset` of the file `name`) that differs from what [`fill`] produces, or `None`.
pub fn first_mismatch(seed: u64, name: &str, offset: u64, data: &[u8]) -> Option<u64> {
    // Compare against a small stack buffer: keeps the check allocation-free and lets the
    // common all-equal case run as fill + memcmp.
    const BLOCK: usize = 8192;
    let mut expected = [0u8; BLOCK];
    let mut pos = 0usize;
    for got in data.chunks(BLOCK) {
        let at = offset.wrapping_add(pos as u64);
        let want = &mut expected[..got.len()];
        fill(seed, name, at, want);
        if got != &want[..] {
            let i = got
                .iter()
                .zip(want.iter())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            return Some(at.wrapping_add(i as u64));
        }
        pos += got.len();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen_vec(seed: u64, name: &str, offset: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        fill(seed, name, offset, &mut v);
        v
    }

    #[test]
    fn fill_is_deterministic() {
        let a = gen_vec(7, "r0001-s00-c000.xtc2", 0, 4096);
        let b = gen_vec(7, "r0001-s00-c000.xtc2", 0, 4096);
        assert_eq!(a, b);
    }

    #[test]
    fn fill_is_offset_consistent() {
        let whole = gen_vec(3, "f", 0, 100);
        let suffix = gen_vec(3, "f", 37, 63);
        assert_eq!(&whole[37..], &suffix[..]);

        // Every start and length within a few words, including empty and sub-word buffers.
        let whole = gen_vec(11, "g", 0, 64);
        for start in 0..40usize {
            for len in 0..24usize {
                let part = gen_vec(11, "g", start as u64, len);
                assert_eq!(
                    &whole[start..start + len],
                    &part[..],
                    "start {start} len {len}"
                );
            }
        }
    }

    #[test]
    fn fill_depends_on_seed_and_name() {
        let base = gen_vec(1, "a", 0, 64);
        assert_ne!(base, gen_vec(2, "a", 0, 64));
        assert_ne!(base, gen_vec(1, "b", 0, 64));
        // Nearby seeds must not be shifted copies of each other.
        let s0 = gen_vec(0, "a", 0, 64);
        let s1 = gen_vec(1, "a", 0, 64);
        assert_ne!(&s0[8..], &s1[..56]);
        assert_ne!(&s1[8..], &s0[..56]);
    }

    #[test]
    fn first_mismatch_finds_injected_flip() {
        let offset = 12_345u64;
        let mut data = gen_vec(9, "x.xtc2", offset, 50_000);
        assert_eq!(first_mismatch(9, "x.xtc2", offset, &data), None);
        for &i in &[0usize, 1, 8191, 8192, 20_001, 49_999] {
            data[i] ^= 0x10;
            assert_eq!(
                first_mismatch(9, "x.xtc2", offset, &data),
                Some(offset + i as u64)
            );
            data[i] ^= 0x10;
        }
        // Right bytes claimed at the wrong offset or for the wrong file are caught too.
        assert!(first_mismatch(9, "x.xtc2", offset + 1, &data).is_some());
        assert!(first_mismatch(9, "y.xtc2", offset, &data).is_some());
        assert_eq!(first_mismatch(9, "x.xtc2", offset, &[]), None);
    }

    /// Run with `cargo test -p detector-sim --release -- --ignored --nocapture fill_throughput`
    /// (or without --release to see the project's dev profile).
    #[test]
    #[ignore = "benchmark"]
    fn fill_throughput() {
        let mut buf = vec![0u8; 4 << 20];
        let rounds = 256u64;
        let start = std::time::Instant::now();
        for r in 0..rounds {
            // Odd offsets exercise the unaligned path as the simulator does after splits.
            fill(
                42,
                "r0001-s00-c000.xtc2",
                r * buf.len() as u64 + 3,
                &mut buf,
            );
        }
        let secs = start.elapsed().as_secs_f64();
        let gb = (rounds * buf.len() as u64) as f64 / 1e9;
        println!("fill: {:.2} GB/s ({gb:.2} GB in {secs:.3} s)", gb / secs);

        let start = std::time::Instant::now();
        for r in 0..rounds / 4 {
            let off = r * buf.len() as u64 + 3;
            fill(42, "r0001-s00-c000.xtc2", off, &mut buf);
            assert_eq!(first_mismatch(42, "r0001-s00-c000.xtc2", off, &buf), None);
        }
        let secs = start.elapsed().as_secs_f64();
        let gb = (rounds / 4 * buf.len() as u64) as f64 / 1e9;
        println!(
            "fill + first_mismatch of the same bytes: {:.2} GB/s",
            gb / secs
        );
    }
}
