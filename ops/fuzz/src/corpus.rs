//! The corpus of crashers: each stream that broke a rule, kept as the
//! Flight messages it was (length-delimited protobuf, `<name>.bin`) with a
//! note of how it was made and what it broke (`<name>.txt`), and replayed as
//! a regression test once fixed.

use std::path::{Path, PathBuf};

use arrow_flight::FlightData;
use prost::Message;

/// Writes `messages` as `<dir>/<name>.bin` and `note` as `<dir>/<name>.txt`.
pub fn save(
    dir: &Path,
    name: &str,
    messages: &[FlightData],
    note: &str,
) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let mut bytes = Vec::new();
    for message in messages {
        message
            .encode_length_delimited(&mut bytes)
            .map_err(std::io::Error::other)?;
    }
    let path = dir.join(format!("{name}.bin"));
    std::fs::write(&path, bytes)?;
    std::fs::write(dir.join(format!("{name}.txt")), note)?;
    Ok(path)
}

/// Reads back the messages of a `.bin` file.
pub fn load(path: &Path) -> anyhow::Result<Vec<FlightData>> {
    let bytes = std::fs::read(path)?;
    let mut rest = &bytes[..];
    let mut messages = Vec::new();
    while !rest.is_empty() {
        let message = FlightData::decode_length_delimited(&mut rest)
            .map_err(|e| anyhow::anyhow!("{}: message {}: {e}", path.display(), messages.len()))?;
        messages.push(message);
    }
    Ok(messages)
}

/// The `.bin` files of a corpus directory, sorted (none if it is missing).
pub fn entries(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut paths = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| path.extension().is_some_and(|ext| ext == "bin"))
            .collect::<Vec<_>>(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e),
    };
    paths.sort();
    Ok(paths)
}
