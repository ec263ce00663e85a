//! A real Prometheus server (Debian's 2.42, installed by ops/test.sh and
//! named by TAILFLIGHT_PROMETHEUS) scrapes a watcher and a sink during a
//! simulator run, with the project's alert rules loaded: the series agree
//! with the run, the "stalled" alert's expression turns true while the sink
//! is paused and false again after, a scrape
//! passes `promtool check metrics`, the rules pass `promtool check rules`,
//! and every PromQL expression of the Grafana dashboard but the fleet's
//! returns data.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::prometheus::{
    Server, dashboard_queries, is_fleet_query, prometheus_tools, query, repo_file, value,
};
use common::{
    Pipeline, PipelineOptions, free_port, http_get, signal, strings, wait_until, workload,
};

/// Every alert rule Prometheus loaded from ops/prometheus/alerts.yml: (name, expression).
fn alert_expressions(port: u16) -> Vec<(String, String)> {
    let (_, body) = http_get(port, "/api/v1/rules?type=alert").expect("Prometheus's rules");
    let answer: serde_json::Value = serde_json::from_str(&body).expect("rules JSON");
    let mut rules = Vec::new();
    for group in answer["data"]["groups"].as_array().into_iter().flatten() {
        for rule in group["rules"].as_array().into_iter().flatten() {
            if let (Some(name), Some(expr)) = (rule["name"].as_str(), rule["query"].as_str()) {
                rules.push((name.to_string(), expr.to_string()));
            }
        }
    }
    rules
}

#[test]
fn prometheus_scrapes_the_run_and_its_alerts_and_dashboard_evaluate() {
    let (server, promtool) = prometheus_tools();
    let (watch_port, sink_port, prom_port) = (free_port(), free_port(), free_port());
    let mut pipeline = Pipeline::in_scratch(
        "prometheus",
        PipelineOptions {
            extra_watch_args: strings(&[
                "--metrics-listen",
                &format!("127.0.0.1:{watch_port}"),
                "--stall-after",
                "1s",
            ]),
            extra_sink_args: strings(&["--metrics-listen", &format!("127.0.0.1:{sink_port}")]),
            ..PipelineOptions::default()
        },
    );

    // The rules and a scrape of each process pass promtool's checks.
    let rules = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(repo_file("ops/prometheus/alerts.yml"))
        .output()
        .expect("run promtool");
    assert!(rules.status.success(), "promtool check rules: {rules:?}");
    for port in [watch_port, sink_port] {
        wait_until(
            "the metrics listener answers",
            Duration::from_secs(60),
            || matches!(http_get(port, "/readyz"), Some((200, _))),
        );
        let (_, scrape) = http_get(port, "/metrics").expect("a scrape");
        let mut check = Command::new(&promtool)
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run promtool");
        check
            .stdin
            .take()
            .expect("promtool's stdin")
            .write_all(scrape.as_bytes())
            .expect("feed promtool");
        let checked = check.wait_with_output().expect("promtool");
        assert!(
            checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
            "promtool check metrics on port {port}: {}{}\n{scrape}",
            String::from_utf8_lossy(&checked.stdout),
            String::from_utf8_lossy(&checked.stderr)
        );
    }

    let config = pipeline.dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\n\
             scrape_configs:\n  - job_name: tailflight-watch\n    static_configs:\n      - targets: [\"127.0.0.1:{watch_port}\"]\n\
             \x20 - job_name: tailflight-sink\n    static_configs:\n      - targets: [\"127.0.0.1:{sink_port}\"]\n",
            repo_file("ops/prometheus/alerts.yml").display()
        ),
    )
    .expect("write prometheus.yml");
    let log = std::fs::File::create(pipeline.dir.join("prometheus.log")).expect("prometheus log");
    let _prometheus = Server(
        Command::new(&server)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                pipeline.dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start prometheus"),
    );
    wait_until(
        "Prometheus scrapes both targets",
        Duration::from_secs(60),
        || query(prom_port, "up == 1").is_ok_and(|up| up.len() == 2),
    );

    let mut sim = common::simulate_in_background(
        &pipeline.dir,
        &pipeline.source,
        &workload("r1", "3", "1MiB", "30s"),
    );
    let committed = "tailflight_source_committed_bytes_total{source=\"src\"}";
    wait_until(
        "Prometheus sees bytes committed",
        Duration::from_secs(60),
        || value(prom_port, committed).is_some_and(|v| v > 0.0),
    );

    // A paused sink: the stalled alert's expression becomes true.
    let alerts = alert_expressions(prom_port);
    assert!(alerts.len() >= 8, "the alert rules are loaded: {alerts:?}");
    let stalled = alerts
        .iter()
        .find(|(name, _)| name == "TailflightSourceStalled")
        .expect("the stalled alert")
        .1
        .clone();
    signal(pipeline.sink.pid(), libc::SIGSTOP);
    wait_until(
        "the stalled alert's expression is true in Prometheus",
        Duration::from_secs(60),
        || query(prom_port, &stalled).is_ok_and(|r| !r.is_empty()),
    );
    signal(pipeline.sink.pid(), libc::SIGCONT);
    wait_until(
        "the stalled alert's expression is false again",
        Duration::from_secs(60),
        || query(prom_port, &stalled).is_ok_and(|r| r.is_empty()),
    );
    sim.stop();
    pipeline.wait_identical(Duration::from_secs(120));
    let total = common::tree_bytes(&pipeline.source) as f64;

    // The series agree with the run once everything is in.
    wait_until(
        "Prometheus shows every byte committed and nothing owed",
        Duration::from_secs(60),
        || {
            value(prom_port, committed) == Some(total)
                && value(prom_port, "tailflight_source_lag_bytes{source=\"src\"}") == Some(0.0)
                && value(prom_port, "tailflight_source_lag_seconds{source=\"src\"}") == Some(0.0)
                && value(
                    prom_port,
                    "tailflight_sink_committed_bytes_total{source=\"src\"}",
                ) == Some(total)
        },
    );

    // Every expression of the dashboard returns data; every alert evaluates.
    // The fleet's panels have no data without a coordinator: the fleet's
    // tests (tests/fleet_users.rs) check those.
    for expr in dashboard_queries()
        .into_iter()
        .filter(|expr| !is_fleet_query(expr))
    {
        let result = query(prom_port, &expr).unwrap_or_else(|e| panic!("{expr}: {e}"));
        assert!(
            !result.is_empty(),
            "the dashboard's query returns no data: {expr}"
        );
    }
    for (name, expr) in &alerts {
        query(prom_port, expr).unwrap_or_else(|e| panic!("alert {name}: {expr}: {e}"));
    }
    pipeline.sink.stop();
    pipeline.watcher.stop();
}
