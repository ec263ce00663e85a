//! The relay against the model's topic and outbox: every event reaches
//! the topic exactly once and leaves the outbox only once the topic holds
//! it, across restarts, take-backs, fencing, failed transactions, gaps in
//! the outbox's numbers and partitions not yet stable.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::KafkaRelay;
use crate::brokers::EventLog;
use crate::connect::relay_identity;
use crate::model::{MemoryLog, ModelBrokers, Topic};
use crate::position::Mark;

const TOPIC: &str = "events";

struct Setup {
    topic: Arc<Topic>,
    log: Arc<MemoryLog>,
    identity: String,
}

impl Setup {
    fn new() -> Self {
        let topic = Topic::new();
        let identity = relay_identity("model");
        let log = MemoryLog::new(topic.clone(), &identity);
        Self {
            topic,
            log,
            identity,
        }
    }

    fn start(&self) -> KafkaRelay {
        let brokers = ModelBrokers {
            topic: self.topic.clone(),
            identity: self.identity.clone(),
        };
        let log: Arc<dyn EventLog> = self.log.clone();
        KafkaRelay::start_with(log, TOPIC.into(), brokers).expect("the relay starts")
    }

    fn wait_published(&self, through: u64) {
        wait_until(&format!("events through {through} published"), || {
            self.log.published_through() >= through
        });
    }

    /// Every event in `expected` is in the topic exactly once, and none
    /// left the outbox before the relay read it back committed.
    fn assert_exactly_once(&self, expected: impl IntoIterator<Item = u64>) {
        let expected: Vec<u64> = expected.into_iter().collect();
        assert_eq!(self.topic.committed(&self.identity), expected);
        assert_eq!(self.log.withdrawn_unheld(), Vec::<u64>::new());
        assert_eq!(self.log.pending(), 0);
    }
}

/// Waits for `done`: the relay works on threads of its own. Bounded, so a
/// relay that never gets there fails the test instead of hanging it.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < until, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn every_event_is_published_once_and_leaves_the_outbox_once_read_back() {
    let setup = Setup::new();
    setup.log.append(50);
    let relay = setup.start();
    setup.wait_published(50);
    setup.log.append(30);
    setup.wait_published(80);
    relay.stop();
    setup.assert_exactly_once(1..=80);
    let mark = setup.log.mark().unwrap().expect("a mark");
    assert_eq!(Mark::decode(&mark, TOPIC).map(|m| m.through), Some(80));
    assert_eq!(setup.log.relay_report().restarts, 0);
}

#[test]
fn a_restart_goes_on_after_what_the_topic_holds() {
    let setup = Setup::new();
    setup.log.append(20);
    let relay = setup.start();
    setup.wait_published(20);
    relay.stop();
    // An earlier run published 21..=25, and its withdrawal from the outbox
    // was lost (a crash between the two).
    setup.log.append(10);
    setup.topic.commit_directly(&setup.identity, 21..=25);
    let relay = setup.start();
    setup.wait_published(30);
    relay.stop();
    setup.assert_exactly_once(1..=30);
}

#[test]
fn a_transaction_the_brokers_take_back_is_published_again() {
    let setup = Setup::new();
    setup.topic.faults(|f| f.take_back_next = true);
    setup.log.append(10);
    let relay = setup.start();
    setup.wait_published(10);
    relay.stop();
    setup.assert_exactly_once(1..=10);
    let report = setup.log.relay_report();
    assert_eq!(report.taken_back, 1);
    assert!(report.restarts >= 1, "{report:?}");
}

#[test]
fn a_fenced_client_gives_way_and_the_next_one_goes_on() {
    let setup = Setup::new();
    setup.log.append(10);
    let relay = setup.start();
    setup.wait_published(10);
    setup.topic.fence_by_another();
    setup.log.append(10);
    setup.wait_published(20);
    relay.stop();
    setup.assert_exactly_once(1..=20);
    let report = setup.log.relay_report();
    assert!(report.restarts >= 1, "{report:?}");
    let reason = report.last_restart_reason.unwrap_or_default();
    assert!(reason.contains("fenced"), "{reason}");
}

#[test]
fn a_failed_transaction_leaves_nothing_visible_and_is_published_again() {
    let setup = Setup::new();
    setup.topic.faults(|f| f.fail_next = true);
    setup.log.append(10);
    let relay = setup.start();
    setup.wait_published(10);
    relay.stop();
    setup.assert_exactly_once(1..=10);
}

#[test]
fn numbers_without_events_are_passed() {
    let setup = Setup::new();
    setup.log.append(5);
    // 6..=8 were withdrawn with their batch, and so were the last two.
    setup.log.skip(3);
    setup.log.append(5);
    setup.log.skip(2);
    let relay = setup.start();
    setup.wait_published(15);
    relay.stop();
    setup.assert_exactly_once((1..=5).chain(9..=13));
    let mark = setup.log.mark().unwrap().expect("a mark");
    assert_eq!(Mark::decode(&mark, TOPIC).map(|m| m.through), Some(15));
}

#[test]
fn a_partition_not_stable_yet_is_read_again_without_a_restart() {
    let setup = Setup::new();
    setup.topic.faults(|f| f.unstable_reads = 3);
    setup.log.append(10);
    let relay = setup.start();
    setup.wait_published(10);
    relay.stop();
    setup.assert_exactly_once(1..=10);
    assert_eq!(setup.topic.unstable_reads_left(), 0);
    assert_eq!(setup.log.relay_report().restarts, 0);
}

#[test]
fn a_topic_ahead_of_the_outbox_stops_publication_and_says_why() {
    let setup = Setup::new();
    setup.log.set_mark(
        Mark {
            topic: TOPIC.into(),
            through: 0,
            from: Default::default(),
        }
        .encode(),
    );
    // The topic holds events this outbox never recorded: a state
    // directory restored from an older copy.
    setup.topic.commit_directly(&setup.identity, 1..=8);
    setup.log.append(5);
    let relay = setup.start();
    wait_until("the relay says why it does not publish", || {
        setup
            .log
            .relay_report()
            .error
            .is_some_and(|e| e.contains("older copy"))
    });
    relay.stop();
    assert_eq!(setup.log.published_through(), 0);
    assert_eq!(
        setup.topic.committed(&setup.identity),
        (1..=8).collect::<Vec<_>>()
    );
}
