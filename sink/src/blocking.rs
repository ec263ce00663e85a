//! Blocking work run from async tasks: on tokio's blocking pool, so the
//! async workers stay on their own threads.

use crate::error::panic_message;

/// Runs blocking work (a commit round's, a subscriber's reads) on the
/// blocking pool. Running it in place (`block_in_place`) spares two
/// hand-offs between threads, but each call moves the async worker to
/// another thread, and the allocator keeps pages for every thread that has
/// run async work: under repeated network cuts the sink's memory grew
/// with it (docs/measurements.md). A panic comes back as an error.
pub(crate) async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(work).await.map_err(|error| {
        if error.is_panic() {
            panic_message(error.into_panic().as_ref())
        } else {
            error.to_string()
        }
    })
}
