//! Telling systemd (`Type=notify`) when the process is ready, what it is
//! doing, and that it is alive (`WatchdogSec=`). Outside systemd
//! (no `NOTIFY_SOCKET`) every call does nothing.

use std::time::Duration;

use sd_notify::NotifyState;

/// Startup is over: a sink serves, a watcher has reconciled and tails.
pub fn ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn stopping() {
    notify(&[NotifyState::Stopping]);
}

fn notify(states: &[NotifyState]) {
    if let Err(error) = sd_notify::notify(false, states) {
        tracing::warn!(%error, "cannot notify the service manager");
    }
}

/// Pings systemd's watchdog at half its interval for as long as `alive`
/// says the process does its work (a poisoned sink, or a watcher whose
/// tailer has stopped publishing, stops pinging and is restarted). Returns
/// at once when no watchdog is configured.
pub async fn watchdog(mut alive: impl FnMut() -> Result<(), String>) {
    let mut usec = 0u64;
    if !sd_notify::watchdog_enabled(false, &mut usec) || usec == 0 {
        return;
    }
    let mut every = tokio::time::interval(Duration::from_micros(usec) / 2);
    // The first tick is now: give `alive` one interval to show progress.
    every.tick().await;
    let mut told = false;
    loop {
        every.tick().await;
        match alive() {
            Ok(()) => {
                notify(&[NotifyState::Watchdog]);
                told = false;
            }
            Err(why) => {
                if !told {
                    tracing::error!(%why, "not pinging the service manager's watchdog");
                    notify(&[NotifyState::Status(&why)]);
                    told = true;
                }
            }
        }
    }
}
