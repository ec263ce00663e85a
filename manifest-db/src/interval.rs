//! Owns `IntervalSet`: the set of byte ranges of a file that are durably placed at the sink.
//!
//! Kept as a sorted vector of disjoint half-open ranges with no two ranges touching, so that
//! equal sets always have equal representations (the manifest compares and serialises them).

use serde::{Deserialize, Serialize};

/// Half-open byte intervals [start, end), sorted, non-overlapping, adjacent ones merged.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntervalSet {
    ranges: Vec<(u64, u64)>,
}

impl IntervalSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Builds a set from arbitrary ranges: unsorted, overlapping and empty ones are accepted,
    /// because callers may hand in raw data read from disk or received over the wire.
    pub fn from_ranges(ranges: impl IntoIterator<Item = (u64, u64)>) -> Self {
        let mut raw: Vec<(u64, u64)> = ranges.into_iter().filter(|&(s, e)| s < e).collect();
        raw.sort_unstable();
        let mut out: Vec<(u64, u64)> = Vec::with_capacity(raw.len());
        for (s, e) in raw {
            match out.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => out.push((s, e)),
            }
        }
        Self { ranges: out }
    }

    /// Adds [start, end), merging with every range it overlaps or touches.
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        // First range that could merge: its end reaches `start` (touching counts).
        let lo = self.ranges.partition_point(|&(_, e)| e < start);
        // One past the last range that could merge: its start is at most `end`.
        let hi = self.ranges.partition_point(|&(s, _)| s <= end);
        if lo >= hi {
            self.ranges.insert(lo, (start, end));
            return;
        }
        let merged = (start.min(self.ranges[lo].0), end.max(self.ranges[hi - 1].1));
        self.ranges.splice(lo..hi, std::iter::once(merged));
    }

    /// Sub-ranges of [start, end) not covered by the set, ascending.
    pub fn missing(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        if start >= end {
            return out;
        }
        let mut cursor = start;
        let first = self.ranges.partition_point(|&(_, e)| e <= start);
        for &(s, e) in &self.ranges[first..] {
            if s >= end {
                break;
            }
            if s > cursor {
                out.push((cursor, s));
            }
            cursor = cursor.max(e);
            if cursor >= end {
                break;
            }
        }
        if cursor < end {
            out.push((cursor, end));
        }
        out
    }

    /// True when every byte of [start, end) is in the set; an empty range is always covered.
    pub fn covers(&self, start: u64, end: u64) -> bool {
        if start >= end {
            return true;
        }
        // Ranges never touch, so a covered range must lie inside a single stored range.
        let idx = self.ranges.partition_point(|&(_, e)| e <= start);
        self.ranges
            .get(idx)
            .is_some_and(|&(s, e)| s <= start && end <= e)
    }

    /// End of the range starting at 0, i.e. how far the file is placed without holes; 0 if none.
    pub fn contiguous_end(&self) -> u64 {
        match self.ranges.first() {
            Some(&(0, e)) => e,
            _ => 0,
        }
    }

    pub fn total_len(&self) -> u64 {
        self.ranges.iter().map(|&(s, e)| e - s).sum()
    }

    pub fn ranges(&self) -> &[(u64, u64)] {
        &self.ranges
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// Takes [start, end) out, splitting a range it falls inside of.
    pub fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let lo = self.ranges.partition_point(|&(_, e)| e <= start);
        let hi = self.ranges.partition_point(|&(s, _)| s < end);
        if lo >= hi {
            return;
        }
        let (first, last) = (self.ranges[lo], self.ranges[hi - 1]);
        let left = (first.0 < start).then_some((first.0, start));
        let right = (last.1 > end).then_some((end, last.1));
        self.ranges.splice(lo..hi, left.into_iter().chain(right));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remove_takes_ranges_out_and_splits_what_it_falls_inside_of() {
        let mut set = IntervalSet::from_ranges([(0, 10), (20, 30), (40, 50)]);
        set.remove(5, 25);
        assert_eq!(set.ranges(), [(0, 5), (25, 30), (40, 50)]);
        set.remove(42, 44);
        assert_eq!(set.ranges(), [(0, 5), (25, 30), (40, 42), (44, 50)]);
        set.remove(30, 40);
        assert_eq!(set.ranges(), [(0, 5), (25, 30), (40, 42), (44, 50)]);
        set.remove(0, 100);
        assert!(set.is_empty());
        set.remove(3, 3);
        assert!(set.is_empty());
    }

    #[test]
    fn overlapping_and_adjacent_merge() {
        let mut s = IntervalSet::new();
        s.insert(10, 20);
        s.insert(15, 25);
        assert_eq!(s.ranges(), &[(10, 25)]);
        s.insert(25, 30);
        assert_eq!(s.ranges(), &[(10, 30)]);
        s.insert(5, 10);
        assert_eq!(s.ranges(), &[(5, 30)]);
        s.insert(40, 50);
        assert_eq!(s.ranges(), &[(5, 30), (40, 50)]);
        s.insert(30, 40);
        assert_eq!(s.ranges(), &[(5, 50)]);
        s.insert(7, 8);
        assert_eq!(s.ranges(), &[(5, 50)]);
        s.insert(9, 9);
        assert_eq!(s.ranges(), &[(5, 50)]);
        s.insert(0, 100);
        assert_eq!(s.ranges(), &[(0, 100)]);
        assert_eq!(s.total_len(), 100);
    }

    #[test]
    fn out_of_order_inserts() {
        let mut s = IntervalSet::new();
        for (a, b) in [(60, 70), (0, 10), (30, 40), (20, 25), (90, 100)] {
            s.insert(a, b);
        }
        assert_eq!(
            s.ranges(),
            &[(0, 10), (20, 25), (30, 40), (60, 70), (90, 100)]
        );
        // Spans several ranges and touches one at each end.
        s.insert(10, 60);
        assert_eq!(s.ranges(), &[(0, 70), (90, 100)]);
        assert_eq!(s.contiguous_end(), 70);
        assert_eq!(s.total_len(), 80);
    }

    #[test]
    fn missing_gaps_and_edges() {
        let s = IntervalSet::from_ranges([(10, 20), (30, 40)]);
        assert_eq!(s.missing(0, 50), vec![(0, 10), (20, 30), (40, 50)]);
        assert_eq!(s.missing(10, 40), vec![(20, 30)]);
        assert_eq!(s.missing(12, 18), vec![]);
        assert_eq!(s.missing(15, 35), vec![(20, 30)]);
        assert_eq!(s.missing(20, 30), vec![(20, 30)]);
        assert_eq!(s.missing(40, 45), vec![(40, 45)]);
        assert_eq!(s.missing(0, 10), vec![(0, 10)]);
        assert_eq!(s.missing(5, 5), vec![]);
        assert_eq!(IntervalSet::new().missing(3, 7), vec![(3, 7)]);
        assert!(s.covers(10, 20));
        assert!(s.covers(12, 13));
        assert!(!s.covers(15, 31));
        assert!(!s.covers(9, 11));
        assert!(s.covers(50, 50));
    }

    #[test]
    fn contiguous_end_needs_zero_start() {
        assert_eq!(IntervalSet::new().contiguous_end(), 0);
        assert_eq!(IntervalSet::from_ranges([(1, 5)]).contiguous_end(), 0);
        assert_eq!(
            IntervalSet::from_ranges([(0, 5), (6, 9)]).contiguous_end(),
            5
        );
        assert_eq!(
            IntervalSet::from_ranges([(0, 5), (5, 9)]).contiguous_end(),
            9
        );
    }

    #[test]
    fn from_ranges_normalises() {
        let s = IntervalSet::from_ranges([(30, 40), (5, 5), (0, 10), (8, 12), (12, 15), (50, 40)]);
        assert_eq!(s.ranges(), &[(0, 15), (30, 40)]);
        assert!(IntervalSet::from_ranges([(3, 3)]).is_empty());
        let mut by_insert = IntervalSet::new();
        for (a, b) in [(30, 40), (0, 10), (8, 12), (12, 15)] {
            by_insert.insert(a, b);
        }
        assert_eq!(s, by_insert);
    }

    struct XorShift(u64);
    impl XorShift {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn model_ranges(model: &[bool], from: usize, to: usize, want: bool) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut i = from;
        while i < to {
            if model[i] == want {
                let s = i;
                while i < to && model[i] == want {
                    i += 1;
                }
                out.push((s as u64, i as u64));
            } else {
                i += 1;
            }
        }
        out
    }

    #[test]
    fn randomized_against_bitmap_model() {
        const N: u64 = 200;
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15);
        for _round in 0..200 {
            let mut set = IntervalSet::new();
            let mut model = vec![false; N as usize];
            for _ in 0..rng.below(30) {
                let a = rng.below(N + 1);
                let b = (a + rng.below(20)).min(N);
                set.insert(a, b);
                for bit in &mut model[a as usize..b as usize] {
                    *bit = true;
                }
                assert_eq!(set.ranges(), model_ranges(&model, 0, N as usize, true));
                let total = model.iter().filter(|&&b| b).count() as u64;
                assert_eq!(set.total_len(), total);
                let contiguous = model.iter().take_while(|&&b| b).count() as u64;
                assert_eq!(set.contiguous_end(), contiguous);

                let qs = rng.below(N + 1);
                let qe = (qs + rng.below(N)).min(N);
                let missing = model_ranges(&model, qs as usize, qe as usize, false);
                assert_eq!(set.missing(qs, qe), missing);
                assert_eq!(set.covers(qs, qe), missing.is_empty());
            }
            assert_eq!(IntervalSet::from_ranges(set.ranges().to_vec()), set);
        }
    }
}
