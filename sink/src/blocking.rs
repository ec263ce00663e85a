//! Blocking work run from async tasks without a hand-off between threads
//! where the runtime allows.

use crate::error::panic_message;

/// Runs blocking work (a commit round's, a subscriber's reads): in place on
/// a multi-threaded runtime (the worker hands its other tasks to another
/// thread), on the blocking pool otherwise. In place spares two hand-offs
/// between threads, a measurable share of a small round's latency on busy
/// cores (docs/measurements.md). A panic comes back as an error either way.
pub(crate) async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    use tokio::runtime::{Handle, RuntimeFlavor};
    if Handle::current().runtime_flavor() == RuntimeFlavor::MultiThread {
        return tokio::task::block_in_place(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
                .map_err(|panic| panic_message(panic.as_ref()))
        });
    }
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| e.to_string())
}
