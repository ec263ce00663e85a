//! Debian's headless Chromium, for the tests that check what the status
//! page shows once its script ran.

use std::time::Duration;

use super::wait_until;

/// Killed when dropped, so a failed test leaves no browser behind.
struct Browser(std::process::Child);

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Debian's Chromium, named by TAILFLIGHT_CHROMIUM (ops/test.sh installs it).
fn chromium() -> std::path::PathBuf {
    std::env::var_os("TAILFLIGHT_CHROMIUM")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            panic!("TAILFLIGHT_CHROMIUM names no Chromium: run the suite with ops/test.sh")
        })
}

/// The page's DOM after its scripts ran (headless Chromium), or a screenshot.
pub fn headless(url: &str, extra: &[String]) -> String {
    // A profile per call: two browsers on one profile refuse each other.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let profile = std::env::temp_dir().join(format!("tf-chromium-{}-{call}", std::process::id()));
    let out_path = profile.with_extension("out");
    let out = std::fs::File::create(&out_path).expect("chromium's output file");
    let mut browser = Browser(
        std::process::Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("--virtual-time-budget=5000")
            .args(extra)
            .arg(url)
            .stdout(out)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run chromium"),
    );
    let mut status = None;
    wait_until("chromium exits", Duration::from_secs(120), || {
        status = browser.0.try_wait().ok().flatten();
        status.is_some()
    });
    let _ = std::fs::remove_dir_all(&profile);
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    assert!(status.is_some_and(|s| s.success()), "chromium: {status:?}");
    text
}
