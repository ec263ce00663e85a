//! `tailflight`: parses arguments (and an optional TOML config equivalent to
//! them) and dispatches to the crates that do the work.

mod args;
mod catalogue;
mod choices;
mod cluster;
#[cfg(feature = "bench")]
mod commit_log;
mod config;
mod demo;
mod feed_log;
mod heap;
mod identity;
mod limits;
mod observe;
mod parse;
mod process;
mod send;
mod serve;
mod service_manager;
mod tail;
mod top;
mod verify;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};

use args::{
    AuditArgs, CertsArgs, SimArgs, SinkArgs, StatusArgs, VerifyArgs, WatchArgs, sim_config,
    sink_config,
};
use process::{raise_fd_limit, runtime, say, stop_signal, terminated};

#[derive(Parser)]
#[command(
    name = "tailflight",
    version,
    args_override_self = true,
    about = "Stream growing files over Arrow Flight, placed exactly once at the destination"
)]
struct Cli {
    /// Log filter (RUST_LOG syntax), e.g. "info" or "watcher=debug".
    #[arg(long, global = true, default_value = "info", env = "TAILFLIGHT_LOG")]
    log: String,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Receive ranges and place them under a root directory.
    Sink(SinkArgs),
    /// Tail a directory tree and stream appended bytes to sinks.
    Watch(WatchArgs),
    /// Write DAQ-like growing files (detector simulator).
    Sim(SimArgs),
    /// Compare a source tree with a destination tree; exits 1 on any difference.
    Verify(VerifyArgs),
    /// Make a development CA, a server and a client certificate.
    Certs(CertsArgs),
    /// Ask a running sink for its counters.
    Status(StatusArgs),
    /// Check a sink manifest (after redoing journal rounds a machine crash lost): no byte range recorded twice; prints counters.
    Audit(AuditArgs),
    /// Run simulator, watcher and sink on loopback with live progress, then verify.
    Demo(demo::DemoArgs),
    /// Follow a sink's files as they become durable (a live-tail subscription).
    Tail(tail::TailArgs),
    /// A terminal view of a watcher or a sink (its --metrics-listen address).
    Top(top::TopArgs),
    /// Copy files and trees to a sink once (resumable, sealed, digest checked), as bbcp or xrdcp do.
    Send(send::SendArgs),
    /// A fleet's identities, their processes and roles (etcd); `handover` drains one to a standby.
    Fleet(cluster::ClusterArgs),
}

fn main() -> std::process::ExitCode {
    let args = match config::expand_config_args(std::env::args_os().collect()) {
        Ok(args) => args,
        Err(e) => {
            say!("tailflight: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(args);
    // A panic while a sink's placement thread holds its locks poisons the
    // sink before the locks go (the hook is the program's to set).
    sink::health::install_panic_hook();
    // Warnings and errors are also kept for the status page.
    let problems = observe::RecentProblems::default();
    {
        use tracing_subscriber::layer::SubscriberExt;
        use tracing_subscriber::util::SubscriberInitExt;
        // The demo keeps its terminal for its progress line.
        let log_file = match &cli.command {
            Command::Demo(args) => match demo::log_file(args) {
                Ok(file) => Some(file),
                Err(e) => {
                    say!("tailflight: {e:#}");
                    return std::process::ExitCode::FAILURE;
                }
            },
            _ => None,
        };
        // A send keeps the terminal for its progress and says what went
        // wrong in its summary; its log is there when asked for (--log).
        let log = match &cli.command {
            Command::Send(_) if cli.log == "info" => "off",
            _ => cli.log.as_str(),
        };
        let filter = tracing_subscriber::EnvFilter::try_new(log).unwrap_or_else(|_| "info".into());
        let registry = tracing_subscriber::registry()
            .with(filter)
            .with(problems.clone());
        match log_file {
            Some(file) => registry
                .with(
                    tracing_subscriber::fmt::layer()
                        .with_ansi(false)
                        .with_writer(std::sync::Mutex::new(file)),
                )
                .init(),
            None => registry
                .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
                .init(),
        }
    }
    match run(cli.command, problems) {
        Ok(code) => code,
        Err(e) => match e.downcast_ref::<limits::FlagsRefused>() {
            // As clap refuses what it cannot parse: the caller's mistake.
            Some(refused) => {
                say!("tailflight: {refused}");
                std::process::ExitCode::from(2)
            }
            None => {
                say!("tailflight: error: {e:#}");
                std::process::ExitCode::FAILURE
            }
        },
    }
}

fn run(
    command: Command,
    problems: observe::RecentProblems,
) -> anyhow::Result<std::process::ExitCode> {
    match command {
        Command::Sink(args) => run_sink(args, problems),
        Command::Watch(args) => run_watch(args, problems),
        Command::Sim(args) => run_sim(args),
        Command::Verify(args) => run_verify(args),
        Command::Certs(args) => run_certs(args),
        Command::Status(args) => run_status(args),
        Command::Audit(args) => run_audit(args),
        Command::Demo(args) => demo::run(args),
        Command::Tail(args) => tail::run(args),
        Command::Top(args) => top::run(args),
        Command::Send(args) => send::run(args),
        Command::Fleet(args) => cluster::run(args),
    }
}

/// `tailflight sink`: serves until stopped, as a fleet identity if given one.
fn run_sink(args: SinkArgs, problems: observe::RecentProblems) -> anyhow::Result<ExitCode> {
    limits::check_sink(&args)?;
    if !args.transparent_huge_pages
        && let Err(error) = heap::refuse_transparent_huge_pages()
    {
        tracing::warn!(
            %error,
            "cannot refuse transparent huge pages (prctl PR_SET_THP_DISABLE): they stay allowed"
        );
    }
    raise_fd_limit();
    let config = sink_config(&args);
    runtime()?.block_on(async {
        let stop = stop_signal();
        if args.fleet.identity().is_some() {
            serve::run_sink_identity(&args, &config, problems, &stop).await
        } else {
            serve::serve_sink(&args, &config, problems, &stop, None, || {}).await
        }
    })?;

    Ok(ExitCode::SUCCESS)
}

/// `tailflight watch`: tails until stopped, with its exporters and systemd
/// readiness.
fn run_watch(args: WatchArgs, problems: observe::RecentProblems) -> anyhow::Result<ExitCode> {
    limits::check_watch(&args)?;
    raise_fd_limit();
    let progress = Arc::new(watcher::Progress::default());
    runtime()?.block_on(async {
        let stop = stop_signal();
        let mut exporters = Vec::new();
        let role = args.fleet.identity().map(|identity| {
            fleet::RoleStatus::new(fleet::Kind::Watcher, identity, args.fleet.cluster())
        });
        if args.export.wanted() {
            let observed = observe::WatchObserved::new(
                args.source.clone(),
                progress.clone(),
                args.metrics_top_files,
                problems,
            )?;
            exporters = observe::export(
                Arc::new(observed.with_role(role.clone())),
                args.export.metrics_listen,
                args.export.otlp("tailflight-watch", Some(&args.source)),
                stop(),
            )
            .await?;
        }
        let service = tokio::spawn(watcher_readiness(progress.clone()));
        let watched = serve::run_watcher(&args, progress.clone(), role, &stop).await;
        service.abort();
        for exporter in exporters {
            exporter.abort();
        }
        watched
    })?;

    Ok(ExitCode::SUCCESS)
}

/// Tells systemd the watcher is ready once it is reconciled and tailing
/// (its first progress is published after its first walk), then pings the
/// watchdog while the tailer keeps publishing.
async fn watcher_readiness(progress: Arc<watcher::Progress>) {
    while progress.phase() != watcher::Phase::Tailing || progress.publications() == 0 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    service_manager::ready("tailing");
    let mut last = progress.publications();
    service_manager::watchdog(move || {
        let now = progress.publications();
        let moved = now != last;
        last = now;
        if moved {
            Ok(())
        } else {
            Err("the tailer has not published its progress since the last ping".into())
        }
    })
    .await;
}

/// `tailflight sim`: writes like a DAQ until done or stopped.
fn run_sim(args: SimArgs) -> anyhow::Result<ExitCode> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // SIGTERM or Ctrl-C ends the run cleanly: last chunks renamed, end marker written.
    let signals = runtime()?;
    let stop_on_signal = stop.clone();
    signals.spawn(async move {
        terminated().await;
        stop_on_signal.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let report = detector_sim::run(&sim_config(&args), &stop)?;
    println!(
        "wrote {} bytes in {} files in {:.2}s",
        report.bytes,
        report.files.len(),
        report.elapsed.as_secs_f64()
    );

    Ok(ExitCode::SUCCESS)
}

/// `tailflight verify`: compares two trees; fails unless identical.
fn run_verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let options = crate::verify::VerifyOptions {
        ignore: args.ignore.clone(),
        ..Default::default()
    };
    let report = crate::verify::verify_trees(&args.source, &args.dest, &options)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{report}");
    }
    Ok(if report.is_identical() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `tailflight certs`: development certificates.
fn run_certs(args: CertsArgs) -> anyhow::Result<ExitCode> {
    flight_server::tls::make_dev_certs(&args.out, &args.hosts)
        .map_err(|e| anyhow::anyhow!("making certificates in {}: {e}", args.out.display()))?;
    println!(
        "wrote {} into {}",
        flight_server::tls::DEV_CERT_FILES.join(", "),
        args.out.display()
    );

    Ok(ExitCode::SUCCESS)
}

/// `tailflight status`: a process's status, as JSON.
fn run_status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let config = flight_server::ClientConfig {
        endpoint: args.to.clone(),
        tls: args.tls.config(),
        ..Default::default()
    };
    let status = runtime()?.block_on(flight_server::client::action(
        &config,
        flight_server::protocol::ACTION_STATUS,
        Vec::new(),
    ))?;
    println!("{}", String::from_utf8_lossy(&status));

    Ok(ExitCode::SUCCESS)
}

/// `tailflight audit`: checks a stopped sink's manifest.
fn run_audit(args: AuditArgs) -> anyhow::Result<ExitCode> {
    let report = sink::audit(&args.state, args.files)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(if report.overlapping_placements == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
