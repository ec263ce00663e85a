//! Sizes and durations as people write them on the command line, for clap
//! (the `units` crate parses them; these give clap its error type).

use std::time::Duration;

pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    units::parse_duration(s).map_err(|e| e.to_string())
}

/// A size, or "auto" (None) for the default the sink picks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SizeOrAuto(pub(crate) Option<u64>);

pub(crate) fn parse_size_or_auto(s: &str) -> Result<SizeOrAuto, String> {
    match s {
        "auto" => Ok(SizeOrAuto(None)),
        size => parse_size(size).map(|n| SizeOrAuto(Some(n))),
    }
}

pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    units::parse_size(s).map_err(|e| e.to_string())
}
