//! The sink manifest's event outbox ("outbox"): events recorded with their
//! commits (see [`crate::SinkCommit::outbox`]), read in order by a relay
//! and removed once published. Keyed by sequence number (u64 BE); a value
//! is `journal round (u64 BE), recorded ms (u64 BE), key length (u32 BE),
//! key, payload`. The newest sequence number is kept in the counters, so
//! numbers are never reused. Beside them, the relay's mark: an opaque value
//! of the relay's (where its published events can be found), written with
//! each removal so that the two never disagree.

use rocksdb::WriteBatch;

use crate::sink::{CF_COUNTERS, CF_OUTBOX, KEY_OUTBOX_LAST, KEY_RELAY_MARK};
use crate::store::decode_u64;
use crate::{OutboxEvent, Result, SinkManifest};

/// What the outbox holds: events recorded and not yet published.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutboxDepth {
    pub events: u64,
    pub bytes: u64,
    /// When the oldest of them was recorded (ms since the Unix epoch).
    pub oldest_unix_ms: Option<u64>,
}

impl SinkManifest {
    /// The sequence number of the newest outbox event recorded (0: none ever).
    pub fn outbox_last(&self) -> Result<u64> {
        self.read_counter(KEY_OUTBOX_LAST)
    }

    /// Outbox events after sequence number `after`, in order: at most
    /// `limit`, and no more once `byte_limit` bytes are read.
    pub fn outbox_after(
        &self,
        after: u64,
        limit: usize,
        byte_limit: usize,
    ) -> Result<Vec<(u64, OutboxEvent)>> {
        let Some(start) = after.checked_add(1) else {
            return Ok(Vec::new());
        };
        let store = self.store();
        store
            .scan_from(
                CF_OUTBOX,
                &start.to_be_bytes(),
                limit,
                byte_limit,
                "read the outbox",
            )?
            .into_iter()
            .map(|(key, value)| {
                let seq = decode_u64(&key)
                    .ok_or_else(|| store.corrupt(CF_OUTBOX, &key, "key is not a u64"))?;
                let event = OutboxEvent::decode(&value)
                    .ok_or_else(|| store.corrupt(CF_OUTBOX, &key, "truncated event"))?;
                Ok((seq, event))
            })
            .collect()
    }

    /// Removes the outbox events after `after` up to and including `seq`
    /// (published; none is left at or below `after`) and returns the
    /// bytes they took. Not synced unless asked: should a crash bring some
    /// back, the relay finds them in the topic from its mark.
    ///
    /// With a `mark`, the relay's mark is replaced in the same write: a
    /// crash keeps both or neither. `sync`: durable before it returns.
    pub fn outbox_remove(
        &self,
        after: u64,
        seq: u64,
        mark: Option<&[u8]>,
        sync: bool,
    ) -> Result<u64> {
        let from = after.saturating_add(1).to_be_bytes();
        let end = seq.saturating_add(1).to_be_bytes();
        let store = self.store();
        let bytes = if seq > after {
            store
                .sum_values(CF_OUTBOX, &from, &end, "size published events")?
                .1
        } else {
            0
        };
        let mut batch = WriteBatch::default();
        if seq > after {
            batch.delete_range_cf(store.cf(CF_OUTBOX)?, from, end);
        }
        if let Some(mark) = mark {
            batch.put_cf(store.cf(CF_COUNTERS)?, KEY_RELAY_MARK, mark);
        }
        store.write(batch, sync, "remove published events from the outbox")?;
        Ok(bytes)
    }

    /// The relay's mark, as last written with [`Self::outbox_remove`].
    pub fn outbox_mark(&self) -> Result<Option<Vec<u8>>> {
        self.store()
            .get(CF_COUNTERS, KEY_RELAY_MARK, "read the relay's mark")
    }

    /// What the outbox holds (a scan of it, keeping nothing: at startup).
    pub fn outbox_depth(&self) -> Result<OutboxDepth> {
        let (events, bytes) = self.store().sum_values(
            CF_OUTBOX,
            &0u64.to_be_bytes(),
            &u64::MAX.to_be_bytes(),
            "scan the outbox",
        )?;
        let oldest_unix_ms = self
            .outbox_after(0, 1, 0)?
            .first()
            .map(|(_, event)| event.recorded_unix_ms);
        Ok(OutboxDepth {
            events,
            bytes,
            oldest_unix_ms,
        })
    }
}
