//! `tailflight demo`: the whole pipeline on loopback in one process, with
//! state in a local folder: the simulator writes growing files, the watcher
//! tails them, the sink places them. Live progress in the terminal, then a
//! verification and a summary.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;

#[derive(Args, Clone)]
pub struct DemoArgs {
    /// Folder for the demo's source, destination and state (emptied first).
    #[arg(long, default_value = "tailflight-demo")]
    dir: PathBuf,
    /// How long the simulator writes.
    #[arg(long, default_value = "10s", value_parser = crate::parse_duration)]
    duration: Duration,
    /// Files written in parallel.
    #[arg(long, default_value_t = 4)]
    streams: usize,
    /// Frames per second per stream.
    #[arg(long, default_value_t = 120.0)]
    rate: f64,
    /// Bytes per frame.
    #[arg(long, default_value = "1MiB", value_parser = crate::parse_size)]
    frame: u64,
    /// Chunk size at which files rotate.
    #[arg(long, default_value = "64MiB", value_parser = crate::parse_size)]
    chunk: u64,
    /// TCP connections from watcher to sink.
    #[arg(long, default_value_t = 4)]
    connections: usize,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

pub fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let source_dir = args.dir.join("source");
    let dest_dir = args.dir.join("dest");
    for sub in ["source", "dest", "sink-state", "watch-state"] {
        let path = args.dir.join(sub);
        if path.exists() {
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("cannot clear {}", path.display()))?;
        }
    }
    std::fs::create_dir_all(&source_dir)?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let listen = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let runtime = crate::runtime()?;
    let (stop_sink, sink_stopped) = tokio::sync::oneshot::channel::<()>();
    let sink_config = sink::SinkConfig {
        root: dest_dir.clone(),
        state_dir: args.dir.join("sink-state"),
        listen,
        ..Default::default()
    };
    let sink_task = runtime.spawn(sink::run(sink_config, async {
        let _ = sink_stopped.await;
    }));
    let progress = Arc::new(watcher::Progress::default());
    let (stop_watch, watch_stopped) = tokio::sync::oneshot::channel::<()>();
    let watch_config = watcher::WatchConfig {
        root: source_dir.clone(),
        source: "demo".into(),
        state_dir: args.dir.join("watch-state"),
        sinks: vec![format!("http://{listen}")],
        connections: args.connections,
        seal_idle: Duration::from_secs(2),
        ..Default::default()
    };
    let watch_task = runtime.spawn(watcher::run(watch_config, progress.clone(), async {
        let _ = watch_stopped.await;
    }));

    let sim = detector_sim::SimConfig {
        dir: source_dir.clone(),
        streams: args.streams,
        rate_hz: args.rate,
        frame_bytes: args.frame as usize,
        chunk_bytes: args.chunk,
        duration: Some(args.duration),
        ..Default::default()
    };
    println!(
        "tailflight demo: {} streams x {} Hz x {:.1} MiB frames for {:?}; sink on {listen}; files in {}",
        args.streams,
        args.rate,
        mib(args.frame),
        args.duration,
        args.dir.display()
    );
    let sim_stop = Arc::new(AtomicBool::new(false));
    let sim_done = Arc::new(AtomicBool::new(false));
    let sim_thread = {
        let (stop, done) = (sim_stop.clone(), sim_done.clone());
        std::thread::spawn(move || {
            let report = detector_sim::run(&sim, &stop);
            done.store(true, Ordering::Relaxed);
            report
        })
    };

    let started = Instant::now();
    let mut last = (Instant::now(), 0u64);
    let mut worst_behind = 0.0f64;
    let deadline_after_sim = Duration::from_secs(60);
    let mut sim_finished_at = None;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let acked = progress.bytes_acked();
        let now = Instant::now();
        let rate = mib(acked - last.1) / now.duration_since(last.0).as_secs_f64();
        last = (now, acked);
        let files = progress.files();
        let behind = files.iter().map(|f| f.seconds_behind).fold(0.0, f64::max);
        worst_behind = worst_behind.max(behind);
        let lag_bytes: u64 = files.iter().map(|f| f.bytes_behind()).sum();
        println!(
            "t={:>5.1}s  read {:>8.1} MiB  acked {:>8.1} MiB  {:>7.1} MiB/s  active {:>2}  sealed {:>3}  behind {:>6.2} MiB / {:.3}s",
            started.elapsed().as_secs_f64(),
            mib(progress.bytes_read()),
            mib(acked),
            rate,
            files.len(),
            progress.sealed_files(),
            mib(lag_bytes),
            behind
        );
        for f in files.iter().filter(|f| f.bytes_behind() > 0).take(8) {
            println!(
                "        {:<40} {:>8.1} MiB  behind {:>6.2} MiB / {:.3}s",
                f.path,
                mib(f.size),
                mib(f.bytes_behind()),
                f.seconds_behind
            );
        }
        if sim_done.load(Ordering::Relaxed) {
            let finished = *sim_finished_at.get_or_insert(now);
            if files.is_empty() && progress.sealed_files() > 0 {
                break;
            }
            if now.duration_since(finished) > deadline_after_sim {
                println!(
                    "not everything was sealed {deadline_after_sim:?} after the simulator stopped:"
                );
                for f in &files {
                    println!(
                        "        still open: {} ({} of {} bytes acknowledged)",
                        f.path, f.acked, f.size
                    );
                }
                break;
            }
        }
    }
    let report = sim_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the simulator panicked"))??;
    let transfer_secs = sim_finished_at
        .map_or(started.elapsed(), |t| t.duration_since(started))
        .as_secs_f64();
    let _ = stop_watch.send(());
    let _ = stop_sink.send(());
    runtime.block_on(async {
        if let Ok(Err(e)) = watch_task.await {
            eprintln!("watcher: {e:#}");
        }
        if let Ok(Err(e)) = sink_task.await {
            eprintln!("sink: {e:#}");
        }
    });
    let verify =
        crate::verify::verify_trees(&source_dir, &dest_dir.join("demo"), &Default::default())?;
    println!("{verify}");
    println!(
        "summary: {:.1} MiB in {} files, written in {:.1}s ({:.1} MiB/s); everything sealed {:.1}s after the writer stopped; worst lag seen {:.3}s; destination {}",
        mib(report.bytes),
        report.files.len(),
        report.elapsed.as_secs_f64(),
        mib(report.bytes) / report.elapsed.as_secs_f64().max(1e-9),
        started.elapsed().as_secs_f64() - transfer_secs,
        worst_behind,
        if verify.is_identical() {
            "IDENTICAL"
        } else {
            "DIFFERS"
        }
    );
    Ok(if verify.is_identical() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
