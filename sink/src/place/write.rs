//! Writing a range at its offset, with an error that names its file.

use std::fs::File;
use std::os::unix::fs::FileExt;

use crate::SinkError;

/// Writes a range at its offset; the error names the destination (asked
/// for only then).
pub(crate) fn write_range(
    file: &File,
    bytes: &[u8],
    offset: u64,
    dest: impl FnOnce() -> String,
) -> Result<(), SinkError> {
    file.write_all_at(bytes, offset).map_err(|e| {
        SinkError::storage(
            format_args!(
                "writing {} bytes at offset {offset} of {}",
                bytes.len(),
                dest()
            ),
            e,
        )
    })
}
