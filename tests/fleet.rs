//! A fleet with failover: sink and watcher identities leased through a
//! real 3-member etcd cluster, their state in one shared directory (the
//! tests' parallel filesystem), taken over by a standby when the active
//! process dies, freezes or loses its lease.
//!
//! Every test ends with every file identical at the destination and every
//! identity's manifest auditing clean (no range recorded twice); where the
//! Kafka relay is on, a read_committed consumer sees each event once.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::fleet::*;
use common::kafka::{KafkaBroker, check_events, consume};
use common::*;

const TOPIC: &str = "tailflight.events";

/// Test 1: two hosts, four sink identities (each host active for two and
/// standby for the other two), three watchers; `kill -9` of an active sink
/// mid-transfer: its standby takes over and nothing is lost or doubled.
#[test]
fn a_standby_takes_over_a_killed_active_sink() {
    let dir = scratch("fleet-kill");
    let mut fleet = Fleet::start(&dir, "3s");
    let identities = ["a", "b", "c", "d"];
    // Host 1 is active for a and b, host 2 for c and d.
    let mut actives = Vec::new();
    for (identity, host) in [("a", "h1"), ("b", "h1"), ("c", "h2"), ("d", "h2")] {
        let index = fleet.start_sink(identity, host);
        fleet.wait_serving(index);
        actives.push(index);
    }
    let mut standbys = Vec::new();
    for (identity, host) in [("a", "h2"), ("b", "h2"), ("c", "h1"), ("d", "h1")] {
        standbys.push(fleet.start_sink(identity, host));
    }
    for &index in &standbys {
        let name = fleet.sinks[index].2.name.clone();
        wait_until(
            &format!("{name} to be a standby"),
            Duration::from_secs(30),
            || fleet.sinks[index].2.log_text().contains("standby"),
        );
    }
    let mut sources = Vec::new();
    let mut sims = Vec::new();
    for source in ["s1", "s2", "s3"] {
        let dir = fleet.start_watcher(source, &[]);
        sims.push(simulate_in_background(
            &fleet.dir,
            &dir,
            &workload("run1", "2", "256KiB", "6s"),
        ));
        sources.push((source, dir));
    }
    wait_some_bytes(&fleet, "s1");
    // kill -9 the active process of identity a, mid-transfer.
    let victim = actives[0];
    let old_endpoint = fleet.endpoint_of("a");
    fleet.sinks[victim].2.kill9();
    let successor = standbys[0];
    fleet.wait_serving(successor);
    assert_ne!(
        fleet.endpoint_of("a"),
        old_endpoint,
        "a is served elsewhere"
    );
    for sim in &mut sims {
        sim.stop();
    }
    let sources: Vec<(&str, &Path, &str)> = sources
        .iter()
        .map(|(source, dir)| (*source, dir.as_path(), "run1"))
        .collect();
    fleet.finish(&sources, &identities);
    // The successor resumed identity a's state: it did not start empty.
    let audit = audit(&fleet.state_of("a"));
    assert!(audit["files"].as_u64().unwrap_or(0) > 0, "{audit}");
}

/// The relay across takeovers: identity a's commit events, published by
/// its first active process and then by each standby that took it over
/// after a `kill -9`, reach a read_committed consumer exactly once, and per
/// file they cover the file once and in order and end with a seal whose
/// digest matches the destination. The relay's transactional id is the
/// identity's sink id, which lives in the shared state: each successor's
/// producer fences its predecessor's open transaction.
#[test]
fn takeovers_publish_each_kafka_event_once() {
    let dir = scratch("fleet-kafka");
    let broker = KafkaBroker::start(&dir.join("kafka"), 4);
    let mut fleet = Fleet::start(&dir, "3s");
    let bootstrap = broker.bootstrap();
    let kafka = [
        "--kafka-brokers",
        bootstrap.as_str(),
        "--kafka-topic",
        TOPIC,
    ];
    let first = fleet.start_sink_with("a", "h1", &kafka);
    fleet.wait_serving(first);
    let second = fleet.start_sink_with("a", "h2", &kafka);
    fleet.wait_standby(second);
    let dir_s1 = fleet.start_watcher("s1", &[]);
    let mut sim = simulate_in_background(
        &fleet.dir,
        &dir_s1,
        &workload("run1", "3", "256KiB", "600s"),
    );
    wait_some_bytes(&fleet, "s1");
    // Two takeovers while events flow: h1 → h2, then h2 → h1 (h1's
    // process restarted as the standby in between).
    fleet.sinks[first].2.kill9();
    fleet.wait_serving(second);
    fleet.sinks[first].2.start();
    fleet.wait_standby(first);
    wait_published_more(&fleet, "a");
    fleet.sinks[second].2.kill9();
    fleet.wait_serving(first);
    wait_published_more(&fleet, "a");
    sim.stop();
    let files = fleet.wait_complete(&[("s1", &dir_s1, "run1")], &["a"]);
    let published = wait_all_published(&fleet, "a");
    let events = consume(&bootstrap, TOPIC);
    let count = check_events(&events, &fleet.dest(), files);
    assert_eq!(count as u64, status_u64(&published, "recorded_through"));
    println!("{count} events for {files} files across two takeovers");
    fleet.stop_and_audit(&["a"]);
}

/// The events section of `identity`'s active process's status.
fn events_of(fleet: &Fleet, identity: &str) -> Option<serde_json::Value> {
    let endpoint = fleet.endpoint_of(identity)?;
    sink_status(&endpoint, &[])?.get("events").cloned()
}

/// Waits until `identity`'s active process has published an event that
/// it recorded itself (past what was recorded when it took over).
fn wait_published_more(fleet: &Fleet, identity: &str) {
    let mut first_seen = None;
    wait_until(
        &format!("the relay of {identity}'s new active process to publish"),
        Duration::from_secs(60),
        || {
            let Some(events) = events_of(fleet, identity) else {
                return false;
            };
            let recorded = status_u64(&events, "recorded_through");
            let published = status_u64(&events, "published_through");
            let start = *first_seen.get_or_insert(recorded);
            published > start
        },
    );
}

/// Waits until `identity`'s relay has published everything it recorded;
/// returns its events status.
fn wait_all_published(fleet: &Fleet, identity: &str) -> serde_json::Value {
    common::kafka::wait_published(
        || events_of(fleet, identity),
        Duration::from_secs(120),
        || fleet.logs(),
    )
}

/// Test 3: an active frozen (SIGSTOP) for longer than its TTL: the standby
/// takes the lease but waits for the state directory's lock; once the
/// frozen process resumes, it finds its lease gone, fences, and the
/// standby completes the handover. Nothing lost or doubled.
#[test]
fn a_frozen_active_is_fenced_when_it_resumes_and_its_standby_takes_over() {
    let dir = scratch("fleet-frozen");
    let mut fleet = Fleet::start(&dir, "2s");
    let first = fleet.start_sink("a", "h1");
    fleet.wait_serving(first);
    // The standby shows its role on its metrics listener.
    let metrics_port = free_port();
    let listen = format!("127.0.0.1:{metrics_port}");
    let second = fleet.start_sink_with("a", "h2", &["--metrics-listen", listen.as_str()]);
    fleet.wait_standby(second);
    let role_of = |port: u16| {
        http_get(port, "/api/status")
            .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
            .and_then(|status| status["fleet"]["role"].as_str().map(String::from))
    };
    wait_until(
        "the standby's status to say so",
        Duration::from_secs(30),
        || role_of(metrics_port).as_deref() == Some("standby"),
    );
    let (source_dir, mut sim) = fleet.start_load("s1", "6s", &[]);
    let frozen_pid = fleet.sinks[first].2.pid();
    signal(frozen_pid, libc::SIGSTOP);
    // The standby wins the lease once it expires, but the frozen process
    // still holds the manifest's lock.
    wait_until(
        "the standby to wait for the lock",
        Duration::from_secs(30),
        || {
            fleet.sinks[second]
                .2
                .log_text()
                .contains("waiting for the previous process to let go")
        },
    );
    assert!(
        fleet.endpoint_of("a").is_none(),
        "no endpoint is published while the lock is held"
    );
    wait_until(
        "its status to say it waits for the lock",
        Duration::from_secs(30),
        || role_of(metrics_port).as_deref() == Some("waiting_for_lock"),
    );
    let (_, metrics) = http_get(metrics_port, "/metrics").expect("metrics");
    assert!(
        metrics.contains(r#"tailflight_fleet_role{identity="a",role="waiting_for_lock"} 1"#),
        "{metrics}"
    );
    std::thread::sleep(Duration::from_secs(2));
    signal(frozen_pid, libc::SIGCONT);
    fleet.wait_serving(second);
    wait_until(
        "the frozen process to fence itself",
        Duration::from_secs(30),
        || fleet.sinks[first].2.log_text().contains("fenced"),
    );
    wait_until(
        "the new active's status to say so",
        Duration::from_secs(30),
        || role_of(metrics_port).as_deref() == Some("active"),
    );
    let status = sink_status(&fleet.endpoint_of("a").unwrap(), &[]).expect("status");
    assert_eq!(status["fleet"]["role"], "active", "{status}");
    assert!(
        status["fleet"]["epoch"].as_i64().unwrap_or(0) > 0,
        "{status}"
    );
    // It started over as a standby (same pid, a new image).
    assert!(fleet.sinks[first].2.is_running(), "{}", fleet.logs());
    sim.stop();
    fleet.finish(&[("s1", &source_dir, "run1")], &["a"]);
}

/// Test 5: two watcher processes for one watcher identity, its state in
/// the shared directory; `kill -9` of the active: the standby resumes
/// from the shared checkpoint.
#[test]
fn a_standby_watcher_resumes_from_the_shared_checkpoint() {
    let dir = scratch("fleet-watcher");
    let mut fleet = Fleet::start(&dir, "2s");
    let sink = fleet.start_sink("a", "h1");
    fleet.wait_serving(sink);
    let shared_state = fleet.shared().join("watch-state-w");
    let state_arg = shared_state.display().to_string();
    let extra = [
        "--identity",
        "w",
        "--lease-ttl",
        "2s",
        "--state",
        state_arg.as_str(),
    ];
    let (source_dir, mut sim) = fleet.start_load("s1", "6s", &extra);
    let active = fleet.watchers.len() - 1;
    // The standby, on the other host, with the same identity and state.
    let mut args = fleet.watchers[active].args().to_vec();
    let metrics_port = free_port();
    args.extend(strings(&["--log", "info", "--metrics-listen"]));
    args.push(format!("127.0.0.1:{metrics_port}"));
    let standby = Proc::spawn(&fleet.dir, "watcher-s1-h2", &args);
    wait_until(
        "the second watcher to be a standby",
        Duration::from_secs(30),
        || standby.log_text().contains("standby"),
    );
    // Its status says it stands by, and for which process: not an empty,
    // stalled watcher.
    let status_of_standby = || {
        http_get(metrics_port, "/api/status")
            .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
    };
    let active_pid = fleet.watchers[active].pid();
    wait_until(
        "the standby's status to name the active watcher",
        Duration::from_secs(30),
        || {
            status_of_standby().is_some_and(|status| {
                status["fleet"]["active"]["pid"].as_i64().map(|p| p as i32) == active_pid
            })
        },
    );
    let status = status_of_standby().expect("the standby's status");
    assert_eq!(status["phase"], "standby", "{status}");
    assert_eq!(status["ready"], false, "{status}");
    assert_eq!(status["fleet"]["identity"], "w", "{status}");
    assert!(status.get("sources").is_none(), "{status}");
    let dom = common::browser::headless(
        &format!("http://127.0.0.1:{metrics_port}/"),
        &strings(&["--dump-dom"]),
    );
    assert!(
        dom.contains("data-loaded=\"1\""),
        "the page's script ran: {dom}"
    );
    assert!(
        dom.contains("data-identity=\"w\" data-fleet-role=\"standby\""),
        "the page shows the standby: {dom}"
    );
    fleet.watchers[active].kill9();
    wait_until(
        "the standby watcher to take over",
        Duration::from_secs(30),
        || standby.log_text().contains("now active for the identity"),
    );
    fleet.watchers.push(standby);
    sim.stop();
    fleet.finish(&[("s1", &source_dir, "run1")], &["a"]);
}

/// A process given another state directory than the identity's is
/// refused before it opens or creates anything, with both directories named.
#[test]
fn a_state_directory_that_is_not_the_identitys_is_refused() {
    let dir = scratch("fleet-wrong-state");
    let mut fleet = Fleet::start(&dir, "2s");
    let first = fleet.start_sink("a", "h1");
    fleet.wait_serving(first);
    fleet.sinks[first].2.stop();
    // The same identity on a "host" where the shared directory is not mounted.
    let local = dir.join("not-shared");
    let mut args = fleet.sink_args("a", free_port(), &[]);
    let at = args.iter().position(|a| a == "--state").unwrap();
    args[at + 1] = local.display().to_string();
    let (ok, text) = run(&args);
    assert!(!ok, "refused: {text}");
    assert!(text.contains("is not identity a's"), "{text}");
    assert!(
        text.contains(&fleet.state_of("a").display().to_string()),
        "{text}"
    );
    assert!(
        !local.join("CURRENT").exists(),
        "nothing was created in the wrong directory"
    );
}

/// A process for the identity on a "host" that mounts another directory
/// as the destination root (the shared root not mounted: an empty stand-in)
/// is refused once it holds the identity, before it places or replays
/// anything: it would go on writing the identity's files there after holes
/// where their placed bytes were.
#[test]
fn a_root_that_is_not_the_identitys_is_refused() {
    let dir = scratch("fleet-wrong-root");
    let mut fleet = Fleet::start(&dir, "2s");
    let first = fleet.start_sink("a", "h1");
    fleet.wait_serving(first);
    let (source_dir, mut sim) = fleet.start_load("s1", "2s", &[]);
    sim.stop();
    fleet.wait_complete(&[("s1", &source_dir, "run1")], &["a"]);
    fleet.sinks[first].2.stop();
    let stand_in = dir.join("not-mounted");
    std::fs::create_dir_all(&stand_in).unwrap();
    let mut args = fleet.sink_args("a", free_port(), &[]);
    let at = args.iter().position(|a| a == "--root").unwrap();
    args[at + 1] = stand_in.display().to_string();
    let (ok, text) = run(&args);
    assert!(!ok, "refused: {text}");
    assert!(text.contains("is the shared root mounted"), "{text}");
    assert!(text.contains(&stand_in.display().to_string()), "{text}");
    assert_eq!(
        list_files(&stand_in),
        Vec::<String>::new(),
        "nothing was written into the stand-in"
    );
    assert!(
        !stand_in.join(ROOT_MARK).exists(),
        "the stand-in was not marked"
    );
}

/// Without etcd at startup, `--coordinator-unreachable exit` names the
/// endpoints it tried and exits; `wait` (the default) keeps trying.
#[test]
fn an_unreachable_coordinator_is_named() {
    let dir = scratch("fleet-unreachable");
    let port = free_port();
    let mut args = strings(&["sink", "--identity", "a", "--coordinator"]);
    args.push(format!("etcd://127.0.0.1:{port}"));
    args.extend(strings(&[
        "--coordinator-unreachable",
        "exit",
        "--lease-ttl",
        "2s",
    ]));
    args.extend(["--root".into(), dir.join("dest").display().to_string()]);
    args.extend(["--state".into(), dir.join("state").display().to_string()]);
    args.extend(["--listen".into(), format!("127.0.0.1:{}", free_port())]);
    let (ok, text) = run(&args);
    assert!(!ok, "{text}");
    assert!(text.contains("unreachable"), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
}

/// The time stamp of the first line of `log` containing `text`, as logged.
fn logged_at(log: &str, text: &str) -> Option<String> {
    log.lines().find(|line| line.contains(text)).map(|line| {
        strip_ansi(line)
            .split(' ')
            .next()
            .unwrap_or_default()
            .to_string()
    })
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Descriptors process `pid` holds open under `dir`.
fn descriptors_under(pid: i32, dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| std::fs::read_link(entry.path()).ok())
        .filter(|target| target.starts_with(dir))
        .collect()
}

/// Test 2: a zombie. The active host's link is cut (its namespace's veth
/// down) while it keeps the shared directory: it fences within the TTL,
/// the standby takes over only after that, the zombie holds nothing of the
/// identity once fenced (no descriptor under the shared directory), and it
/// rejoins as a standby when the link comes back.
#[test]
fn a_cut_off_active_fences_before_its_standby_takes_over() {
    let dir = scratch("fleet-zombie");
    let Some(ns) = netns::NetNs::create("fz") else {
        return;
    };
    let mut fleet = Fleet::start(&dir, "3s");
    let zombie = fleet.start_sink_in("a", &ns);
    fleet.wait_serving(zombie);
    let standby = fleet.start_sink("a", "h2");
    fleet.wait_standby(standby);
    let (source_dir, mut sim) = fleet.start_load("s1", "8s", &[]);
    ns.link(false);
    fleet.wait_serving(standby);
    let zombie_log = fleet.sinks[zombie].2.log_text();
    let fenced = logged_at(&zombie_log, "fenced:").unwrap_or_else(|| {
        panic!(
            "the zombie fenced before its standby took over\n{}",
            fleet.logs()
        )
    });
    let took_over = logged_at(
        &fleet.sinks[standby].2.log_text(),
        "now active for the identity",
    )
    .expect("the standby's claim is logged");
    assert!(
        fenced < took_over,
        "the zombie fenced ({fenced}) before the standby took over ({took_over})"
    );
    let pid = fleet.sinks[zombie].2.pid().unwrap();
    let held = descriptors_under(pid, &fleet.shared());
    assert!(held.is_empty(), "the fenced zombie still holds {held:?}");
    ns.link(true);
    wait_until(
        "the zombie to rejoin as a standby",
        Duration::from_secs(60),
        || {
            let log = fleet.sinks[zombie].2.log_text();
            let after = log.split("fenced:").nth(1).unwrap_or_default();
            after.contains("standby: another process is active")
        },
    );
    assert!(descriptors_under(pid, &fleet.shared()).is_empty());
    sim.stop();
    fleet.finish(&[("s1", &source_dir, "run1")], &["a"]);
}

/// Test 4: etcd faults. One member of three killed: no takeover, no fence.
/// Two of three stopped (no quorum): the active fences, as documented, and
/// nothing is acknowledged meanwhile; once quorum returns an identity is
/// taken again and every file completes.
#[test]
fn etcd_losing_a_member_changes_nothing_and_losing_quorum_fences_until_it_returns() {
    let dir = scratch("fleet-etcd");
    // Long enough to ride out the election a killed leader causes (about
    // a second here) with renewals to spare.
    let mut fleet = Fleet::start(&dir, "5s");
    let first = fleet.start_sink("a", "h1");
    fleet.wait_serving(first);
    let second = fleet.start_sink("a", "h2");
    fleet.wait_standby(second);
    let (source_dir, mut sim) = fleet.start_load("s1", "10s", &[]);
    let pid = fleet.sinks[first].2.pid();
    fleet.etcd.kill(0);
    // Several TTLs with one member gone: the same process stays active.
    std::thread::sleep(Duration::from_secs(12));
    let member = fleet.active_member("a").expect("the identity is held");
    assert_eq!(member["pid"].as_i64().map(|p| p as i32), pid, "no takeover");
    assert!(
        !fleet.sinks[first].2.log_text().contains("fenced"),
        "{}",
        fleet.logs()
    );
    // Quorum lost: the active fences (it cannot renew).
    fleet.etcd.kill(1);
    wait_until("the active to fence", Duration::from_secs(30), || {
        fleet.sinks[first].2.log_text().contains("fenced:")
    });
    fleet.etcd.restart(0);
    fleet.etcd.restart(1);
    fleet.etcd.wait_healthy(Duration::from_secs(60));
    wait_until(
        "an identity to serve again",
        Duration::from_secs(60),
        || fleet.endpoint_of("a").is_some(),
    );
    sim.stop();
    fleet.finish(&[("s1", &source_dir, "run1")], &["a"]);
}

/// Test 6: a rolling restart of every sink host under load (SIGTERM, then
/// start again): each planned stop hands its identities over at once, and
/// every file completes identical.
#[test]
fn a_rolling_restart_of_every_sink_host_loses_nothing() {
    let dir = scratch("fleet-rolling");
    let mut fleet = Fleet::start(&dir, "3s");
    let identities = ["a", "b"];
    for (identity, host) in [("a", "h1"), ("b", "h2")] {
        let index = fleet.start_sink(identity, host);
        fleet.wait_serving(index);
    }
    for (identity, host) in [("a", "h2"), ("b", "h1")] {
        fleet.start_sink(identity, host);
    }
    let source_dir = fleet.start_watcher("s1", &[]);
    let mut sim = simulate_in_background(
        &fleet.dir,
        &source_dir,
        &workload("run1", "4", "256KiB", "12s"),
    );
    wait_some_bytes(&fleet, "s1");
    for host in ["h1", "h2"] {
        let on_host: Vec<usize> = (0..fleet.sinks.len())
            .filter(|&i| fleet.sinks[i].1 == host)
            .collect();
        let stopped: Vec<i64> = on_host
            .iter()
            .filter_map(|&i| fleet.sinks[i].2.pid().map(i64::from))
            .collect();
        for &i in &on_host {
            fleet.sinks[i].2.stop();
        }
        // Every identity is served from the other host now.
        for identity in identities {
            wait_until(
                &format!("{identity} to be served while {host} is down"),
                Duration::from_secs(30),
                || {
                    fleet.active_member(identity).is_some_and(|member| {
                        member["endpoint"].is_string()
                            && member["pid"]
                                .as_i64()
                                .is_some_and(|pid| !stopped.contains(&pid))
                    })
                },
            );
        }
        for &i in &on_host {
            fleet.sinks[i].2.start();
        }
        for &i in &on_host {
            let name = fleet.sinks[i].2.name.clone();
            wait_until(
                &format!("{name} to be back as a standby"),
                Duration::from_secs(30),
                || {
                    fleet.sinks[i]
                        .2
                        .log_text()
                        .matches("standby: another process")
                        .count()
                        >= 1
                },
            );
        }
    }
    // The planned stops released their leases: no takeover waited for a TTL.
    for (_, _, proc) in &fleet.sinks {
        let log = proc.log_text();
        if log.contains("now active for the identity") && log.contains("sink serving") {
            assert!(!log.contains("fenced:"), "{}: {log}", proc.name);
        }
    }
    sim.stop();
    fleet.finish(&[("s1", &source_dir, "run1")], &identities);
}

/// etcd with TLS (client certificates required) and authentication: a
/// sink given the CA, its certificate and the user's password holds its
/// identity; a wrong password is refused with etcd's reason, and the
/// endpoints named.
#[test]
fn etcd_with_tls_and_authentication() {
    let dir = scratch("fleet-etcd-tls");
    let certs = dir.join("certs");
    let (ok, text) = run(&strings(&["certs", "--out", &certs.display().to_string()]));
    assert!(ok, "certs: {text}");
    let pem = |name: &str| certs.join(name).display().to_string();
    let binary = common::etcd::etcd_binary().expect("etcd is installed by ops/test.sh");
    let (client_port, peer_port) = (free_port(), free_port());
    let log = std::fs::File::create(dir.join("etcd.log")).unwrap();
    let mut etcd = std::process::Command::new(binary)
        .args([
            "--name",
            "e1",
            "--data-dir",
            &dir.join("e1").display().to_string(),
        ])
        .args([
            "--listen-peer-urls",
            &format!("http://127.0.0.1:{peer_port}"),
        ])
        .args([
            "--initial-advertise-peer-urls",
            &format!("http://127.0.0.1:{peer_port}"),
        ])
        .args([
            "--initial-cluster",
            &format!("e1=http://127.0.0.1:{peer_port}"),
        ])
        .args([
            "--listen-client-urls",
            &format!("https://127.0.0.1:{client_port}"),
        ])
        .args([
            "--advertise-client-urls",
            &format!("https://127.0.0.1:{client_port}"),
        ])
        .args([
            "--cert-file",
            &pem("server.pem"),
            "--key-file",
            &pem("server.key"),
        ])
        .args(["--trusted-ca-file", &pem("ca.pem"), "--client-cert-auth"])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start etcd");
    let ctl = |args: &[&str]| {
        let output = std::process::Command::new("etcdctl")
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints=https://127.0.0.1:{client_port}"))
            .args(["--cacert", &pem("ca.pem"), "--cert", &pem("client.pem")])
            .args(["--key", &pem("client.key"), "--command-timeout=3s"])
            .args(args)
            .output()
            .expect("run etcdctl");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        (output.status.success(), text)
    };
    wait_until("etcd with TLS to answer", Duration::from_secs(60), || {
        ctl(&["endpoint", "health"]).0
    });
    for step in [
        vec!["user", "add", "root:secret-pw"],
        vec!["auth", "enable"],
    ] {
        let (ok, text) = ctl(&step);
        assert!(ok, "etcdctl {step:?}: {text}");
    }
    let sink_args = |password_ok: bool| {
        let mut args = strings(&["sink", "--identity", "a", "--cluster", CLUSTER]);
        args.push("--coordinator".into());
        args.push(format!("etcds://127.0.0.1:{client_port}"));
        args.extend(["--etcd-ca".into(), pem("ca.pem")]);
        args.extend(["--etcd-cert".into(), pem("client.pem")]);
        args.extend(["--etcd-key".into(), pem("client.key")]);
        args.extend(strings(&["--etcd-user", "root", "--lease-ttl", "3s"]));
        args.extend(strings(&["--coordinator-unreachable", "exit"]));
        args.extend(["--root".into(), dir.join("dest").display().to_string()]);
        args.extend(["--state".into(), dir.join("state").display().to_string()]);
        args.extend(["--listen".into(), format!("127.0.0.1:{}", free_port())]);
        let password = if password_ok { "secret-pw" } else { "wrong" };
        (args, password)
    };
    let (args, password) = sink_args(false);
    let mut refused = Proc::spawn_with_env(
        &dir,
        "sink-wrong-password",
        &[],
        &args,
        &[("TAILFLIGHT_ETCD_PASSWORD", password)],
    );
    wait_until(
        "the wrong password to be refused",
        Duration::from_secs(30),
        || !refused.is_running(),
    );
    let text = refused.log_text();
    assert!(text.contains("authentication failed"), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{client_port}")), "{text}");
    let (args, password) = sink_args(true);
    let sink = Proc::spawn_with_env(
        &dir,
        "sink",
        &[],
        &args,
        &[("TAILFLIGHT_ETCD_PASSWORD", password)],
    );
    wait_until(
        "the sink to serve its identity",
        Duration::from_secs(30),
        || sink.log_text().contains("sink serving"),
    );
    let (ok, text) = ctl(&[
        "--user",
        "root:secret-pw",
        "get",
        &format!("/tailflight/{CLUSTER}/sinks/a"),
        "--print-value-only",
    ]);
    assert!(ok && text.contains("\"endpoint\""), "{text}");
    drop(sink);
    let _ = etcd.kill();
    let _ = etcd.wait();
}

/// `tailflight send --coordinator`: a one-shot copy finds the fleet's sink
/// identities in etcd, spreads its files over them, and goes on across a
/// takeover of one of them (`kill -9` of its active process, its standby
/// taking over) to exit 0 with every file sealed and identical.
#[test]
fn a_send_through_the_coordinator_spreads_over_identities_and_outlives_a_takeover() {
    let dir = scratch("fleet-send");
    let mut fleet = Fleet::start(&dir, "3s");
    let mut actives = Vec::new();
    for identity in ["a", "b"] {
        let index = fleet.start_sink(identity, "h1");
        fleet.wait_serving(index);
        actives.push(index);
    }
    let standby = fleet.start_sink("a", "h2");
    wait_until("a's standby", Duration::from_secs(30), || {
        fleet.sinks[standby].2.log_text().contains("standby")
    });
    let tree = dir.join("run5");
    for i in 0..48u32 {
        let sub = tree.join(format!("d{}", i % 4));
        std::fs::create_dir_all(&sub).unwrap();
        let bytes: Vec<u8> = (0..(1u32 << 20))
            .map(|j| (j ^ i.wrapping_mul(2_654_435_761)) as u8)
            .collect();
        std::fs::write(sub.join(format!("f{i:02}.dat")), bytes).unwrap();
    }
    let mut sending = std::process::Command::new(bin())
        .args(["send", "-r", tree.to_str().unwrap(), "s9/2026"])
        .args(["--coordinator", &fleet.etcd.url(), "--cluster", CLUSTER])
        .args(["--settle", "100ms", "--limit-rate", "8MiB", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let landed = fleet.dest().join("s9/2026/run5");
    wait_until("8 MiB at the sinks", Duration::from_secs(60), || {
        tree_bytes(&landed) >= 8 << 20
    });
    fleet.sinks[actives[0]].2.kill9();
    fleet.wait_serving(standby);
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while sending.try_wait().unwrap().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the send did not end after the takeover"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = sending.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{said}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON report");
    let files = report["files"].as_array().unwrap();
    assert_eq!(files.len(), 48);
    assert!(files.iter().all(|f| f["outcome"] == "sealed"), "{report}");
    let (same, diff) = verify(&tree, &landed);
    assert!(same, "{diff}");
    // Both identities hold some of the files.
    for identity in ["a", "b"] {
        let endpoint = fleet.endpoint_of(identity).expect("served");
        let status = sink_status(&endpoint, &[]).expect("the sink answers");
        assert!(
            status_u64(&status, "sealed_files") > 0,
            "{identity}: {status}"
        );
    }
}
