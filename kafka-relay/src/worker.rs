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
use std::sync::mpsc::{self, RecvTimeoutError, TryRecvError};
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

/// A call queued on a worker whose answer is taken later.
pub struct Pending<R> {
    doing: String,
    deadline: Duration,
    started: Instant,
    answer: mpsc::Receiver<R>,
}

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
        let pending = self.begin(doing, deadline, job)?;
        self.wait(pending, stop)
    }

    /// Queues `job` on the client and returns at once; its answer is taken
    /// with [`Worker::ready`] or [`Worker::wait`], within `deadline` from now.
    pub fn begin<R: Send + 'static>(
        &mut self,
        doing: &str,
        deadline: Duration,
        job: impl FnOnce(&mut C) -> R + Send + 'static,
    ) -> Result<Pending<R>, CallError> {
        let Some(jobs) = &self.jobs else {
            return Err(CallError::Gone {
                doing: doing.to_owned(),
            });
        };
        let (reply, answer) = mpsc::sync_channel(1);
        let job: Job<C> = Box::new(move |client: &mut C| {
            let _ = reply.send(job(client));
        });
        if jobs.send(job).is_err() {
            self.jobs = None;
            return Err(CallError::Gone {
                doing: doing.to_owned(),
            });
        }
        Ok(Pending {
            doing: doing.to_owned(),
            deadline,
            started: Instant::now(),
            answer,
        })
    }

    /// Waits for the answer of a call begun earlier, or abandons the client
    /// as [`Worker::call`] does.
    pub fn wait<R>(&mut self, pending: Pending<R>, stop: &AtomicBool) -> Result<R, CallError> {
        loop {
            let left = pending.deadline.saturating_sub(pending.started.elapsed());
            let answer = if left.is_zero() {
                taken(pending.answer.try_recv())
            } else {
                pending.answer.recv_timeout(left.min(STOP_POLL))
            };
            if let Some(outcome) = self.settle(&pending, answer, stop) {
                return outcome;
            }
        }
    }

    /// The answer of a call begun earlier if it is there; `None` while it
    /// is under way within its deadline.
    pub fn ready<R>(
        &mut self,
        pending: &Pending<R>,
        stop: &AtomicBool,
    ) -> Option<Result<R, CallError>> {
        let answer = taken(pending.answer.try_recv());
        self.settle(pending, answer, stop)
    }

    fn settle<R>(
        &mut self,
        pending: &Pending<R>,
        answer: Result<R, RecvTimeoutError>,
        stop: &AtomicBool,
    ) -> Option<Result<R, CallError>> {
        match answer {
            Ok(answer) => Some(Ok(answer)),
            Err(RecvTimeoutError::Disconnected) => {
                self.jobs = None;
                Some(Err(CallError::Gone {
                    doing: pending.doing.clone(),
                }))
            }
            Err(RecvTimeoutError::Timeout) if pending.started.elapsed() >= pending.deadline => {
                self.abandon();
                Some(Err(CallError::Stuck {
                    doing: pending.doing.clone(),
                    after: pending.deadline,
                }))
            }
            Err(RecvTimeoutError::Timeout) if stop.load(Ordering::SeqCst) => {
                self.abandon();
                Some(Err(CallError::Stopping {
                    doing: pending.doing.clone(),
                }))
            }
            Err(RecvTimeoutError::Timeout) => None,
        }
    }

    /// Leaves the thread to finish its call and exit on its own.
    fn abandon(&mut self) {
        self.jobs = None;
        self.thread = None;
    }
}

/// A non-blocking receive's outcome in a blocking one's terms.
fn taken<R>(answer: Result<R, TryRecvError>) -> Result<R, RecvTimeoutError> {
    answer.map_err(|error| match error {
        TryRecvError::Empty => RecvTimeoutError::Timeout,
        TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
    })
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
    fn a_call_begun_is_taken_when_ready_or_abandoned_after_its_deadline() {
        let live = Live::default();
        let stop = AtomicBool::new(false);
        let (release, held) = mpsc::channel::<u32>();
        let mut worker = Worker::spawn("begun-worker", held, &live).expect("spawn");
        let pending = worker
            .begin("waiting for a number", Duration::from_secs(3600), |held| {
                held.recv().ok()
            })
            .expect("queued");
        assert!(worker.ready(&pending, &stop).is_none(), "still under way");
        release.send(7).expect("the call is waiting");
        let answer = worker.wait(pending, &stop).expect("an answer");
        assert_eq!(answer, Some(7));

        let pending = worker
            .begin("waiting forever", Duration::ZERO, |held| held.recv().ok())
            .expect("queued");
        assert!(
            matches!(
                worker.ready(&pending, &stop),
                Some(Err(CallError::Stuck { .. }))
            ),
            "a call past its deadline is abandoned"
        );
        assert!(matches!(
            worker.begin("again", Duration::from_secs(30), |_| ()),
            Err(CallError::Gone { .. })
        ));
        drop(release);
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
