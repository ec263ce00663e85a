//! Whether the sink can still be trusted with work.
//!
//! One [`Health`] per sink, shared by everything that can fail in a way
//! memory cannot recover from: a failed flush (after one the page cache
//! proves nothing), a failed or panicked commit round, a failed manifest
//! write outside a round, a panicked placement (its slot state may be half
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
}
