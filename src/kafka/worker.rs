//! Runs a blocking client's calls on a thread of its own, each with a
//! deadline. A call that has not returned by then is abandoned together
//! with its thread and its client, and the caller goes on with a new client.
//!
//! librdkafka's transactional calls can wait with no deadline of their own
//! (`send_offsets_to_transaction` while a partition has no leader waits for
//! the broker indefinitely), and the relay must never stop for good. A
//! thread cannot be killed, so an abandoned one is left to finish its call
//! and exit; [`Live`] counts the threads still running, abandoned ones
//! included, so the caller can bound how many it leaves behind.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long dropping a worker waits for its thread to drop the client
/// (librdkafka's destroy waits for its own threads) before leaving it.
const DROP_GRACE: Duration = Duration::from_secs(5);
/// How often a waiting call looks at the stop flag.
const STOP_POLL: Duration = Duration::from_millis(100);

/// Why a call has no answer.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{doing}: no answer within {after:?}; its client is abandoned for a new one")]
    Stuck { doing: String, after: Duration },
    #[error("{doing}: the program is stopping; its client is abandoned")]
    Stopping { doing: String },
    #[error("{doing}: the client's thread is gone (a panic in the call)")]
    Gone { doing: String },
}

/// The worker threads alive, abandoned ones still inside a call included.
#[derive(Clone, Debug, Default)]
pub struct Live(Arc<AtomicUsize>);

impl Live {
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// Decrements [`Live`] when its thread ends, by return or by panic.
struct Alive(Live);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::SeqCst);
    }
}

type Job<C> = Box<dyn FnOnce(&mut C) + Send>;

/// One client on its own thread; calls are made one at a time.
pub struct Worker<C> {
    jobs: Option<mpsc::Sender<Job<C>>>,
    thread: Option<JoinHandle<()>>,
}

impl<C: Send + 'static> Worker<C> {
    /// Moves `client` to a new thread named `name`, counted in `live`.
    pub fn spawn(name: &str, mut client: C, live: &Live) -> std::io::Result<Self> {
        let (jobs, inbox) = mpsc::channel::<Job<C>>();
        live.0.fetch_add(1, Ordering::SeqCst);
        // Moved into the thread: if spawning fails, dropping the closure
        // undoes the count.
        let alive = Alive(live.clone());
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _alive = alive;
                for job in inbox {
                    job(&mut client);
                }
                // The client is dropped here, on its own thread, so a
                // destroy that waits holds up nobody.
                drop(client);
            })?;
        Ok(Self {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Runs `job` on the client and returns its answer, or abandons the
    /// client if there is none within `deadline` or once `stop` is set.
    /// After an error every later call fails at once: make a new worker.
    pub fn call<R: Send + 'static>(
        &mut self,
        doing: &str,
        deadline: Duration,
        stop: &AtomicBool,
        job: impl FnOnce(&mut C) -> R + Send + 'static,
    ) -> Result<R, CallError> {
        let gone = || CallError::Gone {
            doing: doing.to_owned(),
        };
        let Some(jobs) = &self.jobs else {
            return Err(gone());
        };
        let (reply, answer) = mpsc::sync_channel(1);
        let job: Job<C> = Box::new(move |client: &mut C| {
            let _ = reply.send(job(client));
        });
        if jobs.send(job).is_err() {
            self.jobs = None;
            return Err(gone());
        }
        let started = Instant::now();
        loop {
            let left = deadline.saturating_sub(started.elapsed());
            if left.is_zero() {
                self.abandon();
                return Err(CallError::Stuck {
                    doing: doing.to_owned(),
                    after: deadline,
                });
            }
            match answer.recv_timeout(left.min(STOP_POLL)) {
                Ok(answer) => return Ok(answer),
                Err(RecvTimeoutError::Timeout) if stop.load(Ordering::SeqCst) => {
                    self.abandon();
                    return Err(CallError::Stopping {
                        doing: doing.to_owned(),
                    });
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.jobs = None;
                    return Err(gone());
                }
            }
        }
    }

    /// Leaves the thread to finish its call and exit on its own.
    fn abandon(&mut self) {
        self.jobs = None;
        self.thread = None;
    }
}

impl<C> Drop for Worker<C> {
    fn drop(&mut self) {
        // Closing the queue ends the thread's loop once its call returns.
        self.jobs = None;
        let Some(thread) = self.thread.take() else {
            return;
        };
        let until = Instant::now() + DROP_GRACE;
        while !thread.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        if thread.is_finished() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_come_back_from_the_clients_thread() {
        let live = Live::default();
        let stop = AtomicBool::new(false);
        let mut worker = Worker::spawn("test-worker", 40_u32, &live).expect("spawn");
        let answer = worker.call("adding", Duration::from_secs(30), &stop, |n| {
            *n += 2;
            *n
        });
        assert_eq!(answer.expect("an answer"), 42);
        assert_eq!(live.count(), 1);
        drop(worker);
        assert_eq!(live.count(), 0, "a dropped worker's thread ends");
    }

    #[test]
    fn a_call_that_never_returns_is_abandoned_and_counted_until_it_does() {
        let live = Live::default();
        let stop = AtomicBool::new(false);
        let (release, held) = mpsc::channel::<()>();
        let mut stuck = Worker::spawn("stuck-worker", held, &live).expect("spawn");
        let answer = stuck.call(
            "waiting forever",
            Duration::from_millis(200),
            &stop,
            |held| {
                let _ = held.recv();
            },
        );
        assert!(matches!(answer, Err(CallError::Stuck { .. })), "{answer:?}");
        // Later calls fail at once, and dropping does not wait for the call.
        assert!(matches!(
            stuck.call("again", Duration::from_secs(30), &stop, |_| ()),
            Err(CallError::Gone { .. })
        ));
        drop(stuck);
        assert_eq!(
            live.count(),
            1,
            "the abandoned thread is still inside its call"
        );

        // The caller goes on with a new client.
        let mut next = Worker::spawn("next-worker", (), &live).expect("spawn");
        next.call("working", Duration::from_secs(30), &stop, |_| ())
            .expect("the new client answers");
        drop(next);

        release.send(()).expect("the stuck call is still waiting");
        let until = Instant::now() + Duration::from_secs(30);
        while live.count() > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            live.count(),
            0,
            "the abandoned thread exits once its call returns"
        );
    }

    #[test]
    fn stopping_abandons_a_call_under_way() {
        let live = Live::default();
        let stop = AtomicBool::new(true);
        let (_release, held) = mpsc::channel::<()>();
        let mut worker = Worker::spawn("stopping-worker", held, &live).expect("spawn");
        let answer = worker.call("waiting", Duration::from_secs(3600), &stop, |held| {
            let _ = held.recv();
        });
        assert!(
            matches!(answer, Err(CallError::Stopping { .. })),
            "{answer:?}"
        );
    }

    #[test]
    fn a_panic_in_a_call_is_an_error_not_a_hang() {
        let live = Live::default();
        let stop = AtomicBool::new(false);
        let mut worker = Worker::spawn("panicky-worker", (), &live).expect("spawn");
        let answer: Result<(), _> =
            worker.call("panicking", Duration::from_secs(3600), &stop, |_| {
                panic!("deliberately, in a test")
            });
        assert!(matches!(answer, Err(CallError::Gone { .. })), "{answer:?}");
    }
}
