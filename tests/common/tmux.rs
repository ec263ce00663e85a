//! A tmux session on a tmux server of the test's own, for terminal views.

/// A tmux session running `tailflight top` on a tmux server of the test's
/// own (its socket named after the session), killed when dropped.
pub struct Tmux(String);

fn tmux(session: &str) -> std::process::Command {
    let mut command = std::process::Command::new("tmux");
    command.args(["-L", session]);
    command
}

impl Tmux {
    pub fn start(name: &str, width: u16, command: &str) -> Self {
        let status = tmux(name)
            .args([
                "new-session",
                "-d",
                "-s",
                name,
                "-x",
                &width.to_string(),
                "-y",
                "40",
                command,
            ])
            .status()
            .expect("run tmux (ops/test.sh installs it)");
        assert!(status.success(), "tmux new-session");
        Self(name.to_string())
    }

    pub fn capture(&self) -> String {
        let out = tmux(&self.0)
            .args(["capture-pane", "-p", "-t", &self.0])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `keys` into the session.
    pub fn send_keys(&self, keys: &str) {
        let _ = tmux(&self.0)
            .args(["send-keys", "-t", &self.0, keys])
            .status();
    }

    pub fn alive(&self) -> bool {
        tmux(&self.0)
            .args(["has-session", "-t", &self.0])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = tmux(&self.0)
            .args(["kill-server"])
            .stderr(std::process::Stdio::null())
            .status();
    }
}
