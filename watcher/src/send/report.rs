//! What a send tells of itself once it ends: each file's outcome, what it
//! passed over, its figures, and why it ended early if it did.

use serde::Serialize;

use super::plan::Passed;

/// What became of one file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Outcome {
    /// Sent (or its rest sent) and sealed: the sink checked its digest.
    Sealed,
    /// The sink already held it whole and sealed.
    AlreadySealed,
    /// Sent up to `size` and not sealed: it was still growing.
    Incomplete { size: u64 },
    /// Reading it failed (unreadable, truncated while sent...).
    Failed { reason: String },
    /// The sink refused it.
    Refused { reason: String },
}

#[derive(Clone, Debug, Serialize)]
pub struct FileReport {
    pub local: String,
    pub key: String,
    pub size: u64,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// Why a send ended before every file had its outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "ended", rename_all = "kebab-case")]
pub enum Cut {
    /// The sink was out of reach for longer than `retry_for`.
    Unreachable {
        detail: String,
    },
    /// The sink refused the whole send (its watermarks request).
    Refused {
        reason: String,
    },
    Interrupted,
}

impl Cut {
    /// The graver of two sinks' cuts, for the report of the whole send.
    pub(super) fn graver(self, other: Cut) -> Cut {
        let rank = |cut: &Cut| match cut {
            Cut::Unreachable { .. } => 2,
            Cut::Refused { .. } => 1,
            Cut::Interrupted => 0,
        };
        if rank(&other) > rank(&self) {
            other
        } else {
            self
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct SendReport {
    pub files: Vec<FileReport>,
    pub passed: Vec<Passed>,
    /// Bytes of the files sent.
    pub total_bytes: u64,
    /// Bytes the sink held before this run (not sent again).
    pub already_bytes: u64,
    /// File bytes sent in this run, and acknowledged.
    pub sent_bytes: u64,
    pub acked_bytes: u64,
    /// Bytes on the wire (batches' IPC headers and bodies, resent ones
    /// included).
    pub wire_bytes: u64,
    pub seconds: f64,
    pub cut: Option<Cut>,
}

impl SendReport {
    pub fn count(&self, pick: impl Fn(&Outcome) -> bool) -> usize {
        self.files.iter().filter(|f| pick(&f.outcome)).count()
    }

    /// Every file named was sent and sealed, and nothing was passed over.
    pub fn complete(&self) -> bool {
        self.cut.is_none()
            && self.passed.is_empty()
            && self
                .files
                .iter()
                .all(|f| matches!(f.outcome, Outcome::Sealed | Outcome::AlreadySealed))
    }
}
