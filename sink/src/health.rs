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

impl Health {
    /// Makes a panic on this thread poison this health (see [`ThreadGuard`]).
    pub(crate) fn guard_thread(&self) -> ThreadGuard {
        static HOOK: std::sync::Once = std::sync::Once::new();
        HOOK.call_once(|| {
            let next = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                let guarded = GUARDED
                    .with(|guarded| guarded.try_borrow().ok().and_then(|health| health.clone()));
                if let Some(health) = guarded {
                    health.poison(format!("a panic in the sink: {info}"));
                }
                next(info);
            }));
        });
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
    #[test]
    fn a_panic_on_a_guarded_thread_poisons_before_its_locks_go() {
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
