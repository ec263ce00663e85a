//! Writing a range at its offset, with an error that names its file; and
//! writing large ranges' aligned middle directly (O_DIRECT, see
//! [`crate::durability::direct`]) with the aligned buffers that takes.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use crate::SinkError;
use crate::durability::direct::{self, DirectFile};
use crate::state::SlotState;

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

/// Direct writes of the aligned middle of large ranges.
#[derive(Default)]
pub(super) struct DirectWrites {
    /// Ranges whose aligned middle holds at least this many bytes write it
    /// with O_DIRECT (0: never).
    min: u64,
    buffers: direct::Buffers,
}

impl DirectWrites {
    pub(super) fn new(min: u64) -> Self {
        Self {
            min,
            buffers: direct::Buffers::default(),
        }
    }

    pub(super) fn figures(&self) -> direct::DirectFigures {
        self.buffers.figures()
    }

    /// Writes a range in place: its aligned middle directly when it is
    /// large enough and the filesystem allows, the rest through the page
    /// cache. An error names the destination and offset.
    pub(super) fn write_in_place(
        &self,
        state: &mut SlotState,
        file: &File,
        bytes: &[u8],
        offset: u64,
    ) -> Result<(), SinkError> {
        let middle = match self.min {
            0 => None,
            min => direct::aligned_middle(offset, bytes.len() as u64, min),
        };
        let direct = match (middle, &state.direct) {
            (None, _) | (_, DirectFile::Refused) => None,
            (Some(_), DirectFile::Open(direct)) => Some(direct.clone()),
            (Some(_), DirectFile::NotOpened) => {
                match direct::reopen_direct(file, &state.record.dest_path) {
                    direct::Reopened::Open(direct) => {
                        let direct = Arc::new(direct);
                        state.direct = DirectFile::Open(direct.clone());
                        Some(direct)
                    }
                    direct::Reopened::Refused => {
                        state.direct = DirectFile::Refused;
                        None
                    }
                    direct::Reopened::NotNow => None,
                }
            }
        };
        let dest = || state.record.dest_path.clone();
        let (Some((start, end)), Some(direct)) = (middle, direct) else {
            return write_range(file, bytes, offset, dest);
        };
        let at = |o: u64| (o - offset) as usize;
        write_range(file, &bytes[..at(start)], offset, dest)?;
        let middle_bytes = &bytes[at(start)..at(end)];
        match self.buffers.write(&direct, middle_bytes, start) {
            Ok(true) => {}
            // As many direct writes as there are buffers are under way:
            // this once, the usual way.
            Ok(false) => write_range(file, middle_bytes, start, dest)?,
            // An alignment this device does not take after all. Chunks
            // before the failed one are in the file; writing them again
            // through the page cache puts the same bytes there.
            Err(failed) if failed.error.raw_os_error() == Some(libc::EINVAL) => {
                tracing::debug!(dest = %state.record.dest_path, error = %failed.error, "direct write refused; writing through the page cache");
                state.direct = DirectFile::Refused;
                write_range(file, middle_bytes, start, || state.record.dest_path.clone())?;
            }
            Err(failed) => {
                return Err(SinkError::storage(
                    format_args!(
                        "writing {} bytes at offset {} of {} (O_DIRECT)",
                        failed.len, failed.offset, state.record.dest_path
                    ),
                    failed.error,
                ));
            }
        }
        write_range(file, &bytes[at(end)..], end, || {
            state.record.dest_path.clone()
        })
    }
}
