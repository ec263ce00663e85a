//! Rows of a subscription's batches: a file's row at its position, and
//! its bytes read from the destination file.

use flight_server::subscription::{ConsumerRow, RowKind};

use super::followed::Followed;

/// A row of `kind` about `file`, at its position, without data.
pub(super) fn base_row<'a>(
    kind: RowKind,
    file: &'a Followed,
    key: &'a str,
    generation: u64,
) -> ConsumerRow<'a> {
    ConsumerRow {
        kind,
        path: &file.path,
        file_key: key,
        generation,
        offset: file.sent,
        data: &[],
        size: None,
        digest: None,
        from_path: None,
    }
}

/// Reads into `buf` from a file at `offset`, as much as there is.
pub(super) fn read_at(file: &std::fs::File, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], offset + filled as u64)? {
            0 => break,
            n => filled += n,
        }
    }
    Ok(filled)
}
