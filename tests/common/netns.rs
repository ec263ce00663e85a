//! A network namespace of the test's own, joined to the host by a veth
//! pair (`10.252.N.1` on the host, `10.252.N.2` inside), for cutting the
//! link between a watcher and a sink. Made with `ip` (needs root; a test
//! that cannot make one says so and checks nothing); removed when dropped,
//! which removes the veth pair with it.

use std::process::Command;

pub struct NetNs {
    pub name: String,
    host_if: String,
    /// The sink's address inside.
    pub address: String,
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .status()
        .is_ok_and(|status| status.success())
}

impl NetNs {
    /// `None` (with a message) where namespaces cannot be made.
    pub fn create(tag: &str) -> Option<Self> {
        static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let id = std::process::id();
        // Tests of one process run at once: each namespace its own names
        // and /24.
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 5;
        let name = format!("tf{tag}{id}");
        let host_if = format!("tfh{n}x{}", id % 100_000);
        let ns_if = format!("tfn{n}x{}", id % 100_000);
        let subnet = format!("10.252.{}", (id % 50) * 5 + n + 1);
        let _ = Command::new("ip").args(["netns", "del", &name]).status();
        if !ip(&["netns", "add", &name]) {
            super::cannot_run("cannot make a network namespace (needs root)");
            return None;
        }
        let made = Self {
            address: format!("{subnet}.2"),
            name: name.clone(),
            host_if: host_if.clone(),
        };
        let inside = |args: &[&str]| {
            let mut all = vec!["netns", "exec", name.as_str(), "ip"];
            all.extend_from_slice(args);
            ip(&all)
        };
        let ok = ip(&[
            "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if,
        ]) && ip(&["link", "set", &ns_if, "netns", &name])
            && ip(&["addr", "add", &format!("{subnet}.1/24"), "dev", &host_if])
            && ip(&["link", "set", &host_if, "up"])
            && inside(&["addr", "add", &format!("{subnet}.2/24"), "dev", &ns_if])
            && inside(&["link", "set", &ns_if, "up"])
            && inside(&["link", "set", "lo", "up"]);
        assert!(ok, "setting up the veth pair of {name} failed");
        Some(made)
    }

    /// The host's address on the veth pair, as seen from inside.
    pub fn host_address(&self) -> String {
        match self.address.rsplit_once('.') {
            Some((subnet, _)) => format!("{subnet}.1"),
            None => self.address.clone(),
        }
    }

    /// Takes the host's end of the link down (`false`) or up again.
    pub fn link(&self, up: bool) {
        let state = if up { "up" } else { "down" };
        assert!(
            ip(&["link", "set", &self.host_if, state]),
            "ip link set {} {state} failed",
            self.host_if
        );
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
    }
}
