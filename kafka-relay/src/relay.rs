//! The relay's state machine: each pass connects a client, finds the
//! position from what the topic holds, publishes the outbox after it in
//! transactions, confirms them by reading their last records back and
//! only then withdraws them from the outbox; after any failure the next
//! pass starts over from what the brokers confirm.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::brokers::{Brokers, EventLog, Publisher, Reader};
use crate::client::{CALL_TIMEOUT, Lap, TRANSACTION_BUDGET};
use crate::position::{self, Check, Mark, Written};
use crate::worker::{CallError, Live, Pending, Worker};

/// Events per transaction at most, and their bytes.
const BATCH_EVENTS: usize = 2000;
const BATCH_BYTES: usize = 4 << 20;
/// A call on the client that has not returned by then is abandoned: each
/// librdkafka call has a timeout of its own ([`CALL_TIMEOUT`]), and a
/// transaction a budget ([`TRANSACTION_BUDGET`]); only a call that ignores
/// them gets here.
const ABANDON_AFTER: Duration = TRANSACTION_BUDGET.saturating_add(Duration::from_secs(15));
/// The same for a client's start: six calls in a row, each with its
/// [`CALL_TIMEOUT`].
const START_ABANDON_AFTER: Duration = Duration::from_secs(90);
/// The same for reading the relay's records back at a start: it reads
/// every record since the mark, other producers' too, and fails on its own
/// once it stops moving for [`CALL_TIMEOUT`].
const SCAN_ABANDON_AFTER: Duration = Duration::from_secs(600);
/// How long a stopping relay waits for the abort of a transaction under
/// way, so read_committed readers need not wait for its timeout.
const ABORT_ON_STOP: Duration = Duration::from_secs(5);
/// Abandoned clients still inside a call (producers and read-back
/// consumers alike) at most before a new connection starts: each holds
/// librdkafka's threads and buffers.
const MAX_LIVE_CLIENTS: usize = 4;
/// While publishing, a read-back of the last records begins after the
/// first transaction this long after the last one began (and one runs
/// whenever there is nothing left to publish): events leave the outbox only
/// once the brokers confirm them.
const CONFIRM_EVERY: Duration = Duration::from_secs(1);
/// A record whose partition is not stable past it this long after its
/// transaction was acknowledged (markers a broker skipped) is given up on:
/// the next client's fence ends it, as aborted.
const STABLE_WITHIN: Duration = CALL_TIMEOUT;
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(10);
/// One warning per this long while the relay keeps failing.
const WARN_EVERY: Duration = Duration::from_secs(30);

pub(crate) struct Relay<B: Brokers> {
    outbox: Arc<dyn EventLog>,
    topic: String,
    brokers: B,
    stop: Arc<AtomicBool>,
    live: Live,
    /// The newest event of a transaction whose position this run read back.
    confirmed: Option<u64>,
    last_warning: Option<Instant>,
    failures_unwarned: u64,
}

/// The relay's clients, each on its worker thread: the producer, and the
/// consumer that reads back beside it.
struct Connection<B: Brokers> {
    client: Worker<B::Publisher>,
    read_back: Worker<B::Reader>,
}

/// Whether a confirmation waits for its read-back.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Confirm {
    /// Nothing is left to publish: waits for the read-back under way, then
    /// reads back every transaction acknowledged since.
    Now,
    /// While publishing: takes the read-back's answer if it is there, and
    /// begins the next read-back once [`CONFIRM_EVERY`] has passed.
    Beside,
}

/// A read-back on the [`Reader`]'s worker: what it found, how long it took
/// (µs), and when it answered.
type ReadingBack = Pending<anyhow::Result<(Check, u64, Instant)>>;

/// What one confirmation reads back, and what it then confirms.
struct Confirming {
    written: BTreeMap<i32, Written>,
    /// `next_after` and `acknowledged` when it began.
    through: u64,
    acknowledged: u64,
    since: Instant,
    /// The read-back under way; none between the tries of a record whose
    /// partition was not stable yet.
    check: Option<ReadingBack>,
}

/// Where publication stands between the relay and the brokers.
struct Position {
    /// Events are read after this one: the last published, or the last
    /// number of a gap with no events.
    next_after: u64,
    /// The last event of the last transaction the brokers acknowledged.
    acknowledged: u64,
    /// The last record of each partition written by transactions
    /// acknowledged since the last confirmation began.
    unconfirmed: BTreeMap<i32, Written>,
    /// The confirmation under way: fixed when it begins, so that the
    /// transactions published while it waits for a stable offset do not
    /// move what it waits for.
    confirming: Option<Confirming>,
    /// Where this relay's records after the confirmed ones start (the mark).
    from: BTreeMap<i32, i64>,
    /// When the last read-back began (or the connection was made).
    confirmed_at: Instant,
}

impl<B: Brokers> Relay<B> {
    pub(crate) fn new(
        outbox: Arc<dyn EventLog>,
        topic: String,
        brokers: B,
        stop: Arc<AtomicBool>,
    ) -> Self {
        Self {
            outbox,
            topic,
            brokers,
            stop,
            live: Live::default(),
            confirmed: None,
            last_warning: None,
            failures_unwarned: 0,
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Runs until the sink stops: each pass makes a client, and publishes
    /// with it until anything fails; then the client goes (abandoned if
    /// stuck in a call) and the next pass starts from the position the
    /// brokers confirm. It never stops for good.
    pub(crate) fn run(mut self) {
        let mut backoff = BACKOFF_MIN;
        let mut first = true;
        while !self.stopping() {
            let stuck = self.live.count();
            if stuck >= MAX_LIVE_CLIENTS {
                self.failing(format!(
                    "{stuck} earlier Kafka clients are still inside librdkafka calls they were \
                     abandoned in; a new one starts once one of them returns"
                ));
                sleep_unless_stopped(BACKOFF_MAX, &self.stop);
                continue;
            }
            if !first {
                self.outbox.report(&mut |report| report.restarts += 1);
            }
            first = false;
            self.outbox.waiting_for_brokers(true);
            let connected = self.connect();
            self.outbox.waiting_for_brokers(false);
            let reason = match connected {
                Ok((mut connection, position)) => {
                    let (published_any, reason) = self.publish(&mut connection, position);
                    if published_any {
                        backoff = BACKOFF_MIN;
                    }
                    // Ends what the failed (or stopped) transaction left
                    // open, so read_committed readers and the next client
                    // need not wait for its timeout.
                    let deadline = if self.stopping() {
                        ABORT_ON_STOP
                    } else {
                        CALL_TIMEOUT * 2
                    };
                    let never = AtomicBool::new(false);
                    match connection
                        .client
                        .call("aborting", deadline, &never, |c| c.abort())
                    {
                        Ok(Ok(())) => {}
                        Ok(Err(error)) => tracing::debug!(error = %format!("{error:#}"), "abort"),
                        Err(error) => tracing::debug!(%error, "abort"),
                    }
                    reason
                }
                Err(reason) => reason,
            };
            if self.stopping() {
                break;
            }
            self.failing(reason.clone());
            let stuck = self.live.count();
            self.outbox.report(&mut |report| {
                report.last_restart_reason = Some(reason.clone());
                report.stuck_clients = stuck as u64;
            });
            // Two relays sharing an id would fence each other in a hot
            // loop without the backoff.
            sleep_unless_stopped(backoff, &self.stop);
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
    }

    /// A client whose transactions are ready, and the relay's position: the
    /// newest outbox event the topic holds with every one before it.
    fn connect(&mut self) -> Result<(Connection<B>, Position), String> {
        let (client, read_back) = self.brokers.connect().map_err(|e| format!("{e:#}"))?;
        let mut connection = Connection {
            client: Worker::spawn("kafka-client", client, &self.live)
                .map_err(|e| format!("starting the Kafka client's thread: {e}"))?,
            read_back: Worker::spawn("kafka-read-back", read_back, &self.live)
                .map_err(|e| format!("starting the Kafka read-back's thread: {e}"))?,
        };
        let mark = self
            .outbox
            .mark()
            .map_err(|e| e.to_string())?
            .and_then(|bytes| Mark::decode(&bytes, &self.topic));
        let with_group = mark.is_none();
        let fenced = connection
            .client
            .call(
                "starting transactions",
                START_ABANDON_AFTER,
                &self.stop,
                move |client: &mut B::Publisher| client.start(with_group),
            )
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("{e:#}"))?;
        let position = self.position_at_start(&mut connection, mark, &fenced)?;
        // Every later record of this relay comes after the fence's.
        let from: BTreeMap<i32, i64> = fenced
            .iter()
            .map(|(&partition, &fence)| (partition, fence + 1))
            .collect();
        let mark = Mark {
            topic: self.topic.clone(),
            through: position,
            from: from.clone(),
        };
        // Synced: without it, a machine's crash could leave no mark at all
        // (on the first start) and the next start would publish again
        // what this client publishes.
        self.outbox
            .published(position, Some(&mark.encode()), true)
            .map_err(|e| format!("removing events the topic already holds: {e}"))?;
        // Less this connection's two.
        let stuck = self.live.count().saturating_sub(2);
        self.outbox.report(&mut |report| {
            report.state = "publishing".into();
            report.error = None;
            report.stuck_clients = stuck as u64;
        });
        tracing::info!(
            brokers = %self.brokers.describe(),
            topic = %self.topic,
            position,
            "the Kafka relay is connected; publishing the outbox after its position"
        );
        Ok((
            connection,
            Position {
                next_after: position,
                acknowledged: position,
                unconfirmed: BTreeMap::new(),
                confirming: None,
                from,
                confirmed_at: Instant::now(),
            },
        ))
    }

    /// The relay's position as the topic shows it after the fence: read
    /// from the relay's records after its `mark`, or without one from the
    /// group where a relay before the record headers kept it.
    fn position_at_start(
        &self,
        connection: &mut Connection<B>,
        mark: Option<Mark>,
        fenced: &BTreeMap<i32, i64>,
    ) -> Result<u64, String> {
        let recorded = self.outbox.durable_through();
        let position = match mark {
            None => connection
                .client
                .call(
                    "reading the relay's position",
                    ABANDON_AFTER,
                    &self.stop,
                    |client| client.read_position(),
                )
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("{e:#}"))?,
            Some(mark) => {
                let (from, fence) = (mark.from.clone(), fenced.clone());
                let found = connection
                    .client
                    .call(
                        "reading the relay's records back",
                        SCAN_ABANDON_AFTER,
                        &self.stop,
                        move |client| client.scan(&from, &fence),
                    )
                    .map_err(|e| e.to_string())?
                    .map_err(|e| format!("{e:#}"))?;
                if let Some(&newest) = found.last()
                    && newest > recorded
                {
                    return Err(self.ahead_of_outbox(newest, recorded));
                }
                let position = self.contiguous(mark.through, &found)?;
                if found.last().is_some_and(|newest| *newest > position) {
                    tracing::warn!(
                        position,
                        newest = found.last().copied(),
                        "the topic holds events of this relay after one it does not hold (a \
                         transaction that brokers committed in some partitions only): they are \
                         published again, so consumers see them twice (same ids)"
                    );
                }
                position
            }
        };
        if position > recorded {
            return Err(self.ahead_of_outbox(position, recorded));
        }
        if let Some(confirmed) = self.confirmed.filter(|confirmed| position < *confirmed) {
            // Only a broker that takes back what it confirmed gets here;
            // the events are gone from the outbox.
            tracing::error!(
                position,
                confirmed,
                "the brokers no longer hold events of a transaction they had confirmed: the \
                 events after it, no longer in the outbox, are missing from the topic"
            );
        }
        Ok(position)
    }

    fn ahead_of_outbox(&self, position: u64, recorded: u64) -> String {
        format!(
            "the topic says this sink published through event {position}, but its outbox has \
             only recorded {recorded}: a state directory restored from an older copy, or another \
             sink with the same --sink-id ({}); nothing is published until that is resolved",
            self.outbox.sink_id()
        )
    }

    /// The last outbox event after `after` that is in `found` with every
    /// one between them (see [`position::contiguous`]).
    fn contiguous(
        &self,
        after: u64,
        found: &std::collections::BTreeSet<u64>,
    ) -> Result<u64, String> {
        let Some(&newest) = found.last() else {
            return Ok(after);
        };
        let mut position = after;
        loop {
            let events = self
                .outbox
                .read(position, BATCH_EVENTS, BATCH_BYTES)
                .map_err(|e| e.to_string())?;
            let Some(last) = events.last().map(|event| event.seq) else {
                return Ok(position);
            };
            let reached = position::contiguous(position, events.iter().map(|e| e.seq), found);
            if reached < last || reached >= newest {
                return Ok(reached);
            }
            position = reached;
        }
    }

    /// Publishes until a call fails or the sink stops. Returns whether
    /// anything was published, and why it ended.
    fn publish(
        &mut self,
        connection: &mut Connection<B>,
        mut position: Position,
    ) -> (bool, String) {
        let mut published_any = false;
        let mut idle_reported = false;
        while !self.stopping() {
            // Taken before the read: what becomes durable after it is read
            // next time, never skipped.
            let durable = self.outbox.durable_through();
            let mut lap = Lap(Instant::now());
            let events = match self
                .outbox
                .read(position.next_after, BATCH_EVENTS, BATCH_BYTES)
            {
                Ok(events) => events,
                Err(error) => return (published_any, format!("{error}")),
            };
            let Some(last) = events.last().map(|event| event.seq) else {
                // Events a withdrawal removed leave numbers no event has:
                // nothing to publish up to what was durable at the read.
                position.next_after = position.next_after.max(durable);
                if (position.next_after > self.outbox.published_through()
                    || !position.unconfirmed.is_empty()
                    || position.confirming.is_some())
                    && let Err(reason) = self.confirm(connection, &mut position, Confirm::Now)
                {
                    return (published_any, reason);
                }
                if !idle_reported {
                    self.outbox.report(&mut |report| {
                        report.state = "idle".into();
                        report.error = None;
                    });
                    idle_reported = true;
                }
                self.outbox
                    .wait_beyond(position.next_after, Duration::from_millis(500));
                continue;
            };
            idle_reported = false;
            let read_us = lap.next();
            let now_ms = unix_ms();
            let waited_us = events
                .iter()
                .map(|event| event.recorded_unix_ms)
                .min()
                .map_or(0, |oldest| now_ms.saturating_sub(oldest) * 1000);
            let count = events.len() as u64;
            let stop = self.stop.clone();
            self.outbox.waiting_for_brokers(true);
            let published = connection.client.call(
                "publishing a transaction",
                ABANDON_AFTER,
                &self.stop,
                move |client| client.transaction(&events, &stop),
            );
            self.outbox.waiting_for_brokers(false);
            match published {
                Ok(Ok((phases, written))) => {
                    position.next_after = last;
                    position.acknowledged = last;
                    position.unconfirmed.extend(written);
                    published_any = true;
                    let now_ms = unix_ms();
                    self.outbox.report(&mut |report| {
                        report.state = "publishing".into();
                        report.error = None;
                        report.published_events += count;
                        report.last_published_unix_ms = Some(now_ms);
                        report.transactions += 1;
                        let sum = &mut report.phase_us;
                        sum.waited += waited_us;
                        sum.read += read_us;
                        sum.begin += phases.begin;
                        sum.produce += phases.produce;
                        sum.deliver += phases.deliver;
                        sum.commit += phases.commit;
                    });
                    if self.failures_unwarned > 0 || self.last_warning.is_some() {
                        tracing::info!("the Kafka relay publishes again");
                        self.last_warning = None;
                        self.failures_unwarned = 0;
                    }
                }
                Ok(Err(error)) => return (published_any, format!("{error:#}")),
                Err(error) => return (published_any, error.to_string()),
            }
            if let Err(reason) = self.confirm(connection, &mut position, Confirm::Beside) {
                return (published_any, reason);
            }
        }
        (published_any, "the sink is stopping".into())
    }

    /// Reads back, on the read-back's worker, the last record each
    /// partition got from the transactions acknowledged since the last
    /// read-back began and, once every one is there, removes their events
    /// from the outbox, with the new mark. A record not there means the
    /// brokers took its transaction back: the relay starts again from what
    /// the topic holds. A partition not yet stable past its record is read
    /// again at the next confirmation, and given up on after
    /// [`STABLE_WITHIN`].
    ///
    /// While publishing ([`Confirm::Beside`]) nothing here waits: the next
    /// transaction goes out while the last ones are read back.
    fn confirm(
        &mut self,
        connection: &mut Connection<B>,
        position: &mut Position,
        how: Confirm,
    ) -> Result<(), String> {
        loop {
            if let Some(pending) = position
                .confirming
                .as_mut()
                .and_then(|confirming| confirming.check.take())
            {
                let answer = match how {
                    Confirm::Now => {
                        // A read-back the brokers do not answer shows as
                        // failing in status, as a transaction does.
                        self.outbox.waiting_for_brokers(true);
                        let answer = connection.read_back.wait(pending, &self.stop);
                        self.outbox.waiting_for_brokers(false);
                        answer
                    }
                    Confirm::Beside => match connection.read_back.ready(&pending, &self.stop) {
                        Some(answer) => answer,
                        None => {
                            if let Some(confirming) = &mut position.confirming {
                                confirming.check = Some(pending);
                            }
                            return Ok(());
                        }
                    },
                };
                let (check, confirm_us, answered) = answer
                    .map_err(|e: CallError| e.to_string())?
                    .map_err(|e| format!("{e:#}"))?;
                self.outbox
                    .report(&mut |report| report.phase_us.confirm += confirm_us);
                if !self.checked(position, check, answered)? {
                    return Ok(());
                }
            }
            if how == Confirm::Beside && position.confirmed_at.elapsed() < CONFIRM_EVERY {
                return Ok(());
            }
            if position.confirming.is_none() && !position.unconfirmed.is_empty() {
                position.confirming = Some(Confirming {
                    written: std::mem::take(&mut position.unconfirmed),
                    through: position.next_after,
                    acknowledged: position.acknowledged,
                    since: Instant::now(),
                    check: None,
                });
            }
            match &mut position.confirming {
                Some(confirming) => {
                    let written = confirming.written.clone();
                    confirming.check = Some(
                        connection
                            .read_back
                            .begin(
                                "reading the relay's last records back",
                                ABANDON_AFTER,
                                move |reader| {
                                    let mut lap = Lap(Instant::now());
                                    reader
                                        .check(&written)
                                        .map(|check| (check, lap.next(), Instant::now()))
                                },
                            )
                            .map_err(|e| e.to_string())?,
                    );
                    position.confirmed_at = Instant::now();
                    if how == Confirm::Beside {
                        return Ok(());
                    }
                }
                None => {
                    // Every acknowledged transaction is confirmed: what is
                    // left up to `next_after` are numbers a withdrawal
                    // left without events.
                    if how == Confirm::Now && position.next_after > self.outbox.published_through()
                    {
                        self.mark_published(position, position.next_after)?;
                    }
                    return Ok(());
                }
            }
        }
    }

    /// Acts on a read-back's answer, made at `answered` (it may be taken
    /// later, after a transaction); whether the records it read were
    /// confirmed (and not to be read again yet).
    fn checked(
        &mut self,
        position: &mut Position,
        check: Check,
        answered: Instant,
    ) -> Result<bool, String> {
        let Some(confirming) = position.confirming.take() else {
            return Ok(false);
        };
        match check {
            Check::Held => {
                for (&partition, last) in &confirming.written {
                    position.from.insert(partition, last.offset + 1);
                }
                self.confirmed = Some(confirming.acknowledged);
                self.mark_published(position, confirming.through)?;
                Ok(true)
            }
            Check::NotYetStable { partition, offset } => {
                if answered.saturating_duration_since(confirming.since) < STABLE_WITHIN {
                    position.confirming = Some(confirming);
                    return Ok(false);
                }
                Err(format!(
                    "partition {partition} of the topic has not been stable past this relay's \
                     record at offset {offset} for {STABLE_WITHIN:?} after its transaction was \
                     acknowledged: its markers were not written (a new client's fence ends it, \
                     and what the topic then holds is published from there), or another \
                     producer's transaction is open before it"
                ))
            }
            Check::TakenBack {
                partition,
                offset,
                seq,
            } => {
                let reason = format!(
                    "event {seq}, acknowledged by the brokers at offset {offset} of partition \
                     {partition}, is not in the topic (a broker that lost its transaction's \
                     markers): publishing again from what the topic holds"
                );
                tracing::warn!("{reason}");
                self.outbox.report(&mut |report| report.taken_back += 1);
                Err(reason)
            }
        }
    }

    /// Removes the events through `through` from the outbox, with the mark
    /// of where this relay's records after them start.
    fn mark_published(&self, position: &Position, through: u64) -> Result<(), String> {
        let mark = Mark {
            topic: self.topic.clone(),
            through,
            from: position.from.clone(),
        };
        self.outbox
            .published(through, Some(&mark.encode()), false)
            .map_err(|e| format!("removing published events from the outbox: {e}"))
    }

    /// Says the relay is failing: in `status` at once, in the log at most
    /// every [`WARN_EVERY`].
    fn failing(&mut self, reason: String) {
        self.outbox.report(&mut |report| {
            report.state = "failing".into();
            report.error = Some(reason.clone());
        });
        let due = self
            .last_warning
            .is_none_or(|last| last.elapsed() >= WARN_EVERY);
        if due {
            let (events, bytes) = self.outbox.depth();
            tracing::warn!(
                %reason,
                unpublished_events = events,
                unpublished_bytes = bytes,
                failures_since_last_warning = self.failures_unwarned,
                "the Kafka relay cannot publish; events wait in the outbox and ingest goes on"
            );
            self.last_warning = Some(Instant::now());
            self.failures_unwarned = 0;
        } else {
            self.failures_unwarned += 1;
        }
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

fn sleep_unless_stopped(pause: Duration, stop: &AtomicBool) {
    let until = Instant::now() + pause;
    while !stop.load(Ordering::SeqCst) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}
