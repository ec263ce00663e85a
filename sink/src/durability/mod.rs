//! How placed bytes become durable: `flush` (a round's files and
//! directories, by syncfs or an fdatasync each), `journal` (the file where
//! small ranges become durable first, with their round's records) and
//! `direct` (the aligned middle of large ranges, written past the page
//! cache).

pub(crate) mod direct;
pub(crate) mod flush;
pub(crate) mod journal;
