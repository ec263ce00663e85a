//! Which sink each file goes to when a watcher spreads its files over
//! several: rendezvous hashing of the file's key.

/// The sink a file key goes to: highest hash of (key, sink) wins, so adding
/// or removing a sink moves only the keys that must move.
pub fn rendezvous(key: &str, sinks: &[String]) -> usize {
    let score = |sink: &str| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in key.bytes().chain([0xff]).chain(sink.bytes()) {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        // Finalise so that nearby inputs spread (FNV alone clusters).
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^ (h >> 33)
    };
    (0..sinks.len())
        .max_by_key(|&i| score(&sinks[i]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rendezvous_is_stable_and_spreads() {
        let sinks: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let mut counts = [0usize; 3];
        for i in 0..3000 {
            let key = format!("run1/file-{i}.xtc2");
            let s = rendezvous(&key, &sinks);
            assert_eq!(s, rendezvous(&key, &sinks));
            counts[s] += 1;
        }
        assert!(counts.iter().all(|&c| c > 800), "{counts:?}");
        // Removing a sink moves only its own keys.
        let two = &sinks[..2];
        for i in 0..300 {
            let key = format!("k{i}");
            let before = rendezvous(&key, &sinks);
            if before < 2 {
                assert_eq!(rendezvous(&key, two), before);
            }
        }
    }
}
