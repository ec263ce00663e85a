//! What operators see: a watcher and a sink serving
//! `--metrics-listen` during a simulator run. The metrics agree with the
//! run (bytes committed equal the bytes the source holds, lag returns to 0
//! once the writer stops), the status page and its JSON answer, readiness
//! follows the process, and a paused sink turns the source stalled and
//! back.

mod common;

use std::time::Duration;

use common::browser::headless;
use common::tmux::Tmux;
use common::{Pipeline, PipelineOptions, free_port, signal, strings, wait_until, workload};

/// Waits until a metrics listener answers (its process may still start).
fn wait_listening(port: u16) {
    wait_until(
        "the metrics listener answers",
        Duration::from_secs(60),
        || get(port, "/healthz").is_some(),
    );
}

fn get(port: u16, path: &str) -> Option<(u16, String)> {
    common::http_get(port, path)
}

fn get_ok(port: u16, path: &str) -> String {
    match get(port, path) {
        Some((200, body)) => body,
        other => panic!("GET {path} on port {port}: {other:?}"),
    }
}

/// The value of the sample `series` (name and labels, exactly as exposed).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let value = line.strip_prefix(series)?.strip_prefix(' ')?;
        value.trim().parse().ok()
    })
}

fn status(port: u16) -> serde_json::Value {
    serde_json::from_str(&get_ok(port, "/api/status")).expect("/api/status is JSON")
}

fn verdict(port: u16) -> String {
    status(port)["sources"][0]["verdict"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn pipeline_with_metrics(name: &str, watch_port: u16, sink_port: u16) -> Pipeline {
    Pipeline::in_scratch(
        name,
        PipelineOptions {
            extra_watch_args: strings(&[
                "--metrics-listen",
                &format!("127.0.0.1:{watch_port}"),
                "--metrics-top-files",
                "2",
                "--stall-after",
                "1s",
            ]),
            extra_sink_args: strings(&["--metrics-listen", &format!("127.0.0.1:{sink_port}")]),
            ..PipelineOptions::default()
        },
    )
}

#[test]
fn metrics_and_status_follow_a_run() {
    let (watch_port, sink_port) = (free_port(), free_port());
    let pipeline = pipeline_with_metrics("operators-run", watch_port, sink_port);
    for port in [watch_port, sink_port] {
        wait_until("the listener is ready", Duration::from_secs(60), || {
            matches!(get(port, "/readyz"), Some((200, _)))
        });
        assert_eq!(get_ok(port, "/healthz").trim(), "ok");
        let page = get_ok(port, "/");
        assert!(page.contains("<title>tailflight</title>") && page.contains("api/status"));
    }
    // The sink keeps transparent huge pages from its heap unless told
    // otherwise (`--transparent-huge-pages`).
    let sink_pid = pipeline.sink.pid().expect("the sink runs");
    let process_status = std::fs::read_to_string(format!("/proc/{sink_pid}/status"))
        .expect("the kernel shows the sink's status");
    assert!(
        process_status
            .lines()
            .any(|line| line.split_whitespace().eq(["THP_enabled:", "0"])),
        "huge pages allowed: {process_status}"
    );
    common::simulate(&pipeline.source, &workload("r1", "3", "256KiB", "3s"));
    pipeline.wait_identical(Duration::from_secs(120));
    let total = common::tree_bytes(&pipeline.source);
    assert!(total > 0);

    // Every byte the source holds is committed, and nothing is owed.
    let committed = "tailflight_source_committed_bytes_total{source=\"src\"}";
    wait_until(
        "the watcher's metrics show the run committed and no lag",
        Duration::from_secs(60),
        || {
            let metrics = get_ok(watch_port, "/metrics");
            sample(&metrics, committed) == Some(total as f64)
                && sample(&metrics, "tailflight_source_lag_bytes{source=\"src\"}") == Some(0.0)
                && sample(&metrics, "tailflight_source_lag_seconds{source=\"src\"}") == Some(0.0)
        },
    );
    let metrics = get_ok(watch_port, "/metrics");
    assert_eq!(
        sample(
            &metrics,
            "tailflight_source_observed_bytes_total{source=\"src\"}"
        ),
        Some(total as f64)
    );
    assert_eq!(sample(&metrics, "tailflight_ready"), Some(1.0));
    assert!(
        sample(
            &metrics,
            "tailflight_source_append_to_durable_seconds_count{source=\"src\"}"
        )
        .is_some_and(|n| n > 0.0)
    );
    assert!(metrics.contains("tailflight_batch_ack_latency_seconds_bucket{sink="));
    let endpoint = &pipeline.endpoint;
    assert_eq!(
        sample(
            &metrics,
            &format!("tailflight_link_connections_up{{sink=\"{endpoint}\"}}")
        ),
        sample(
            &metrics,
            &format!("tailflight_link_connections{{sink=\"{endpoint}\"}}")
        ),
    );
    for state in [
        "caught-up",
        "progressing",
        "falling-behind",
        "stalled",
        "failed",
    ] {
        let series = format!("tailflight_source_files{{source=\"src\",state=\"{state}\"}}");
        let files = sample(&metrics, &series).unwrap_or_else(|| panic!("{series} missing"));
        assert!(
            files == 0.0 || state == "caught-up",
            "{files} files {state} after the run"
        );
    }
    assert!(metrics.contains("# TYPE tailflight_source_committed_bytes_total counter"));
    assert!(metrics.contains("tailflight_build_info{role=\"watcher\""));
    assert!(metrics.contains("process_resident_memory_bytes"));

    // The sink counts the same bytes, from its commit feed.
    wait_until(
        "the sink's metrics show the run",
        Duration::from_secs(30),
        || {
            let metrics = get_ok(sink_port, "/metrics");
            sample(
                &metrics,
                "tailflight_sink_committed_bytes_total{source=\"src\"}",
            ) == Some(total as f64)
        },
    );
    let metrics = get_ok(sink_port, "/metrics");
    assert_eq!(sample(&metrics, "tailflight_sink_ready"), Some(1.0));
    assert!(sample(&metrics, "tailflight_sink_commit_rounds_total").is_some_and(|n| n > 0.0));
    assert!(
        sample(&metrics, "tailflight_sink_commit_latency_seconds_count").is_some_and(|n| n > 0.0)
    );
    assert!(
        sample(&metrics, "tailflight_sink_disk_free_bytes{dir=\"root\"}").is_some_and(|n| n > 0.0)
    );
    for stage in ["receive", "write", "queue", "flush", "manifest"] {
        let series = format!("tailflight_sink_stage_seconds_count{{stage=\"{stage}\"}}");
        assert!(
            sample(&metrics, &series).is_some_and(|n| n > 0.0),
            "{series}"
        );
    }
    assert!(sample(&metrics, "tailflight_sink_placed_bytes").is_some_and(|n| n >= total as f64));

    // The JSON says what the metrics say.
    let watcher = status(watch_port);
    assert_eq!(watcher["role"], "watcher");
    assert_eq!(watcher["sources"][0]["committed_bytes"], total);
    assert_eq!(watcher["sources"][0]["lag_bytes"], 0);
    let sink = status(sink_port);
    assert_eq!(sink["role"], "sink");
    assert_eq!(sink["sources"][0]["committed_bytes"], total);
    assert_eq!(sink["ready"], true);
}

#[test]
fn a_paused_sink_turns_the_source_stalled_and_back() {
    let (watch_port, sink_port) = (free_port(), free_port());
    let mut pipeline = pipeline_with_metrics("operators-stall", watch_port, sink_port);
    wait_until("the watcher is ready", Duration::from_secs(60), || {
        matches!(get(watch_port, "/readyz"), Some((200, _)))
    });
    let mut sim = common::simulate_in_background(
        &pipeline.dir,
        &pipeline.source,
        &workload("r1", "2", "4MiB", "40s"),
    );
    wait_until("the source is followed", Duration::from_secs(60), || {
        status(watch_port)["sources"][0]["committed_bytes"].as_u64() > Some(0)
    });

    signal(pipeline.sink.pid(), libc::SIGSTOP);
    wait_until(
        "the source is stalled while its sink is stopped",
        Duration::from_secs(60),
        || verdict(watch_port) == "stalled",
    );
    let metrics = get_ok(watch_port, "/metrics");
    assert_eq!(
        sample(
            &metrics,
            "tailflight_source_verdict{source=\"src\",state=\"stalled\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &metrics,
            "tailflight_source_verdict_severity{source=\"src\"}"
        ),
        Some(5.0)
    );
    assert!(
        sample(&metrics, "tailflight_source_lag_seconds{source=\"src\"}").is_some_and(|s| s >= 1.0)
    );
    let top = sample_prefix(&metrics, "tailflight_file_lag_bytes{");
    assert!(
        (1..=2).contains(&top.len()),
        "the top files are exported, at most --metrics-top-files of them: {top:?}"
    );

    signal(pipeline.sink.pid(), libc::SIGCONT);
    wait_until(
        "the source catches up once its sink runs again",
        Duration::from_secs(60),
        || {
            matches!(
                verdict(watch_port).as_str(),
                "caught-up" | "progressing" | "idle" | "done"
            )
        },
    );
    sim.stop();
    pipeline.wait_identical(Duration::from_secs(120));
    pipeline.sink.stop();
    pipeline.watcher.stop();
}

fn sample_prefix(metrics: &str, prefix: &str) -> Vec<String> {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

#[test]
fn the_demo_runs_the_pipeline_and_ends_with_a_summary() {
    let dir = common::scratch("operators-demo");
    let demo_dir = dir.join("demo");
    let (ok, output) = common::run(&strings(&[
        "demo",
        "--dir",
        &demo_dir.display().to_string(),
        "--duration",
        "2s",
        "--streams",
        "2",
        "--rate",
        "50",
    ]));
    assert!(ok, "the demo failed: {output}");
    assert!(
        output.contains("frames of"),
        "the rate is chosen from the disk: {output}"
    );
    assert!(output.contains("IDENTICAL to the source"), "{output}");
    assert!(
        !output.contains("WARN") && !output.contains("INFO"),
        "logs go to the log file, not the terminal: {output}"
    );
    let log = std::fs::read_to_string(demo_dir.join("demo.log")).expect("the demo's log");
    assert!(
        !log.contains("connection lost"),
        "the watcher found its sink listening: {log}"
    );
}

#[test]
fn the_terminal_view_shows_sources_states_and_files() {
    let (watch_port, sink_port) = (free_port(), free_port());
    let pipeline = pipeline_with_metrics("operators-top", watch_port, sink_port);
    let mut sim = common::simulate_in_background(
        &pipeline.dir,
        &pipeline.source,
        &workload("r1", "2", "64MiB", "60s"),
    );
    let bin = common::bin().display().to_string();
    let id = std::process::id();
    let wide = Tmux::start(
        &format!("tf-top-{id}"),
        140,
        &format!("{bin} top --from http://127.0.0.1:{watch_port}"),
    );
    let narrow = Tmux::start(
        &format!("tf-top-narrow-{id}"),
        72,
        &format!("{bin} top --from http://127.0.0.1:{watch_port}"),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let screen = wide.capture();
        if screen.contains("tailflight top")
            && screen.contains("src")
            && ["caught-up", "progressing", "falling-behind"]
                .iter()
                .any(|state| screen.contains(state))
            && screen.contains(&format!("{} #0", pipeline.endpoint))
            && screen.contains("r1-s00")
            && screen.contains("caught up in")
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "top never showed the source, its state, a connection and the growing files:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    wait_until(
        "the narrow view drops columns",
        Duration::from_secs(30),
        || {
            let narrow_screen = narrow.capture();
            narrow_screen.contains("r1-s00") && !narrow_screen.contains("caught up in")
        },
    );
    // The sink's view.
    let sink_view = Tmux::start(
        &format!("tf-top-sink-{id}"),
        120,
        &format!("{bin} top --from http://127.0.0.1:{sink_port}"),
    );
    wait_until("top shows the sink", Duration::from_secs(30), || {
        let s = sink_view.capture();
        s.contains("sink at") && s.contains("subscriptions") && s.contains("rounds")
    });
    wide.send_keys("q");
    wait_until("q quits", Duration::from_secs(10), || !wide.alive());
    sim.stop();
    drop(pipeline);
}

/// The Python with grpcio and opentelemetry-proto that ops/test.sh prepares.
fn python() -> std::path::PathBuf {
    std::env::var_os("TAILFLIGHT_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "TAILFLIGHT_PYTHON names no Python with grpcio and opentelemetry-proto: run the \
                 suite with ops/test.sh"
            )
        })
}

/// The value of `name` with label `label` = `value` in an OTLP export (JSON).
fn otlp_value(export: &serde_json::Value, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
    let metrics = export["resourceMetrics"][0]["scopeMetrics"][0]["metrics"].as_array()?;
    let metric = metrics.iter().find(|m| m["name"] == name)?;
    let points = metric["sum"]["dataPoints"]
        .as_array()
        .or_else(|| metric["gauge"]["dataPoints"].as_array())?;
    let point = points.iter().find(|p| match label {
        None => true,
        Some((key, value)) => p["attributes"].as_array().is_some_and(|attrs| {
            attrs
                .iter()
                .any(|a| a["key"] == key && a["value"]["stringValue"] == value)
        }),
    })?;
    point["asDouble"].as_f64()
}

#[test]
fn otlp_exports_agree_with_the_prometheus_endpoint() {
    let dir = common::scratch("operators-otlp");
    let otlp_port = free_port();
    let exports = dir.join("otlp.jsonl");
    let receiver = std::process::Command::new(python())
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/tools/otlp_receiver.py"
        ))
        .arg(otlp_port.to_string())
        .arg(&exports)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start the OTLP receiver");
    let _receiver = KillOnDrop(receiver);
    let (watch_port, sink_port) = (free_port(), free_port());
    let otlp_args = |port: u16| {
        strings(&[
            "--metrics-listen",
            &format!("127.0.0.1:{port}"),
            "--otlp-endpoint",
            &format!("http://127.0.0.1:{otlp_port}"),
            "--otlp-every",
            "500ms",
        ])
    };
    let pipeline = Pipeline::start(
        &dir,
        PipelineOptions {
            extra_watch_args: otlp_args(watch_port),
            extra_sink_args: otlp_args(sink_port),
            ..PipelineOptions::default()
        },
    );
    common::simulate(&pipeline.source, &workload("r1", "2", "256KiB", "2s"));
    pipeline.wait_identical(Duration::from_secs(120));
    let total = common::tree_bytes(&pipeline.source) as f64;
    let committed = "tailflight_source_committed_bytes_total";
    wait_until(
        "the Prometheus endpoint shows every byte committed",
        Duration::from_secs(60),
        || {
            sample(
                &get_ok(watch_port, "/metrics"),
                &format!("{committed}{{source=\"src\"}}"),
            ) == Some(total)
        },
    );
    // Once the figures have settled, the next exports carry the same values.
    let mut last_watch = None;
    let mut last_sink = None;
    wait_until(
        "an export from each process agrees with its Prometheus endpoint",
        Duration::from_secs(60),
        || {
            let text = std::fs::read_to_string(&exports).unwrap_or_default();
            for line in text.lines() {
                let Ok(export) = serde_json::from_str::<serde_json::Value>(line) else {
                    continue;
                };
                let service = export["resourceMetrics"][0]["resource"]["attributes"]
                    .as_array()
                    .and_then(|attrs| {
                        attrs
                            .iter()
                            .find(|a| a["key"] == "service.name")
                            .and_then(|a| a["value"]["stringValue"].as_str().map(str::to_string))
                    });
                match service.as_deref() {
                    Some("tailflight-watch") => last_watch = Some(export),
                    Some("tailflight-sink") => last_sink = Some(export),
                    _ => {}
                }
            }
            let watch_agrees = last_watch.as_ref().is_some_and(|e| {
                otlp_value(e, committed, Some(("source", "src"))) == Some(total)
                    && otlp_value(e, "tailflight_source_lag_bytes", Some(("source", "src")))
                        == Some(0.0)
            });
            let sink_agrees = last_sink.as_ref().is_some_and(|e| {
                otlp_value(
                    e,
                    "tailflight_sink_committed_bytes_total",
                    Some(("source", "src")),
                ) == sample(
                    &get_ok(sink_port, "/metrics"),
                    "tailflight_sink_committed_bytes_total{source=\"src\"}",
                )
            });
            watch_agrees && sink_agrees
        },
    );
    let watch_export = last_watch.expect("an export from the watcher");
    let attrs = watch_export["resourceMetrics"][0]["resource"]["attributes"].to_string();
    assert!(
        attrs.contains("tailflight.source") && attrs.contains("service.instance.id"),
        "{attrs}"
    );
    let metrics = watch_export["resourceMetrics"][0]["scopeMetrics"][0]["metrics"].to_string();
    assert!(
        metrics.contains("tailflight_batch_ack_latency_seconds")
            && metrics.contains("explicitBounds")
    );
    drop(pipeline);
}

/// A helper process (the OTLP receiver, a browser), killed when dropped.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_status_page_renders_the_run_in_a_browser() {
    let (watch_port, sink_port) = (free_port(), free_port());
    let pipeline = pipeline_with_metrics("operators-page", watch_port, sink_port);
    for port in [watch_port, sink_port] {
        wait_until("the listener is ready", Duration::from_secs(60), || {
            matches!(get(port, "/readyz"), Some((200, _)))
        });
    }
    let mut sim = common::simulate_in_background(
        &pipeline.dir,
        &pipeline.source,
        &workload("r1", "2", "64MiB", "60s"),
    );
    wait_until(
        "the watcher follows the files",
        Duration::from_secs(60),
        || {
            status(watch_port)["files"]
                .as_array()
                .is_some_and(|f| !f.is_empty())
        },
    );
    let url = format!("http://127.0.0.1:{watch_port}/");
    let dom = headless(&url, &strings(&["--dump-dom"]));
    assert!(
        dom.contains("data-loaded=\"1\""),
        "the page's script ran: {dom}"
    );
    assert!(dom.contains("data-source=\"src\""), "{dom}");
    assert!(
        dom.contains("class=\"file\" data-path=\"r1-s00"),
        "the growing files are listed: {dom}"
    );
    assert!(dom.contains("verdict s-"), "{dom}");
    // Screenshots of both pages, kept as test artifacts.
    let artifacts = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    for (name, port) in [("watcher", watch_port), ("sink", sink_port)] {
        let shot = artifacts.join(format!("status-page-{name}.png"));
        let _ = std::fs::remove_file(&shot);
        headless(
            &format!("http://127.0.0.1:{port}/"),
            &[
                format!("--screenshot={}", shot.display()),
                "--window-size=1280,900".to_string(),
                "--hide-scrollbars".to_string(),
            ],
        );
        let size = std::fs::metadata(&shot).map_or(0, |m| m.len());
        assert!(
            size > 10_000,
            "a screenshot of the {name} page at {}",
            shot.display()
        );
    }
    sim.stop();
    pipeline.wait_identical(Duration::from_secs(120));
    // Once the run is in, the page says what the JSON says.
    let total = common::tree_bytes(&pipeline.source);
    // Every file sealed: nothing on the page can change any more.
    wait_until(
        "the JSON shows every byte committed and every file done",
        Duration::from_secs(60),
        || {
            let source = &status(watch_port)["sources"][0];
            source["committed_bytes"].as_u64() == Some(total)
                && source["lag_bytes"].as_u64() == Some(0)
                && source["verdict"] == "done"
        },
    );
    let json = status(watch_port);
    let dom = headless(&url, &strings(&["--dump-dom"]));
    assert!(
        dom.contains(&format!("data-committed=\"{total}\"")),
        "{dom}"
    );
    let verdict = json["sources"][0]["verdict"].as_str().unwrap_or_default();
    assert!(
        dom.contains(&format!("data-verdict=\"{verdict}\"")),
        "{verdict}: {dom}"
    );
    let sink_dom = headless(
        &format!("http://127.0.0.1:{sink_port}/"),
        &strings(&["--dump-dom"]),
    );
    assert!(
        sink_dom.contains(&format!("data-committed=\"{total}\"")),
        "{sink_dom}"
    );
}

#[test]
fn a_sink_whose_port_is_taken_exits_with_its_metrics_on() {
    let dir = common::scratch("operators-port-taken");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a port to take");
    let port = taken.local_addr().expect("its address").port();
    let metrics = format!("127.0.0.1:{}", free_port());
    let (ok, output) = common::run(&common::sink_command(
        &dir,
        port,
        &["--metrics-listen", &metrics],
    ));
    assert!(!ok, "the sink cannot serve on a taken port: {output}");
    assert!(output.contains("cannot listen on"), "{output}");
}

/// User and system CPU seconds a process has used (Linux /proc).
fn cpu_seconds(pid: i32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command (which may hold spaces) start after ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<f64>().ok()))
        .sum();
    // SAFETY: sysconf has no memory effects.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

#[test]
fn ten_thousand_files_do_not_become_ten_thousand_series() {
    let (watch_port, sink_port) = (free_port(), free_port());
    let pipeline = Pipeline::in_scratch(
        "operators-many",
        PipelineOptions {
            extra_watch_args: strings(&[
                "--metrics-listen",
                &format!("127.0.0.1:{watch_port}"),
                // Files stay followed (not sealed) while the scrapes run.
                "--seal-idle",
                "1h",
            ]),
            extra_sink_args: strings(&["--metrics-listen", &format!("127.0.0.1:{sink_port}")]),
            ..PipelineOptions::default()
        },
    );
    let files = 10_000u64;
    for d in 0..100 {
        let dir = pipeline.source.join(format!("d{d:03}"));
        std::fs::create_dir_all(&dir).expect("a source directory");
        for f in 0..files / 100 {
            std::fs::write(dir.join(format!("f{f:03}.dat")), [d as u8; 100])
                .expect("a source file");
        }
    }
    let total = (files * 100) as f64;
    wait_listening(watch_port);
    wait_until("every file is committed", Duration::from_secs(300), || {
        sample(
            &get_ok(watch_port, "/metrics"),
            "tailflight_source_committed_bytes_total{source=\"src\"}",
        ) == Some(total)
    });
    let metrics = get_ok(watch_port, "/metrics");
    assert_eq!(
        sample(&metrics, "tailflight_source_tracked_files{source=\"src\"}"),
        Some(files as f64)
    );
    // Failed connects at startup (by reason) come and go with timing, not
    // with the number of files.
    let count_series = |text: &str| {
        text.lines()
            .filter(|l| {
                !l.starts_with('#') && !l.starts_with("tailflight_connection_failures_total")
            })
            .count()
    };
    let series = count_series(&metrics);
    assert!(
        !metrics.contains(".dat"),
        "no file path is a label by default"
    );
    // The scrape of a watcher with one file, for comparison: the same series.
    let (small_port, small_sink) = (free_port(), free_port());
    let small = pipeline_with_metrics("operators-one-file", small_port, small_sink);
    std::fs::write(small.source.join("one.dat"), [1u8; 100]).expect("a source file");
    wait_listening(small_port);
    wait_until("the one file is committed", Duration::from_secs(60), || {
        sample(
            &get_ok(small_port, "/metrics"),
            "tailflight_source_committed_bytes_total{source=\"src\"}",
        ) == Some(100.0)
    });
    let small_metrics = get_ok(small_port, "/metrics");
    let small_series = count_series(&small_metrics);
    // The top-files series (--metrics-top-files 2) are the only difference.
    assert!(
        series <= small_series,
        "{files} files give {series} series, one file {small_series}"
    );
    // What a scrape costs the watcher with 10,000 files followed (reported,
    // not asserted).
    let pid = pipeline.watcher.pid().expect("the watcher runs");
    let before = cpu_seconds(pid);
    let scrapes = 50;
    let mut bytes = 0;
    for _ in 0..scrapes {
        bytes = get_ok(watch_port, "/metrics").len();
        get_ok(watch_port, "/api/status");
    }
    let per_scrape_ms = (cpu_seconds(pid) - before) / scrapes as f64 * 1000.0;
    println!(
        "{files} files followed: {series} series, a scrape of {bytes} bytes; watcher CPU per /metrics + /api/status: {per_scrape_ms:.2} ms"
    );
}
