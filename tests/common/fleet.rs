//! A fleet under one test folder for the fleet tests: a real 3-member etcd
//! cluster, a shared directory (the tests' parallel filesystem), sink
//! identities' processes on named "hosts", watchers and simulators.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::etcd::EtcdCluster;
use super::*;

pub const CLUSTER: &str = "test";

/// A fleet under one test folder: etcd, a shared directory, the sink
/// processes of each identity, watchers and simulators.
pub struct Fleet {
    pub dir: PathBuf,
    pub etcd: EtcdCluster,
    pub ttl: &'static str,
    /// (identity, "host" name, process).
    pub sinks: Vec<(String, String, Proc)>,
    pub watchers: Vec<Proc>,
}

impl Fleet {
    pub fn start(dir: &Path, ttl: &'static str) -> Self {
        let etcd = EtcdCluster::start(&dir.join("etcd"), 3);
        std::fs::create_dir_all(dir.join("shared/dest")).unwrap();
        Self {
            dir: dir.to_path_buf(),
            etcd,
            ttl,
            sinks: Vec::new(),
            watchers: Vec::new(),
        }
    }

    pub fn shared(&self) -> PathBuf {
        self.dir.join("shared")
    }

    pub fn state_of(&self, identity: &str) -> PathBuf {
        self.shared().join(format!("state-{identity}"))
    }

    pub fn dest(&self) -> PathBuf {
        self.shared().join("dest")
    }

    pub fn sink_args(&self, identity: &str, port: u16, extra: &[&str]) -> Vec<String> {
        let mut args = strings(&["sink", "--identity", identity, "--cluster", CLUSTER]);
        args.extend(["--coordinator".into(), self.etcd.url()]);
        args.extend(["--lease-ttl".into(), self.ttl.into()]);
        args.extend(["--root".into(), self.dest().display().to_string()]);
        args.extend([
            "--state".into(),
            self.state_of(identity).display().to_string(),
        ]);
        args.extend(["--listen".into(), format!("127.0.0.1:{port}")]);
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    }

    /// Starts a sink process for `identity` on `host` (a name for the
    /// logs: the tests' hosts share this machine and the shared directory).
    pub fn start_sink(&mut self, identity: &str, host: &str) -> usize {
        self.start_sink_with(identity, host, &[])
    }

    pub fn start_sink_with(&mut self, identity: &str, host: &str, extra: &[&str]) -> usize {
        let port = free_port();
        let mut args = self.sink_args(identity, port, extra);
        args.extend(["--node-name".into(), host.into()]);
        let name = format!("sink-{identity}-{host}");
        let proc = Proc::spawn(&self.dir, &name, &args);
        self.sinks.push((identity.into(), host.into(), proc));
        self.sinks.len() - 1
    }

    /// Starts a sink process for `identity` inside network namespace `ns`
    /// (a host of its own, reaching etcd through its veth pair).
    pub fn start_sink_in(&mut self, identity: &str, ns: &netns::NetNs) -> usize {
        let port = free_port();
        let mut args = self.sink_args(identity, port, &[]);
        let at = args.iter().position(|a| a == "--coordinator").unwrap();
        args[at + 1] = self.etcd.url_via(&ns.host_address());
        let at = args.iter().position(|a| a == "--listen").unwrap();
        args[at + 1] = format!("{}:{port}", ns.address);
        let name = format!("sink-{identity}-{}", ns.name);
        let prefix = strings(&["ip", "netns", "exec", ns.name.as_str()]);
        let proc = Proc::spawn_through(&self.dir, &name, &prefix, &args);
        self.sinks.push((identity.into(), ns.name.clone(), proc));
        self.sinks.len() - 1
    }

    /// What etcd says of `identity`'s active process.
    pub fn active_member(&self, identity: &str) -> Option<serde_json::Value> {
        self.etcd
            .get(&format!("/tailflight/{CLUSTER}/sinks/{identity}"))
            .and_then(|text| serde_json::from_str(&text).ok())
    }

    /// The endpoint `identity` is served at now, once it serves.
    pub fn endpoint_of(&self, identity: &str) -> Option<String> {
        self.active_member(identity)?
            .get("endpoint")?
            .as_str()
            .map(String::from)
    }

    /// Waits until process `index` is the one serving its identity.
    pub fn wait_serving(&mut self, index: usize) {
        let identity = self.sinks[index].0.clone();
        let pid = self.sinks[index].2.pid();
        wait_until(
            &format!("{} to serve {identity}", self.sinks[index].2.name),
            Duration::from_secs(60),
            || {
                self.active_member(&identity).is_some_and(|member| {
                    member["pid"].as_i64().map(|p| p as i32) == pid
                        && member["endpoint"].is_string()
                })
            },
        );
    }

    /// Waits until process `index` says it is a standby.
    pub fn wait_standby(&self, index: usize) {
        let proc = &self.sinks[index].2;
        wait_until(
            &format!("{} to be a standby", proc.name),
            Duration::from_secs(30),
            || proc.log_text().contains("standby"),
        );
    }

    /// A watcher of `source` and a simulator writing into it for
    /// `duration`, once bytes have arrived: (the source's folder, the
    /// simulator).
    pub fn start_load(&mut self, source: &str, duration: &str, extra: &[&str]) -> (PathBuf, Proc) {
        let dir = self.start_watcher(source, extra);
        let sim =
            simulate_in_background(&self.dir, &dir, &workload("run1", "2", "256KiB", duration));
        wait_some_bytes(self, source);
        (dir, sim)
    }

    pub fn start_watcher(&mut self, source: &str, extra: &[&str]) -> PathBuf {
        let dir = self.dir.join(format!("source-{source}"));
        std::fs::create_dir_all(&dir).unwrap();
        let mut args = strings(&[
            "watch",
            "--source",
            source,
            "--seal-idle",
            "1s",
            "--rescan",
            "1s",
        ]);
        args.extend(["--dir".into(), dir.display().to_string()]);
        args.extend([
            "--state".into(),
            self.dir
                .join(format!("watch-state-{source}"))
                .display()
                .to_string(),
        ]);
        args.extend(["--coordinator".into(), self.etcd.url()]);
        args.extend(["--cluster".into(), CLUSTER.into()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let proc = Proc::spawn(&self.dir, &format!("watcher-{source}"), &args);
        self.watchers.push(proc);
        dir
    }

    /// Files sealed by every identity's active process.
    pub fn sealed_files(&self, identities: &[&str]) -> u64 {
        identities
            .iter()
            .filter_map(|identity| self.endpoint_of(identity))
            .filter_map(|endpoint| sink_status(&endpoint, &[]))
            .map(|status| status_u64(&status, "sealed_files"))
            .sum()
    }

    pub fn logs(&self) -> String {
        let mut text = String::new();
        for (_, _, proc) in &self.sinks {
            text.push_str(&format!(
                "--- {} ---\n{}\n",
                proc.name,
                last_lines(&proc.log_text())
            ));
        }
        for proc in &self.watchers {
            text.push_str(&format!(
                "--- {} ---\n{}\n",
                proc.name,
                last_lines(&proc.log_text())
            ));
        }
        text
    }

    /// Waits until every source is identical at the destination and every
    /// file sealed, then stops everything and audits every identity.
    pub fn finish(&mut self, sources: &[(&str, &Path, &str)], identities: &[&str]) {
        self.wait_complete(sources, identities);
        self.stop_and_audit(identities);
    }

    /// Waits until every source is identical at the destination and every
    /// file sealed by its identity's active process. Returns the number of
    /// files.
    pub fn wait_complete(&self, sources: &[(&str, &Path, &str)], identities: &[&str]) -> u64 {
        let mut files = 0;
        for (_, dir, run) in sources {
            files += files_of_run(dir, run);
        }
        for (source, dir, _) in sources {
            let dest = self.dest().join(source);
            let deadline = std::time::Instant::now() + Duration::from_secs(180);
            loop {
                let (ok, text) = verify(dir, &dest);
                if ok {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "{source} never became identical: {text}\n{}",
                    self.logs()
                );
                std::thread::sleep(Duration::from_millis(500));
            }
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while self.sealed_files(identities) < files {
            assert!(
                std::time::Instant::now() < deadline,
                "not every file was sealed ({} of {files})\n{}",
                self.sealed_files(identities),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        files
    }

    /// Stops every process and audits every identity's manifest.
    pub fn stop_and_audit(&mut self, identities: &[&str]) {
        for watcher in &mut self.watchers {
            watcher.stop();
        }
        for (_, _, sink) in &mut self.sinks {
            sink.stop();
        }
        for identity in identities {
            assert_clean_audit(&self.state_of(identity));
        }
    }
}

pub fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(25)..].join("\n")
}

/// Waits until something of `source` has arrived at the destination.
pub fn wait_some_bytes(fleet: &Fleet, source: &str) {
    let dest = fleet.dest().join(source);
    wait_until(
        &format!("bytes of {source} at the destination"),
        Duration::from_secs(60),
        || tree_bytes(&dest) > 256 << 10,
    );
}
