//! Acknowledgements: what the sinks confirmed, applied to each file (its
//! acknowledged ranges, its seal, its path at the sink).

use std::time::Instant;

use flight_server::{Delivery, RejectedRow, RowKind};

use super::Tailer;
use super::batcher::RowRef;
use super::files::{Finished, Map};

impl Tailer {
    pub(super) fn drain_deliveries(&mut self) {
        while let Ok((sink, delivery)) = self.deliveries.try_recv() {
            if matches!(delivery, Delivery::Acked { .. })
                && let Some(last) = self.sink_last_ack.get_mut(sink)
            {
                *last = Instant::now();
            }
            self.on_delivery(delivery);
        }
    }

    pub(super) fn on_delivery(&mut self, delivery: Delivery) {
        match delivery {
            Delivery::Acked { token, ack } => {
                let Some(rows) = self.outbound.answered(token) else {
                    return;
                };
                let rejected: Map<usize, RejectedRow> =
                    ack.rejected.into_iter().map(|r| (r.row, r)).collect();
                self.progress.add_acked(
                    ack.placed
                        .saturating_add(ack.duplicate)
                        .saturating_add(ack.stale),
                );
                for (index, row) in rows.into_iter().enumerate() {
                    self.on_row_acked(row, rejected.get(&index));
                }
            }
            Delivery::Refused { token, error } => {
                let Some(rows) = self.outbound.answered(token) else {
                    return;
                };
                for row in rows {
                    if let Some(t) = self.files.get_mut(&row.file) {
                        tracing::error!(path = %t.path, offset = row.offset, %error, "the sink refused this file's data; it stays unacknowledged");
                        t.failed = Some(error.clone());
                    }
                }
            }
        }
    }

    pub(super) fn on_row_acked(&mut self, row: RowRef, rejected: Option<&RejectedRow>) {
        let Some(t) = self.files.get_mut(&row.file) else {
            return;
        };
        self.checkpoints.mark(&row.file);
        self.attention.insert(row.file.clone());
        match row.kind {
            RowKind::Data => {
                t.acked.insert(row.offset, row.offset + row.len);
                let acked = t.acked_offset();
                let now = Instant::now();
                while let Some(&(size, seen)) = t.growth.front() {
                    if size > acked {
                        break;
                    }
                    t.growth.pop_front();
                    if let Some(events) = &self.lag_events {
                        events.seen_to_durable(now.duration_since(seen));
                    }
                }
            }
            kind => {
                t.control_in_flight = false;
                if let Some(rejection) = rejected {
                    if rejection.superseded {
                        // A newer generation took this file's place at the
                        // sink (it was replaced at the source): let it go.
                        tracing::info!(path = %t.path, generation = t.generation, "replaced by a newer generation; released");
                        t.sealed = true;
                        t.file = None;
                        return;
                    }
                    tracing::error!(path = %t.path, ?kind, error = %rejection.error, "the sink rejected a control row");
                    if kind != RowKind::Rename {
                        t.failed = Some(rejection.error.clone());
                    }
                    return;
                }
                match kind {
                    RowKind::Open => {
                        t.open_acked = true;
                        let key = row.file.clone();
                        self.mark_ready(&key);
                    }
                    RowKind::Seal if !t.controls.is_empty() => {
                        // Renamed while its seal was on its way: complete at
                        // the sink, but the queued rename must get there
                        // before the file is let go (the rename's
                        // acknowledgement then finishes it).
                        t.rename_only = true;
                        t.file = None;
                        self.progress.add_sealed();
                        tracing::info!(path = %t.path, size = row.offset, "sealed; a rename follows");
                    }
                    RowKind::Seal => {
                        t.sealed = true;
                        t.file = None;
                        self.progress.add_sealed();
                        tracing::info!(path = %t.path, size = row.offset, "sealed");
                        let t = &self.files[&row.file];
                        let done = Finished::of(t, t.mtime_ns);
                        self.files.finish_tracked(done);
                    }
                    RowKind::Rename if t.rename_only && t.controls.is_empty() => {
                        if let Some(path) = row.path {
                            t.sink_path = path;
                        }
                        // A sealed file renamed: nothing else to send.
                        t.sealed = true;
                        t.file = None;
                        let t = &self.files[&row.file];
                        let done = Finished::of(t, t.mtime_ns);
                        self.files.finish_tracked(done);
                    }
                    RowKind::Rename => {
                        if let Some(path) = row.path {
                            t.sink_path = path;
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}
