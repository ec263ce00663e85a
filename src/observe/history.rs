//! The last minutes of a process's headline figures, sampled every few
//! seconds, for the status page's sparklines (a page opened now still
//! shows how the last minutes went).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// How often a point is taken, and how far back points are kept.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);
const KEEP: usize = 150;

#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Point {
    pub unix_ms: u64,
    /// Bytes owed (the watcher: to its sinks; the sink: to its slowest
    /// subscriber).
    pub lag_bytes: f64,
    pub lag_seconds: f64,
    /// Bytes made durable since the start: throughput is its slope.
    pub bytes_total: f64,
}

#[derive(Default)]
pub struct History {
    points: Mutex<VecDeque<Point>>,
}

impl History {
    pub fn push(&self, mut point: Point) {
        point.unix_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let mut points = self.points.lock().unwrap_or_else(|p| p.into_inner());
        if points.len() == KEEP {
            points.pop_front();
        }
        points.push_back(point);
    }

    pub fn points(&self) -> Vec<Point> {
        self.points
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_points_only() {
        let history = History::default();
        for i in 0..(KEEP + 10) {
            history.push(Point {
                bytes_total: i as f64,
                ..Point::default()
            });
        }
        let points = history.points();
        assert_eq!(points.len(), KEEP);
        assert_eq!(points[0].bytes_total, 10.0);
        assert!(points[0].unix_ms > 0);
    }
}
