//! `tailflight demo`: the whole pipeline on loopback in one process, with
//! state in a local folder: the simulator writes growing files, the watcher
//! tails them, the sink places them. The sink starts first; the rate is
//! picked from the disk's measured write speed (source and destination
//! share it); one live progress line (logs go to `<dir>/demo.log`); then a
//! verification and a one-screen summary.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;

use crate::process::say;

#[derive(Args, Clone)]
pub struct DemoArgs {
    /// Folder for the demo's source, destination and state (emptied first).
    #[arg(long, default_value = "tailflight-demo")]
    dir: PathBuf,
    /// How long the simulator writes.
    #[arg(long, default_value = "10s", value_parser = crate::parse::parse_duration)]
    duration: Duration,
    /// Files written in parallel.
    #[arg(long, default_value_t = 4)]
    streams: usize,
    /// Frames per second per stream.
    #[arg(long, default_value_t = 120.0)]
    rate: f64,
    /// Bytes per frame (default: up to 1 MiB, so that the demo writes at
    /// most a quarter of what the disk under --dir measured it can take:
    /// every byte is written twice there, and flushed).
    #[arg(long, value_parser = crate::parse::parse_size)]
    frame: Option<u64>,
    /// Chunk size at which files rotate.
    #[arg(long, default_value = "64MiB", value_parser = crate::parse::parse_size)]
    chunk: u64,
    /// TCP connections from watcher to sink.
    #[arg(long, default_value_t = 4)]
    connections: usize,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// The disk's sustained write speed under `dir` (bytes/s): 128 MiB written
/// and flushed, then removed.
fn measure_disk(dir: &std::path::Path) -> anyhow::Result<f64> {
    use std::io::Write;
    let path = dir.join(".disk-speed");
    let block = vec![0x5au8; 4 << 20];
    let started = Instant::now();
    let mut file = std::fs::File::create(&path)
        .with_context(|| format!("cannot measure the disk at {}", dir.display()))?;
    for _ in 0..32 {
        file.write_all(&block)?;
    }
    file.sync_data()?;
    let elapsed = started.elapsed().as_secs_f64();
    drop(file);
    let _ = std::fs::remove_file(&path);
    Ok((32 * block.len()) as f64 / elapsed.max(1e-6))
}

/// The frame size that keeps the demo's writes at a quarter of the disk's
/// speed, a power of two between 16 KiB and 1 MiB.
fn frame_for(disk_bytes_per_sec: f64, streams: usize, rate: f64) -> u64 {
    let budget = disk_bytes_per_sec / 4.0 / (streams.max(1) as f64 * rate.max(1.0));
    let mut frame = 1u64 << 20;
    while frame > 16 << 10 && frame as f64 > budget {
        frame /= 2;
    }
    frame
}

/// The demo's log file, `<dir>/demo.log` (created afresh).
pub fn log_file(args: &DemoArgs) -> anyhow::Result<std::fs::File> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    let path = args.dir.join("demo.log");
    std::fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))
}

pub fn run(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let source_dir = args.dir.join("source");
    let dest_dir = args.dir.join("dest");
    clear(&args)?;
    std::fs::create_dir_all(&source_dir)?;
    let frame = choose_frame(&args)?;
    let runtime = crate::process::runtime()?;
    let pipeline = Pipeline::start(&runtime, &args, &source_dir, &dest_dir)?;
    let sim = detector_sim::SimConfig {
        dir: source_dir.clone(),
        streams: args.streams,
        rate_hz: args.rate,
        frame_bytes: frame as usize,
        chunk_bytes: args.chunk,
        duration: Some(args.duration),
        ..Default::default()
    };
    println!(
        "tailflight demo: {} streams x {} Hz x {:.0} KiB frames for {:?}; sink on {}; files in {}, logs in {}",
        args.streams,
        args.rate,
        frame as f64 / 1024.0,
        args.duration,
        pipeline.listen,
        args.dir.display(),
        args.dir.join("demo.log").display()
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
    let watched = watch_progress(&pipeline.progress, &sim_done);
    let report = sim_thread
        .join()
        .map_err(|_| anyhow::anyhow!("the simulator panicked"))??;
    pipeline.stop(&runtime);
    let verify =
        crate::verify::verify_trees(&source_dir, &dest_dir.join("demo"), &Default::default())?;
    print_summary(&args, &dest_dir, &report, &watched, &verify);
    Ok(if verify.is_identical() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Empties what an earlier demo left in the directory.
fn clear(args: &DemoArgs) -> anyhow::Result<()> {
    for sub in ["source", "dest", "sink-state", "watch-state"] {
        let path = args.dir.join(sub);
        if path.exists() {
            std::fs::remove_dir_all(&path)
                .with_context(|| format!("cannot clear {}", path.display()))?;
        }
    }
    Ok(())
}

/// The frame size asked for, or one the disk under the directory keeps up
/// with.
fn choose_frame(args: &DemoArgs) -> anyhow::Result<u64> {
    if let Some(frame) = args.frame {
        return Ok(frame);
    }
    let disk = measure_disk(&args.dir)?;
    let frame = frame_for(disk, args.streams, args.rate);
    println!(
        "disk under {}: {:.0} MiB/s written and flushed; frames of {:.0} KiB keep the demo at {:.0} MiB/s (--frame to choose)",
        args.dir.display(),
        mib(disk as u64),
        frame as f64 / 1024.0,
        mib(frame) * args.streams as f64 * args.rate,
    );
    Ok(frame)
}

/// The demo's sink and watcher, on the demo's runtime.
struct Pipeline {
    listen: std::net::SocketAddr,
    progress: Arc<watcher::Progress>,
    stop_sink: tokio::sync::oneshot::Sender<()>,
    sink_task: tokio::task::JoinHandle<anyhow::Result<()>>,
    stop_watch: tokio::sync::oneshot::Sender<()>,
    watch_task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Pipeline {
    fn start(
        runtime: &tokio::runtime::Runtime,
        args: &DemoArgs,
        source_dir: &std::path::Path,
        dest_dir: &std::path::Path,
    ) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let listen = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let (stop_sink, sink_stopped) = tokio::sync::oneshot::channel::<()>();
        let sink_config = sink::SinkConfig {
            root: dest_dir.to_owned(),
            state_dir: args.dir.join("sink-state"),
            listen,
            ..Default::default()
        };
        let sink_task = runtime.spawn(sink::run(sink_config, async {
            let _ = sink_stopped.await;
        }));
        // The watcher starts once the sink listens, so that it finds it there.
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(listen).is_err() {
            if sink_task.is_finished() || Instant::now() > deadline {
                let failed = runtime.block_on(sink_task);
                anyhow::bail!(
                    "the demo's sink did not start: {failed:?} (see {})",
                    args.dir.join("demo.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let progress = Arc::new(watcher::Progress::default());
        let (stop_watch, watch_stopped) = tokio::sync::oneshot::channel::<()>();
        let watch_config = watcher::WatchConfig {
            root: source_dir.to_owned(),
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
        Ok(Self {
            listen,
            progress,
            stop_sink,
            sink_task,
            stop_watch,
            watch_task,
        })
    }

    /// The watcher first, so that it never sees its sink go away.
    fn stop(self, runtime: &tokio::runtime::Runtime) {
        let _ = self.stop_watch.send(());
        runtime.block_on(async {
            if let Ok(Err(e)) = self.watch_task.await {
                say!("watcher: {e:#}");
            }
            let _ = self.stop_sink.send(());
            if let Ok(Err(e)) = self.sink_task.await {
                say!("sink: {e:#}");
            }
        });
    }
}

/// What the progress line saw over the run.
struct Watched {
    started: Instant,
    worst_behind: f64,
    /// Seconds from the start until the simulator stopped.
    transfer_secs: f64,
}

/// One progress line every 250 ms on a terminal (every 2 s otherwise),
/// until every file is sealed after the simulator stopped, or a minute
/// after it did.
fn watch_progress(progress: &watcher::Progress, sim_done: &AtomicBool) -> Watched {
    let started = Instant::now();
    let mut last = (Instant::now(), 0u64);
    let mut worst_behind = 0.0f64;
    let deadline_after_sim = Duration::from_secs(60);
    let mut sim_finished_at = None;
    let live = std::io::IsTerminal::is_terminal(&std::io::stdout());
    loop {
        std::thread::sleep(Duration::from_millis(if live { 250 } else { 2000 }));
        let acked = progress.bytes_acked();
        let now = Instant::now();
        let rate = mib(acked - last.1) / now.duration_since(last.0).as_secs_f64();
        last = (now, acked);
        let files = progress.files();
        let summary = progress.summary(&files);
        worst_behind = worst_behind.max(summary.lag_seconds_max);
        let line = format!(
            "t={:>5.1}s  {:<14}  durable {:>8.1} MiB  {:>6.1} MiB/s  behind {:>6.2} MiB / {:>5.2} s  files {:>2} open, {:>3} sealed",
            started.elapsed().as_secs_f64(),
            summary.verdict.as_str(),
            mib(acked),
            rate,
            mib(summary.lag_bytes_sum),
            summary.lag_seconds_max,
            files.len(),
            progress.sealed_files(),
        );
        if live {
            use std::io::Write;
            print!("\r{line}\x1b[K");
            let _ = std::io::stdout().flush();
        } else {
            println!("{line}");
        }
        if sim_done.load(Ordering::Relaxed) {
            let finished = *sim_finished_at.get_or_insert(now);
            if files.is_empty() && progress.sealed_files() > 0 {
                break;
            }
            if now.duration_since(finished) > deadline_after_sim {
                println!(
                    "\nnot everything was sealed {deadline_after_sim:?} after the simulator stopped:"
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
    if live {
        println!();
    }
    Watched {
        started,
        worst_behind,
        transfer_secs: sim_finished_at
            .map_or(started.elapsed(), |t| t.duration_since(started))
            .as_secs_f64(),
    }
}

/// The one-screen summary: what was written, the worst lag, how soon all
/// was sealed, and whether the destination is identical.
fn print_summary(
    args: &DemoArgs,
    dest_dir: &std::path::Path,
    report: &detector_sim::SimReport,
    watched: &Watched,
    verify: &crate::verify::VerifyReport,
) {
    let written = report.elapsed.as_secs_f64().max(1e-9);
    let settled = watched.started.elapsed().as_secs_f64() - watched.transfer_secs;
    println!();
    println!(
        "  written      {:.1} MiB in {} files over {:.1} s ({:.1} MiB/s)",
        mib(report.bytes),
        report.files.len(),
        written,
        mib(report.bytes) / written
    );
    println!(
        "  worst lag    {:.3} s behind the writer",
        watched.worst_behind
    );
    println!("  all sealed   {settled:.1} s after the writer stopped");
    println!(
        "  destination  {} ({})",
        dest_dir.join("demo").display(),
        if verify.is_identical() {
            "IDENTICAL to the source"
        } else {
            "DIFFERS from the source"
        }
    );
    if !verify.is_identical() {
        println!("{verify}");
    }
    println!("  logs         {}", args.dir.join("demo.log").display());
}
