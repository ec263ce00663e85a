//! A real etcd cluster (Debian's `etcd-server`, installed by `ops/test.sh`)
//! for the fleet's tests: N members on free ports, each a child process
//! with its data and log under the test's folder, killed when dropped.
//!
//! Clients listen on every address (so processes in the tests' network
//! namespaces reach them through their veth pair) and advertise loopback.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The etcd binary: `TAILFLIGHT_ETCD`, else the one on PATH.
pub fn etcd_binary() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TAILFLIGHT_ETCD") {
        return Some(PathBuf::from(path));
    }
    let found = Command::new("sh")
        .args(["-c", "command -v etcd"])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
    (found.status.success() && !path.is_empty()).then(|| PathBuf::from(path))
}

struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

pub struct EtcdCluster {
    dir: PathBuf,
    binary: PathBuf,
    initial_cluster: String,
    members: Vec<Member>,
}

impl EtcdCluster {
    /// Starts `size` members under `dir` and waits until the cluster has a
    /// leader. Panics if etcd is not installed: `ops/test.sh` installs it.
    pub fn start(dir: &Path, size: usize) -> Self {
        let binary = etcd_binary().expect(
            "etcd is not installed (ops/test.sh installs Debian's etcd-server; or set TAILFLIGHT_ETCD)",
        );
        std::fs::create_dir_all(dir).unwrap();
        let mut members = Vec::new();
        let mut taken = std::collections::BTreeSet::new();
        let mut port = || loop {
            let p = super::free_port();
            if taken.insert(p) {
                break p;
            }
        };
        for i in 1..=size {
            members.push(Member {
                name: format!("e{i}"),
                client_port: port(),
                peer_port: port(),
                child: None,
            });
        }
        let initial_cluster = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = Self {
            dir: dir.to_path_buf(),
            binary,
            initial_cluster,
            members,
        };
        for i in 0..size {
            cluster.start_member(i, "new");
        }
        cluster.wait_healthy(Duration::from_secs(60));
        cluster
    }

    fn start_member(&mut self, i: usize, state: &str) {
        let member = &self.members[i];
        assert!(member.child.is_none());
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{}.log", member.name)))
            .unwrap();
        let child = Command::new(&self.binary)
            .args([
                "--name",
                &member.name,
                "--data-dir",
                &self.dir.join(&member.name).display().to_string(),
                "--listen-peer-urls",
                &format!("http://127.0.0.1:{}", member.peer_port),
                "--initial-advertise-peer-urls",
                &format!("http://127.0.0.1:{}", member.peer_port),
                "--listen-client-urls",
                &format!("http://0.0.0.0:{}", member.client_port),
                "--advertise-client-urls",
                &format!("http://127.0.0.1:{}", member.client_port),
                "--initial-cluster",
                &self.initial_cluster,
                "--initial-cluster-state",
                state,
                "--initial-cluster-token",
                "tailflight-test",
                // Quick elections on a loaded two-core machine.
                "--heartbeat-interval",
                "100",
                "--election-timeout",
                "1000",
            ])
            .env("ETCD_UNSUPPORTED_ARCH", "")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start etcd: {e}"));
        self.members[i].child = Some(child);
    }

    /// `etcd://127.0.0.1:P1,127.0.0.1:P2,...`
    pub fn url(&self) -> String {
        self.url_via("127.0.0.1")
    }

    /// The same ports through another address of this host (a veth's).
    pub fn url_via(&self, address: &str) -> String {
        format!(
            "etcd://{}",
            self.members
                .iter()
                .map(|m| format!("{address}:{}", m.client_port))
                .collect::<Vec<_>>()
                .join(",")
        )
    }

    fn client_endpoints(&self) -> String {
        self.members
            .iter()
            .filter(|m| m.child.is_some())
            .map(|m| format!("http://127.0.0.1:{}", m.client_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Runs `etcdctl` against the running members; (success, output).
    pub fn ctl(&self, args: &[&str]) -> (bool, String) {
        let output = Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.client_endpoints()))
            .args(["--command-timeout=3s", "--dial-timeout=2s"])
            .args(args)
            .output()
            .expect("run etcdctl");
        let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stderr));
        (output.status.success(), text)
    }

    /// The value of `key`, if it exists.
    pub fn get(&self, key: &str) -> Option<String> {
        let (ok, text) = self.ctl(&["get", key, "--print-value-only"]);
        let value = text.trim();
        (ok && !value.is_empty()).then(|| value.to_string())
    }

    pub fn wait_healthy(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let (ok, text) = self.ctl(&["endpoint", "health", "--cluster"]);
            if ok {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "etcd did not become healthy: {text}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGKILL member `i` (0-based).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.members[i].child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts member `i` again on its data directory.
    pub fn restart(&mut self, i: usize) {
        self.start_member(i, "existing");
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
