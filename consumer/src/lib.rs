//! The consumer side of a sink's live-tail subscriptions, as `tailflight
//! tail` uses it: the rows of a batch ([`rows`]), files rebuilt from them
//! and checked against their seals ([`rebuild`]), the cursors that let a
//! restart resume where the output stopped ([`state`]), and the tasks that
//! follow one sink or every sink identity of a fleet ([`follow`]).

pub mod follow;
pub mod rebuild;
pub mod rows;
pub mod state;
