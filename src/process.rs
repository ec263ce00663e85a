//! What every long-lived command of the process shares: the async runtime,
//! the stop signal, the open-file limit.

use anyhow::Context;

/// Writes one line to stderr in a single write. `eprintln!` writes each
/// piece of its format separately (stderr is unbuffered), so a line of
/// stdout written meanwhile by another thread (a `tail --print` row) can
/// land inside it when both go to one file, as `2>&1` does.
pub(crate) fn say_line(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut text = line.to_string();
    text.push('\n');
    // Nothing better to do with a stderr that cannot be written.
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// `eprintln!` as one write: see [`say_line`].
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::process::say_line(format_args!($($arg)*))
    };
}
pub(crate) use say;

/// Sinks and watchers hold a descriptor per open file: take the hard limit.
pub(crate) fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit with a valid, initialised struct.
    unsafe {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                tracing::warn!("cannot raise the open-file limit; many files may exhaust it");
            }
        }
    }
}

/// How long an idle thread of tokio's blocking pool waits for more work
/// before it ends. mimalloc keeps pages for every thread that allocated;
/// pool threads that outlive a burst of work (the catch-up after a network
/// cut) keep them all, and each burst may grow the pool. A thread that ends
/// gives its pages back, so the memory follows the work instead of the
/// largest burst so far (docs/measurements.md).
pub(crate) const BLOCKING_THREAD_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .thread_keep_alive(BLOCKING_THREAD_IDLE)
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

pub(crate) async fn ctrl_c() {
    let _ = tokio::signal::ctrl_c().await;
}

/// One SIGINT/SIGTERM listener for the whole process, started now, and a
/// maker of futures that resolve once it has heard the signal: a signal
/// that arrives before some part of the process starts waiting is not lost
/// to it. Call it inside the runtime.
pub(crate) fn stop_signal()
-> impl Fn() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    let (heard, hearing) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        terminated().await;
        let _ = heard.send(true);
    });
    move || {
        let mut hearing = hearing.clone();
        Box::pin(async move {
            // An error means the listener is gone: the process is ending.
            let _ = hearing.wait_for(|heard| *heard).await;
        })
    }
}

/// Resolves on SIGINT or SIGTERM.
pub(crate) async fn terminated() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => return ctrl_c().await,
    };
    tokio::select! {
        _ = ctrl_c() => {}
        _ = term.recv() => {}
    }
}
