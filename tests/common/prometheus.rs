//! A real Prometheus server for the tests (Debian's, installed by
//! ops/test.sh and named by TAILFLIGHT_PROMETHEUS), and its HTTP API.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{http_get, wait_until};

/// Prometheus and promtool, from TAILFLIGHT_PROMETHEUS (the server's path).
pub fn prometheus_tools() -> (PathBuf, PathBuf) {
    let server = std::env::var_os("TAILFLIGHT_PROMETHEUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "TAILFLIGHT_PROMETHEUS names no Prometheus server: run the suite with ops/test.sh, \
             which installs Debian's prometheus package"
            )
        });
    let promtool = server.with_file_name("promtool");
    assert!(
        server.is_file() && promtool.is_file(),
        "no prometheus/promtool at {server:?}"
    );
    (server, promtool)
}

pub fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The Prometheus server, killed when dropped.
pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An instant query: Ok(result vector) or Err(what Prometheus said).
pub fn query(port: u16, expr: &str) -> Result<Vec<serde_json::Value>, String> {
    let path = format!("/api/v1/query?query={}", percent_encode(expr));
    let (_, body) = http_get(port, &path).ok_or("Prometheus did not answer")?;
    let answer: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("{e}: {body}"))?;
    if answer["status"] != "success" {
        return Err(body);
    }
    Ok(answer["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default())
}

/// The value of a query that returns one series.
pub fn value(port: u16, expr: &str) -> Option<f64> {
    let result = query(port, expr).ok()?;
    result.first()?["value"][1].as_str()?.parse().ok()
}

/// Starts Prometheus in `dir`, scraping `targets` (job, host:port) every
/// second with the project's alert rules evaluated every second; returns
/// it and its port, once it answers.
pub fn start_prometheus(dir: &Path, targets: &[(&str, String)]) -> (Server, u16) {
    let (server, _) = prometheus_tools();
    let port = super::free_port();
    let mut config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n",
        repo_file("ops/prometheus/alerts.yml").display()
    );
    let mut jobs: Vec<&str> = targets.iter().map(|(job, _)| *job).collect();
    jobs.dedup();
    for job in jobs {
        let addresses: Vec<String> = targets
            .iter()
            .filter(|(j, _)| *j == job)
            .map(|(_, address)| format!("\"{address}\""))
            .collect();
        config.push_str(&format!(
            "  - job_name: {job}\n    static_configs:\n      - targets: [{}]\n",
            addresses.join(", ")
        ));
    }
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, config).expect("write prometheus.yml");
    let log = std::fs::File::create(dir.join("prometheus.log")).expect("prometheus log");
    let server = Server(
        Command::new(&server)
            .arg(format!("--config.file={}", path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .stdin(Stdio::null())
            .spawn()
            .expect("start prometheus"),
    );
    wait_until("Prometheus answers", Duration::from_secs(60), || {
        http_get(port, "/-/ready").is_some_and(|(code, _)| code == 200)
    });
    (server, port)
}

/// Whether alert `name` fires now, for series matching `labels` (PromQL
/// label matchers, e.g. `identity="a"`).
pub fn firing(port: u16, name: &str, labels: &str) -> bool {
    let expr = format!("ALERTS{{alertname=\"{name}\",alertstate=\"firing\",{labels}}}");
    query(port, &expr).is_ok_and(|result| !result.is_empty())
}

/// Every `expr` in the Grafana dashboard's panels, with its variables set
/// to match all.
pub fn dashboard_queries() -> Vec<String> {
    let text = std::fs::read_to_string(repo_file("ops/grafana/tailflight.json"))
        .expect("the Grafana dashboard");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                out.push(expr.replace("$source", ".*").replace("$sink", ".*"));
            }
        }
    }
    out
}

/// A dashboard query of the fleet's series (data only with a coordinator).
pub fn is_fleet_query(expr: &str) -> bool {
    expr.contains("tailflight_cluster_") || expr.contains("tailflight_fleet_")
}
