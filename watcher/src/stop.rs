//! The watcher's stop signal, shared by its async side and its threads.
//!
//! A flag that loops check between rounds, and a wake-up for whatever waits
//! meanwhile on something a sink controls (room in a full outbox, an
//! answer): a stop must end the watcher in bounded time whatever the sinks
//! do, and what was not acknowledged is simply sent again after a restart.

use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct Stop {
    requested: AtomicBool,
    wake: Notify,
}

impl Stop {
    pub fn request(&self) {
        self.requested.store(true, Ordering::Release);
        self.wake.notify_waiters();
    }

    pub fn is_requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }

    /// Resolves once a stop was requested (at once if it already was).
    pub async fn requested(&self) {
        loop {
            let woken = self.wake.notified();
            tokio::pin!(woken);
            // Registered before the flag is read, so a request in between
            // is not missed.
            woken.as_mut().enable();
            if self.is_requested() {
                return;
            }
            woken.await;
        }
    }
}

/// Requests the stop when dropped: whichever way `run` ends (returned,
/// failed, or its future dropped), the threads it started wind down.
pub(crate) struct StopOnDrop(pub std::sync::Arc<Stop>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.request();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_request_wakes_a_waiter_on_another_thread() {
        let stop = Arc::new(Stop::default());
        let waiter = {
            let stop = stop.clone();
            std::thread::spawn(move || futures::executor::block_on(stop.requested()))
        };
        stop.request();
        assert!(waiter.join().is_ok());
        assert!(stop.is_requested());
    }

    #[test]
    fn a_request_made_before_waiting_is_not_missed() {
        let stop = Stop::default();
        stop.request();
        futures::executor::block_on(stop.requested());
    }
}
