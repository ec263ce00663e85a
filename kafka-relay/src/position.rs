//! Where the relay's events are in the topic, found from the records
//! themselves.
//!
//! Every event record carries two headers: the relay that published it
//! ([`RELAY_HEADER`]: `tailflight-relay.<sink id>`) and its outbox sequence
//! number ([`SEQ_HEADER`]). The relay's [`Mark`], kept in the outbox and
//! replaced in the same write as each removal of published events, says
//! through which event publication is confirmed and from which offset of
//! each partition this relay's later records start. A new client reads the
//! records after the mark back (read_committed: aborted ones are never
//! seen), and the relay goes on after the last event that the topic holds
//! with every event before it ([`contiguous`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// The header naming the relay that published a record.
pub const RELAY_HEADER: &str = "tailflight-relay";
/// The header holding a record's outbox sequence number (decimal).
pub const SEQ_HEADER: &str = "tailflight-seq";

/// The relay's mark: every event through `through` is in `topic`, and the
/// relay's records of later events are at or after `from`'s offset in
/// their partition (a partition it does not name: from its start).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mark {
    pub topic: String,
    pub through: u64,
    pub from: BTreeMap<i32, i64>,
}

impl Mark {
    pub fn encode(&self) -> Vec<u8> {
        // A map of integers and a string: serialising cannot fail.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The mark of `topic` in `bytes`: none if it is another topic's (the
    /// relay was pointed at a new topic) or unreadable.
    pub fn decode(bytes: &[u8], topic: &str) -> Option<Self> {
        match serde_json::from_slice::<Self>(bytes) {
            Ok(mark) if mark.topic == topic => Some(mark),
            Ok(mark) => {
                tracing::info!(
                    old = %mark.topic,
                    new = %topic,
                    "the relay's mark is for another topic: its position in the new one is read \
                     from the brokers"
                );
                None
            }
            Err(error) => {
                tracing::warn!(%error, "the relay's mark is unreadable: ignored");
                None
            }
        }
    }
}

/// The last of `events` (outbox sequence numbers after the mark, in order)
/// such that it and every one before it are in `found`: the relay's
/// position. Events found after a missing one are published again.
pub fn contiguous(after: u64, events: impl IntoIterator<Item = u64>, found: &BTreeSet<u64>) -> u64 {
    let mut position = after;
    for seq in events {
        if !found.contains(&seq) {
            break;
        }
        position = seq;
    }
    position
}

/// The last record a transaction wrote to one partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    pub offset: i64,
    pub seq: u64,
}

/// What reading back the last record of each partition found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// Every one is there, committed.
    Held,
    /// A partition's stable offset has not passed the record yet: the
    /// transaction's markers are still being written.
    NotYetStable { partition: i32, offset: i64 },
    /// A record is not there: its transaction was taken back.
    TakenBack {
        partition: i32,
        offset: i64,
        seq: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_position_stops_before_the_first_event_missing_from_the_topic() {
        let found: BTreeSet<u64> = [4, 5, 7, 9].into();
        // 6 was withdrawn: no event has that number.
        assert_eq!(contiguous(3, [4, 5, 7, 8, 9], &found), 7);
        assert_eq!(contiguous(3, [4, 5, 7], &found), 7);
        assert_eq!(contiguous(3, [], &found), 3);
        assert_eq!(contiguous(3, [10], &found), 3);
    }

    #[test]
    fn a_mark_reads_back_for_its_own_topic_only() {
        let mark = Mark {
            topic: "events".into(),
            through: 42,
            from: [(0, 7), (3, 1200)].into(),
        };
        let bytes = mark.encode();
        assert_eq!(Mark::decode(&bytes, "events"), Some(mark));
        assert_eq!(Mark::decode(&bytes, "other"), None);
        assert_eq!(Mark::decode(b"not json", "events"), None);
    }
}
