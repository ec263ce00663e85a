//! The fleet as its users see it: Flight consumers that know one member's
//! address (pyarrow, `tailflight tail --coordinator`) follow a source's files
//! across a `kill -9` and a planned handover; operators see every identity
//! of the cluster with its host and role (status page in headless Chromium,
//! `top` in tmux) and are alerted by a real Prometheus while an identity has
//! no active process; a planned handover under load refuses no batch.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::browser::headless;
use common::fleet::*;
use common::prometheus::{dashboard_queries, firing, is_fleet_query, query, start_prometheus};
use common::tmux::Tmux;
use common::*;

/// Runs `tailflight fleet ARGS... --json` against the fleet's etcd; its JSON.
fn fleet_command(fleet: &Fleet, args: &[&str]) -> serde_json::Value {
    let mut command = strings(&["fleet"]);
    command.extend(strings(args));
    command.extend(strings(&[
        "--coordinator",
        &fleet.etcd.url(),
        "--cluster",
        CLUSTER,
        "--json",
    ]));
    let (ok, out) = run(&command);
    assert!(ok, "tailflight {command:?}: {out}");
    // Log lines may come first (stderr): the JSON starts a line.
    let start = out
        .match_indices('{')
        .map(|(at, _)| at)
        .find(|&at| at == 0 || out.as_bytes()[at - 1] == b'\n')
        .unwrap_or_else(|| panic!("no JSON in {out}"));
    // Whatever follows it (stderr) is not part of it.
    serde_json::Deserializer::from_str(&out[start..])
        .into_iter::<serde_json::Value>()
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("no JSON value in {out}"))
}

/// `tailflight fleet handover IDENTITY`: the handover's report.
fn handover(fleet: &Fleet, identity: &str) -> serde_json::Value {
    fleet_command(fleet, &["handover", identity])
}

/// `tailflight fleet`: the cluster as etcd records it.
fn cluster_view(fleet: &Fleet) -> serde_json::Value {
    fleet_command(fleet, &[])
}

fn location_of(endpoint: &str) -> String {
    endpoint.replacen("http://", "grpc+tcp://", 1)
}

/// A sink identity `identity` served by a process on `active_host`, with
/// a standby on `standby_host`: (active's index, standby's index).
fn pair(
    fleet: &mut Fleet,
    identity: &str,
    active_host: &str,
    standby_host: &str,
) -> (usize, usize) {
    let active = fleet.start_sink(identity, active_host);
    fleet.wait_serving(active);
    let standby = fleet.start_sink(identity, standby_host);
    fleet.wait_standby(standby);
    (active, standby)
}

/// The identities holding a file of `source` that is not sealed yet, as a
/// listing through `member` (a Flight location) says.
fn identities_of_open_files(member: &str, source: &str) -> Vec<String> {
    let script = "import json, sys, pyarrow.flight as f\n\
                  c = f.connect(sys.argv[1])\n\
                  for i in c.list_flights((sys.argv[2] + '/**').encode()):\n\
                  \x20   m = json.loads(i.app_metadata)\n\
                  \x20   print(m['identity']) if not m['sealed'] else None\n";
    let out = std::process::Command::new(common::kafka::python())
        .args(["-c", script, member, source])
        .output()
        .expect("run python");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(String::from)
        .collect()
}

/// Test 1 and 2: a pyarrow consumer that knows only one member's address,
/// and `tailflight tail --coordinator`, follow source s1 while the identity
/// of a file being written is taken over twice (`kill -9` of its active,
/// then a planned handover back): both rebuild every file identical, the
/// pyarrow consumer resumes the broken streams at the identity's next
/// process, and no byte arrives twice.
#[test]
fn flight_consumers_follow_files_across_a_kill_and_a_handover() {
    let dir = scratch("fleet-consumers");
    let mut fleet = Fleet::start(&dir, "3s");
    let mut pairs = std::collections::BTreeMap::new();
    for identity in ["a", "b"] {
        pairs.insert(identity, pair(&mut fleet, identity, "h1", "h2"));
    }
    let source = dir.join("source-s1");
    std::fs::create_dir_all(&source).unwrap();
    fleet.start_watcher("s1", &[]);
    // Files of about 20 s each: both takeovers happen while they are written.
    let mut sim = simulate_in_background(&dir, &source, &workload("run1", "4", "32MiB", "24s"));
    wait_some_bytes(&fleet, "s1");
    let any_member = location_of(&fleet.endpoint_of("a").expect("a serves"));
    let open = identities_of_open_files(&any_member, "s1");
    let victim = if open.iter().any(|i| i == "a") {
        "a"
    } else {
        "b"
    };
    let other = if victim == "a" { "b" } else { "a" };
    let member = location_of(&fleet.endpoint_of(other).expect("serving"));
    let (first, standby) = pairs[victim];

    let (flight_out, done, report) = (
        dir.join("flight-out"),
        dir.join("done"),
        dir.join("report.json"),
    );
    let log = std::fs::File::create(dir.join("flight-follow.log")).unwrap();
    let mut consumer = std::process::Command::new(common::kafka::python())
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/tools/flight_follow.py"))
        .args([member.as_str(), "s1"])
        .arg("--out")
        .arg(&flight_out)
        .arg("--done")
        .arg(&done)
        .arg("--report")
        .arg(&report)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("run the pyarrow consumer");
    let tail_out = dir.join("tail-out");
    let mut tail = Proc::spawn(
        &dir,
        "tail",
        &strings(&[
            "tail",
            "--coordinator",
            &fleet.etcd.url(),
            "--cluster",
            CLUSTER,
            "--source",
            "s1",
            "--follow",
            "--out",
            &tail_out.display().to_string(),
        ]),
    );
    std::thread::sleep(Duration::from_secs(3));

    // Takeover 1: kill -9 of the victim's active; its standby takes over.
    fleet.sinks[first].2.kill9();
    fleet.wait_serving(standby);
    // A new standby on h1, then takeover 2: a planned handover to it.
    let third = fleet.start_sink(victim, "h1");
    fleet.wait_standby(third);
    std::thread::sleep(Duration::from_secs(2));
    let handed = handover(&fleet, victim);
    assert_eq!(handed["to"]["host"], "h1", "{handed}");
    fleet.wait_serving(third);
    eprintln!("planned handover of {victim}: {} s", handed["seconds"]);

    sim.wait_for_exit(Duration::from_secs(120));
    let files = fleet.wait_complete(&[("s1", &source, "run1")], &["a", "b"]);
    std::fs::write(&done, files.to_string()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    let exited = loop {
        if let Some(status) = consumer.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the pyarrow consumer never finished"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&report).unwrap_or_default(),
    )
    .unwrap_or_else(|e| {
        panic!(
            "no report ({e}): {}",
            std::fs::read_to_string(dir.join("flight-follow.log")).unwrap_or_default()
        )
    });
    eprintln!("pyarrow consumer: {report}");
    assert!(exited.success() && report["failure"].is_null(), "{report}");
    assert_eq!(report["sealed"].as_u64(), Some(files), "{report}");
    assert_eq!(
        report["bytes"].as_u64(),
        Some(tree_bytes(&source)),
        "{report}"
    );
    // It read the victim's files at three processes and the other's at
    // one, and resumed streams a takeover broke at the identity's next
    // process.
    assert!(
        report["locations"].as_array().is_some_and(|l| l.len() >= 3),
        "{report}"
    );
    assert!(report["resumptions"].as_u64().unwrap_or(0) >= 1, "{report}");
    let (same, text) = verify(&source, &flight_out);
    assert!(same, "the pyarrow consumer's files: {text}");

    // The tail: every file identical, and each byte received once.
    wait_until(
        "the tail rebuilt every file",
        Duration::from_secs(120),
        || verify(&source, &tail_out).0,
    );
    tail.stop();
    let tail_log = tail.log_text();
    let received: u64 = tail_log
        .lines()
        .rev()
        .find_map(|line| {
            line.split_once(" MiB (")?
                .1
                .split_once(" bytes)")?
                .0
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no final count in the tail's log: {tail_log}"));
    assert_eq!(
        received,
        tree_bytes(&source),
        "bytes the tail received, each once"
    );
    assert!(
        tail_log.contains("sink identity a"),
        "the tail followed a across its takeovers: {tail_log}"
    );
    fleet.stop_and_audit(&["a", "b"]);
}

/// Starts a sink process for `identity` on `host` with its status page:
/// (its index, the page's port).
fn start_with_page(fleet: &mut Fleet, identity: &str, host: &str) -> (usize, u16) {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    (
        fleet.start_sink_with(identity, host, &["--metrics-listen", &listen]),
        port,
    )
}

/// Test 3: four identities on two hosts, each process with its status page;
/// the page (headless Chromium) and `top` (tmux) show every identity with
/// its host and role, then the standby active and the takeover counted after
/// a `kill -9`; a real Prometheus fires "identity without an active process"
/// while none is running for it, and clears once one is.
#[test]
fn operators_see_every_identity_and_are_alerted_without_an_active_process() {
    let dir = scratch("fleet-operators");
    let mut fleet = Fleet::start(&dir, "3s");
    let mut actives = Vec::new();
    for (identity, host) in [("a", "h1"), ("b", "h1"), ("c", "h2"), ("d", "h2")] {
        let (index, port) = start_with_page(&mut fleet, identity, host);
        fleet.wait_serving(index);
        actives.push((index, port));
    }
    let mut standbys = Vec::new();
    for (identity, host) in [("a", "h2"), ("b", "h2"), ("c", "h1"), ("d", "h1")] {
        let (index, port) = start_with_page(&mut fleet, identity, host);
        fleet.wait_standby(index);
        standbys.push((index, port));
    }
    // Prometheus scrapes every process, standbys included (a's third
    // process, started later, is not needed: the others report a).
    let metrics: Vec<(&str, String)> = actives
        .iter()
        .chain(&standbys)
        .map(|(_, port)| ("tailflight-sink", format!("127.0.0.1:{port}")))
        .collect();
    let (_prometheus, prometheus) = start_prometheus(&dir, &metrics);
    // The page of c's active process (host h2), and top on it.
    let page_port = actives[2].1;
    let page = || {
        headless(
            &format!("http://127.0.0.1:{page_port}/"),
            &strings(&["--dump-dom"]),
        )
    };
    let members = |dom: &str, role: &str| dom.matches(&format!("data-role=\"{role}\"")).count();
    let mut dom = String::new();
    wait_until(
        "the page shows 4 identities on 2 hosts",
        Duration::from_secs(60),
        || {
            dom = page();
            dom.contains("data-identities=\"4\"")
                && dom.contains("data-nodes=\"2\"")
                && members(&dom, "active") == 4
                && members(&dom, "standby") == 4
        },
    );
    assert!(
        dom.contains("data-identity=\"a\" data-node=\"h1\" data-role=\"active\""),
        "{dom}"
    );
    assert!(
        dom.contains("data-identity=\"a\" data-node=\"h2\" data-role=\"standby\""),
        "{dom}"
    );
    let bin = bin().display().to_string();
    let top = Tmux::start(
        "tf-fleet-top",
        140,
        &format!("{bin} top --from http://127.0.0.1:{page_port}"),
    );
    wait_until("top shows the fleet", Duration::from_secs(30), || {
        let screen = top.capture();
        screen.contains("4 identities on 2 nodes") && screen.matches("standby").count() >= 4
    });

    // Prometheus holds samples from before the takeover (an increase needs
    // two, one of them from before).
    wait_until(
        "Prometheus scraped the fleet before the takeover",
        Duration::from_secs(60),
        || {
            query(
                prometheus,
                "count_over_time(tailflight_cluster_takeovers_total{identity=\"a\"}[5m]) >= 2",
            )
            .is_ok_and(|result| !result.is_empty())
        },
    );
    // kill -9 of a's active: the standby on h2 is active, one takeover.
    fleet.sinks[actives[0].0].2.kill9();
    fleet.wait_serving(standbys[0].0);
    wait_until(
        "the page shows a active on h2 and the takeover",
        Duration::from_secs(60),
        || {
            dom = page();
            dom.contains("data-identity=\"a\" data-node=\"h2\" data-role=\"active\"")
                && dom.contains("data-takeovers=\"1\"")
        },
    );
    wait_until("top shows the takeover", Duration::from_secs(30), || {
        top.capture().contains("1 takeovers")
    });
    // The page and top as operators see them, kept as test artifacts.
    let artifacts = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::write(artifacts.join("top-fleet.txt"), top.capture()).unwrap();
    let shot = artifacts.join("status-page-fleet.png");
    headless(
        &format!("http://127.0.0.1:{page_port}/"),
        &[
            format!("--screenshot={}", shot.display()),
            "--window-size=1280,1000".to_string(),
            "--hide-scrollbars".to_string(),
        ],
    );
    assert!(!firing(
        prometheus,
        "TailflightIdentityWithoutActive",
        "identity=\"a\""
    ));
    // Every fleet panel of the dashboard has data, and the takeover alert fires.
    for expr in dashboard_queries()
        .into_iter()
        .filter(|expr| is_fleet_query(expr))
    {
        wait_until(
            &format!("data for the dashboard's {expr}"),
            Duration::from_secs(60),
            || query(prometheus, &expr).is_ok_and(|result| !result.is_empty()),
        );
    }
    wait_until("the takeover alert fires", Duration::from_secs(60), || {
        firing(prometheus, "TailflightTakeover", "identity=\"a\"")
    });

    // No standby left for a: kill its active too. The alert fires...
    fleet.sinks[standbys[0].0].2.kill9();
    wait_until(
        "the page shows a without an active process",
        Duration::from_secs(60),
        || page().contains("class=\"cluster-inactive\" data-identity=\"a\""),
    );
    wait_until(
        "the alert fires in Prometheus",
        Duration::from_secs(180),
        || {
            firing(
                prometheus,
                "TailflightIdentityWithoutActive",
                "identity=\"a\"",
            )
        },
    );
    assert!(!firing(
        prometheus,
        "TailflightIdentityWithoutActive",
        "identity=\"b\""
    ));
    let view = cluster_view(&fleet);
    let a = view["identities"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["identity"] == "a")
        .unwrap();
    assert!(a["active"].is_null(), "{view}");
    // ...and clears once a process serves a again.
    let (again, _) = start_with_page(&mut fleet, "a", "h1");
    fleet.wait_serving(again);
    wait_until("the alert clears", Duration::from_secs(120), || {
        !firing(
            prometheus,
            "TailflightIdentityWithoutActive",
            "identity=\"a\"",
        )
    });
    drop(top);
    fleet.stop_and_audit(&["a", "b", "c", "d"]);
}

/// Test 4: planned handovers under load (a drain of host h1): no batch is
/// refused, nothing is lost or doubled, and the longest any file waited
/// during a handover is reported beside the handover's own time.
#[test]
fn planned_handovers_under_load_refuse_no_batch() {
    let dir = scratch("fleet-handover");
    let mut fleet = Fleet::start(&dir, "3s");
    pair(&mut fleet, "a", "h1", "h2");
    pair(&mut fleet, "b", "h1", "h2");
    let watch_port = free_port();
    let metrics = format!("127.0.0.1:{watch_port}");
    let (source, mut sim) = fleet.start_load("s1", "20s", &["--metrics-listen", &metrics]);
    let mut reports = Vec::new();
    for identity in ["a", "b"] {
        std::thread::sleep(Duration::from_secs(2));
        // The watcher's most-lagging file, sampled while the handover runs.
        let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let sampler = {
            let sampling = sampling.clone();
            std::thread::spawn(move || {
                let mut worst: f64 = 0.0;
                while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Some((200, body)) = http_get(watch_port, "/api/status")
                        && let Ok(status) = serde_json::from_str::<serde_json::Value>(&body)
                    {
                        for file in status["files"].as_array().into_iter().flatten() {
                            worst = worst.max(file["lag_seconds"].as_f64().unwrap_or(0.0));
                        }
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                worst
            })
        };
        let handed = handover(&fleet, identity);
        std::thread::sleep(Duration::from_millis(500));
        sampling.store(false, std::sync::atomic::Ordering::Relaxed);
        let worst = sampler.join().unwrap();
        assert_eq!(handed["to"]["host"], "h2", "{handed}");
        reports.push(format!(
            "{identity}: handover {:.3} s, longest file wait {worst:.3} s",
            handed["seconds"].as_f64().unwrap_or(0.0)
        ));
    }
    eprintln!("planned handovers under load: {}", reports.join("; "));
    sim.wait_for_exit(Duration::from_secs(120));
    fleet.wait_complete(&[("s1", &source, "run1")], &["a", "b"]);
    let (_, body) = http_get(watch_port, "/api/status").expect("the watcher's status");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    let refusals: u64 = status["sinks"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|sink| {
            sink["connection_stats"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|connection| connection["refusals"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(refusals, 0, "no batch refused: {status}");
    let watcher_log = fleet.watchers[0].log_text();
    assert!(
        !watcher_log.contains("sink refused a batch"),
        "{watcher_log}"
    );
    assert!(
        !watcher_log.contains(" ERROR "),
        "{}",
        last_lines(&watcher_log)
    );
    // Each handed-over process stands by again, unfenced.
    let view = cluster_view(&fleet);
    for identity in view["identities"].as_array().unwrap() {
        let roles: Vec<&str> = identity["members"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["role"].as_str())
            .collect();
        assert!(
            roles.contains(&"active") && roles.contains(&"standby"),
            "{view}"
        );
        assert_eq!(identity["takeovers"], 1, "{view}");
    }
    fleet.stop_and_audit(&["a", "b"]);
}
