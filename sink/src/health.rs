//! Whether the sink can still be trusted with work.
//!
//! One [`Health`] per sink, shared by everything that can fail in a way
//! memory cannot recover from: a failed flush (after one the page cache
//! proves nothing), a failed or panicked commit round (a move's intent
//! included), a panicked placement (its slot state may be half
//! updated), a dead committer or journal thread. It is poisoned once, with
//! the first reason, and stays poisoned until the process restarts and
//! recovers from its manifest. The service, `status`, the committer and
//! placement all read it here; nobody keeps a flag of their own.

use std::sync::Arc;

use tokio::sync::watch;

/// The sink's health: healthy, or poisoned with the first reason.
#[derive(Clone)]
pub struct Health {
    reason: Arc<watch::Sender<Option<Arc<str>>>>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            reason: Arc::new(watch::Sender::new(None)),
        }
    }
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health")
            .field("poisoned", &self.reason())
            .finish()
    }
}

impl Health {
    /// Poisons the sink unless it already is; returns whether this call did
    /// (only the first reason is kept, and logged).
    pub fn poison(&self, reason: impl Into<String>) -> bool {
        let mut reason = Some(reason.into());
        let first = self.reason.send_if_modified(|current| {
            if current.is_some() {
                return false;
            }
            *current = reason.take().map(Arc::from);
            true
        });
        if first {
            tracing::error!(
                reason = self.reason().as_deref().unwrap_or_default(),
                "the sink is poisoned: it refuses further batches until restarted"
            );
        }
        first
    }

    /// Why the sink stopped accepting work, if it did.
    pub fn reason(&self) -> Option<Arc<str>> {
        self.reason.borrow().clone()
    }

    pub fn is_poisoned(&self) -> bool {
        self.reason.borrow().is_some()
    }

    /// Ok while healthy; the reason as a [`SinkError::Poisoned`] otherwise.
    ///
    /// [`SinkError::Poisoned`]: crate::SinkError::Poisoned
    pub fn check(&self) -> Result<(), crate::SinkError> {
        match self.reason() {
            Some(reason) => Err(crate::SinkError::Poisoned(reason)),
            None => Ok(()),
        }
    }

    /// Resolves once the sink is poisoned (at once if it is).
    pub async fn poisoned(&self) -> Arc<str> {
        let mut watching = self.reason.subscribe();
        loop {
            if let Some(reason) = watching.borrow_and_update().clone() {
                return reason;
            }
            if watching.changed().await.is_err() {
                // The sender lives as long as any Health clone, this one too.
                std::future::pending::<()>().await;
            }
        }
    }
}

thread_local! {
    /// The health a panic on this thread poisons, while it works on the
    /// sink's shared state (see [`Health::guard_thread`]).
    static GUARDED: std::cell::RefCell<Option<Health>> = const { std::cell::RefCell::new(None) };
}

/// Until dropped, a panic on this thread poisons the health it was made
/// for, from the panic hook: before unwinding lets go of any lock, so no
/// other thread can take a lock the panic left over half-updated state and
/// find the sink still healthy.
pub(crate) struct ThreadGuard {
    previous: Option<Health>,
}

impl Drop for ThreadGuard {
    fn drop(&mut self) {
        let previous = self.previous.take();
        GUARDED.with(|guarded| {
            if let Ok(mut guarded) = guarded.try_borrow_mut() {
                *guarded = previous;
            }
        });
    }
}

/// What the process's panic hook calls for a panic on a guarded thread to
/// poison its sink before unwinding lets go of the thread's locks. The
/// hook is the program's to set (a library must not replace a process-wide
/// hook behind its back): [`install_panic_hook`] sets one that calls this,
/// and a program with a hook of its own calls this from it. Without either,
/// a panic while placing still poisons the sink, once it has unwound.
pub fn poison_on_panic(info: &std::panic::PanicHookInfo<'_>) {
    let guarded =
        GUARDED.with(|guarded| guarded.try_borrow().ok().and_then(|health| health.clone()));
    if let Some(health) = guarded {
        health.poison(format!("a panic in the sink: {info}"));
    }
}

/// Sets a process-wide panic hook that calls [`poison_on_panic`], then the
/// hook that was set before. Once per process; later calls do nothing.
pub fn install_panic_hook() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let next = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            poison_on_panic(info);
            next(info);
        }));
    });
}

impl Health {
    /// Makes a panic on this thread poison this health (see [`ThreadGuard`]
    /// and [`poison_on_panic`]).
    pub(crate) fn guard_thread(&self) -> ThreadGuard {
        let previous = GUARDED.with(|guarded| {
            guarded
                .try_borrow_mut()
                .ok()
                .and_then(|mut guarded| guarded.replace(self.clone()))
        });
        ThreadGuard { previous }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_reason_wins_and_wakes_waiters() {
        let health = Health::default();
        assert!(health.check().is_ok());
        let waiter = {
            let health = health.clone();
            tokio::spawn(async move { health.poisoned().await })
        };
        assert!(health.poison("disk on fire"));
        assert!(!health.poison("a later failure"));
        assert_eq!(waiter.await.unwrap().as_ref(), "disk on fire");
        assert_eq!(health.reason().as_deref(), Some("disk on fire"));
        assert!(matches!(
            health.check(),
            Err(crate::SinkError::Poisoned(reason)) if reason.as_ref() == "disk on fire"
        ));
        assert_eq!(health.poisoned().await.as_ref(), "disk on fire");
    }

    /// A panic on a guarded thread poisons the health before the lock it
    /// held is let go: whoever takes the lock next finds the sink poisoned.
    /// The process's panic hook, which these tests set, is one for the
    /// whole test binary: they take turns.
    static HOOK_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// Guarding a thread (as every placement does) leaves the process's
    /// panic hook as the program set it: the hook is the program's.
    #[test]
    fn guarding_a_thread_leaves_the_programs_panic_hook_alone() {
        let _turn = HOOK_TESTS.lock();
        let before = std::panic::take_hook();
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counting = calls.clone();
        let hook: Box<dyn Fn(&std::panic::PanicHookInfo<'_>) + Sync + Send> = Box::new(move |_| {
            counting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        });
        let set_at = std::ptr::from_ref(hook.as_ref()).cast::<()>();
        std::panic::set_hook(hook);
        {
            let _guard = Health::default().guard_thread();
        }
        let now = std::panic::take_hook();
        let unchanged = std::ptr::from_ref(now.as_ref()).cast::<()>() == set_at;
        std::panic::set_hook(before);
        assert!(
            unchanged,
            "guarding a thread replaced the program's panic hook"
        );
        drop(now);
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    #[test]
    fn a_panic_on_a_guarded_thread_poisons_before_its_locks_go() {
        let _turn = HOOK_TESTS.lock();
        install_panic_hook();
        let health = Health::default();
        let state = std::sync::Arc::new(std::sync::Mutex::new(0));
        let (locked, seen) = (state.clone(), health.clone());
        let panicked = std::thread::spawn(move || {
            let _guard = seen.guard_thread();
            let _held = locked.lock().unwrap();
            panic!("half-way through an update");
        })
        .join();
        assert!(panicked.is_err());
        let _next = state.lock();
        assert!(health.reason().is_some_and(|r| r.contains("half-way")));
        let unguarded = Health::default();
        let _ = std::thread::spawn(|| panic!("elsewhere")).join();
        assert!(!unguarded.is_poisoned());
    }
}
