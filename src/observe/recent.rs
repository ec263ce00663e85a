//! The last warnings and errors the process logged, for the status page:
//! a `tracing` layer that keeps a few of them in a ring.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

const KEEP: usize = 20;

#[derive(Clone, Debug, serde::Serialize)]
pub struct Problem {
    pub unix_ms: u64,
    pub level: String,
    pub target: String,
    pub message: String,
}

/// Shared between the layer (which writes) and the status (which reads).
#[derive(Clone, Default)]
pub struct RecentProblems {
    ring: Arc<Mutex<VecDeque<Problem>>>,
}

impl RecentProblems {
    pub fn list(&self) -> Vec<Problem> {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        ring.iter().rev().cloned().collect()
    }

    fn push(&self, problem: Problem) {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if ring.len() == KEEP {
            ring.pop_front();
        }
        ring.push_back(problem);
    }
}

impl<S: Subscriber> Layer<S> for RecentProblems {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let level = *event.metadata().level();
        if level > Level::WARN {
            return;
        }
        let mut text = Fields::default();
        event.record(&mut text);
        self.push(Problem {
            unix_ms: SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            level: level.to_string(),
            target: event.metadata().target().to_string(),
            message: text.0,
        });
    }
}

/// An event's message first, then its other fields as `name=value`.
#[derive(Default)]
struct Fields(String);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let rest = std::mem::take(&mut self.0);
            let _ = write!(self.0, "{value:?}");
            if !rest.is_empty() {
                self.0.push(' ');
                self.0.push_str(&rest);
            }
        } else {
            if !self.0.is_empty() {
                self.0.push(' ');
            }
            let _ = write!(self.0, "{}={value:?}", field.name());
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn keeps_warnings_and_errors_newest_first() {
        let recent = RecentProblems::default();
        let subscriber = tracing_subscriber::registry().with(recent.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!("not kept");
            tracing::warn!(file = "a.xtc2", "first");
            for i in 0..KEEP {
                tracing::error!(i, "again");
            }
        });
        let list = recent.list();
        assert_eq!(list.len(), KEEP);
        assert_eq!(list[0].message, "again i=19");
        assert_eq!(list[0].level, "ERROR");
        assert!(list.iter().all(|p| p.message != "not kept"));
    }

    #[test]
    fn the_message_comes_first() {
        let recent = RecentProblems::default();
        let subscriber = tracing_subscriber::registry().with(recent.clone());
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(file = "a.xtc2", "cannot read");
        });
        assert_eq!(recent.list()[0].message, "cannot read file=\"a.xtc2\"");
    }
}
