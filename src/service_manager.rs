//! Telling systemd (`Type=notify`) when the process is ready, what it is
//! doing, and that it is alive (`WatchdogSec=`). Outside systemd
//! (no `NOTIFY_SOCKET`) every call does nothing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sd_notify::NotifyState;

/// Startup is over: a sink serves, a watcher has reconciled and tails.
pub fn ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// The work's own watchdog runs: a standby's pings are no longer needed.
static WORKING: AtomicBool = AtomicBool::new(false);
/// The work stops for a handover, not for good: the process starts over
/// as a standby, so the unit is not stopping.
static HANDING_OVER: AtomicBool = AtomicBool::new(false);

pub fn stopping() {
    if HANDING_OVER.load(Ordering::SeqCst) {
        return;
    }
    notify(&[NotifyState::Stopping]);
}

/// An identity's process has joined its fleet: as far as systemd is
/// concerned it has started (a standby is what the unit is for, until it
/// takes over). Its watchdog is pinged until the work's own watchdog runs
/// (the takeover's journal replay included).
pub fn standing_by(identity: &str) {
    notify(&[
        NotifyState::Ready,
        NotifyState::Status(&format!("in the fleet for identity {identity}")),
    ]);
    let mut usec = 0u64;
    if !sd_notify::watchdog_enabled(false, &mut usec) || usec == 0 {
        return;
    }
    let every = Duration::from_micros(usec) / 2;
    tokio::spawn(async move {
        while !WORKING.load(Ordering::SeqCst) {
            notify(&[NotifyState::Watchdog]);
            tokio::time::sleep(every).await;
        }
    });
}

/// The work stops to hand the identity over (see [`HANDING_OVER`]).
pub fn handing_over() {
    HANDING_OVER.store(true, Ordering::SeqCst);
    notify(&[NotifyState::Status("handing the identity over")]);
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
    WORKING.store(true, Ordering::SeqCst);
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
