//! Mutual TLS is the sink's only authentication: a sink that demands client
//! certificates from CA A answers a client holding A's certificate, and
//! refuses one with no certificate, one with a certificate from an unrelated
//! CA B, and one speaking plaintext. A watcher holding B's certificate
//! transfers nothing; one holding A's delivers the file.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

/// Only stops a hung test; no run comes near it.
const HANG_GUARD: Duration = Duration::from_secs(120);

/// A directory written by `tailflight certs`: a CA with a server and a client certificate.
struct Certs(PathBuf);

impl Certs {
    fn make(dir: &Path) -> Self {
        let (ok, text) = common::run(&["certs".into(), "--out".into(), dir.display().to_string()]);
        assert!(ok, "tailflight certs --out {}: {text}", dir.display());
        Self(dir.to_path_buf())
    }

    fn file(&self, name: &str) -> String {
        self.0.join(name).display().to_string()
    }

    /// Client flags that trust this CA for the sink's certificate, presenting no certificate.
    fn trust(&self) -> Vec<String> {
        vec!["--tls-ca".into(), self.file("ca.pem")]
    }

    /// Client flags that trust this CA and present `identity`'s client certificate.
    fn trust_as(&self, identity: &Certs) -> Vec<String> {
        let mut args = self.trust();
        args.extend(["--tls-cert".into(), identity.file("client.pem")]);
        args.extend(["--tls-key".into(), identity.file("client.key")]);
        args
    }
}

/// A sink serving CA A's server certificate and accepting only clients of CA A.
struct TlsSink {
    a: Certs,
    b: Certs,
    root: PathBuf,
    port: u16,
    process: common::Proc,
    /// Last, so the processes stop before their folder is removed.
    dir: common::Scratch,
}

impl TlsSink {
    fn start(name: &str) -> Self {
        let dir = common::scratch(name);
        let a = Certs::make(&dir.join("ca-a"));
        let b = Certs::make(&dir.join("ca-b"));
        let root = dir.join("dest");
        let port = common::free_port();
        let mut args = common::strings(&["sink", "--listen", &format!("127.0.0.1:{port}")]);
        args.extend(["--root".into(), root.display().to_string()]);
        args.extend([
            "--state".into(),
            dir.join("sink-state").display().to_string(),
        ]);
        args.extend([
            "--tls-cert".into(),
            a.file("server.pem"),
            "--tls-key".into(),
            a.file("server.key"),
        ]);
        args.extend(["--client-ca".into(), a.file("ca.pem")]);
        let process = common::Proc::spawn(&dir, "sink", &args);
        let mut sink = Self {
            dir,
            a,
            b,
            root,
            port,
            process,
        };
        let endpoint = sink.https();
        let trusted = sink.a.trust_as(&sink.a);
        common::wait_until(
            "the TLS sink answers a client of its CA",
            HANG_GUARD,
            || {
                assert!(
                    sink.process.is_running(),
                    "the sink exited at start:\n{}",
                    sink.process.log_text()
                );
                status(&endpoint, &trusted).0
            },
        );
        sink
    }

    fn https(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The sink's counters, asked as a client of CA A.
    fn counters(&self) -> serde_json::Value {
        common::sink_status(&self.https(), &self.a.trust_as(&self.a))
            .expect("the sink answers a client of its CA")
    }

    /// Starts a watcher of `source_dir` that presents `tls`, with a state of its own.
    fn watcher(&self, name: &str, source_dir: &Path, tls: Vec<String>) -> common::Proc {
        let mut args = common::strings(&[
            "watch",
            "--source",
            "src",
            "--rescan",
            "1s",
            "--to",
            &self.https(),
        ]);
        args.extend(["--dir".into(), source_dir.display().to_string()]);
        args.extend([
            "--state".into(),
            self.dir.join(format!("{name}-state")).display().to_string(),
        ]);
        args.extend(tls);
        common::Proc::spawn(&self.dir, name, &args)
    }
}

/// `tailflight status --to ENDPOINT TLS...`: (exit success, stdout+stderr).
/// Unlike `common::run`, gives up (and kills the client) after `HANG_GUARD`.
fn status(endpoint: &str, tls: &[String]) -> (bool, String) {
    let mut args = common::strings(&["status", "--to", endpoint]);
    args.extend_from_slice(tls);
    let child = Command::new(common::bin())
        .args(&args)
        .env("TAILFLIGHT_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tailflight status");
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let output = match rx.recv_timeout(HANG_GUARD) {
        Ok(output) => output.expect("wait for tailflight status"),
        Err(_) => {
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            panic!("tailflight status {args:?} hung");
        }
    };
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

/// Asserts `status` failed while talking to the sink (not, say, on its own arguments).
fn assert_refused(endpoint: &str, tls: &[String], what: &str) {
    let (ok, text) = status(endpoint, tls);
    assert!(!ok, "{what}: status succeeded: {text}");
    assert!(
        !text.contains("placed_bytes"),
        "{what}: the sink answered: {text}"
    );
    let context = format!("error: sink {endpoint}");
    assert!(
        text.contains(&context),
        "{what}: not a failure to reach the sink: {text}"
    );
}

/// How often a watcher's log reports the sink refusing its reconciliation
/// request, and its DoPut connections.
fn refusals(log: &str) -> (usize, usize) {
    let count = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    (
        count("the sink does not give its watermarks"),
        count("connection lost"),
    )
}

#[test]
fn status_needs_a_client_certificate_of_the_sink_ca() {
    let sink = TlsSink::start("auth-status");
    let endpoint = sink.https();

    let (ok, text) = status(&endpoint, &sink.a.trust_as(&sink.a));
    assert!(ok, "a client of CA A was refused: {text}");
    let json = &text[text
        .find('{')
        .unwrap_or_else(|| panic!("no JSON in {text}"))..];
    let counters: serde_json::Value =
        serde_json::from_str(json.lines().next().unwrap()).expect("status JSON");
    assert!(counters.get("placed_bytes").is_some(), "{counters}");

    assert_refused(&endpoint, &sink.a.trust(), "no client certificate");
    assert_refused(
        &endpoint,
        &sink.a.trust_as(&sink.b),
        "a client certificate of CA B",
    );
    assert_refused(
        &endpoint,
        &sink.b.trust_as(&sink.a),
        "a client that does not trust the sink's CA",
    );
    assert_refused(
        &format!("http://127.0.0.1:{}", sink.port),
        &[],
        "plaintext against the TLS port",
    );

    // The refusals did not hurt the sink.
    let (ok, text) = status(&endpoint, &sink.a.trust_as(&sink.a));
    assert!(
        ok,
        "after the refusals, a client of CA A was refused: {text}"
    );
}

#[test]
fn a_watcher_with_a_foreign_certificate_transfers_nothing() {
    let mut sink = TlsSink::start("auth-watch");
    let source = sink.dir.join("source");
    std::fs::create_dir_all(&source).unwrap();
    let content: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(source.join("hello.bin"), &content).unwrap();

    // Refused for a few seconds: the watcher retries with backoff.
    let mut foreign = sink.watcher("watcher-b", &source, sink.a.trust_as(&sink.b));
    common::wait_until(
        "the sink refuses the watcher with B's certificate again and again",
        HANG_GUARD,
        || {
            let (reconciliations, streams) = refusals(&foreign.log_text());
            reconciliations >= 6 && streams >= 1
        },
    );
    assert!(
        sink.process.is_running(),
        "the sink died:\n{}",
        sink.process.log_text()
    );
    assert_eq!(
        common::list_files(&sink.root),
        Vec::<String>::new(),
        "files reached the sink from a foreign watcher"
    );
    let counters = sink.counters();
    assert_eq!(
        common::status_u64(&counters, "placed_bytes"),
        0,
        "{counters}"
    );
    assert_eq!(common::status_u64(&counters, "files"), 0, "{counters}");
    foreign.stop();

    let _trusted = sink.watcher("watcher-a", &source, sink.a.trust_as(&sink.a));
    let dest = sink.root.join("src").join("hello.bin");
    common::wait_until(
        "the file arrives from the watcher with A's certificate",
        HANG_GUARD,
        || std::fs::read(&dest).ok().as_ref() == Some(&content),
    );
    common::wait_until("the sink records the file's bytes", HANG_GUARD, || {
        common::status_u64(&sink.counters(), "placed_bytes") == content.len() as u64
    });
}
