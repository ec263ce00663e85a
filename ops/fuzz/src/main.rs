//! `tailflight-fuzz`: runs a fuzzing campaign against a sink in this
//! process, then the watcher's answer cases, and reports (see `ops/fuzz/run.sh`).

use std::path::PathBuf;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Structure-aware fuzzing of the sink's DoPut input and the watcher's answers")]
struct Args {
    /// Streams to send.
    #[arg(long, default_value_t = 1_000_000)]
    cases: u64,
    /// Seed of the run (a case is reproduced from its seed and number).
    #[arg(long)]
    seed: Option<u64>,
    /// Streams sent at once.
    #[arg(long, default_value_t = 32)]
    jobs: usize,
    /// Cases per sink before it is stopped, audited and replaced.
    #[arg(long, default_value_t = 5_000)]
    cases_per_sink: u64,
    /// Scratch directory (a tmpfs keeps the sinks' fsyncs cheap).
    #[arg(long, default_value = "/dev/shm/tailflight-fuzz")]
    work: PathBuf,
    /// Where crashers are written.
    #[arg(long, default_value = "ops/fuzz/corpus")]
    corpus: PathBuf,
    /// Answer cases for the watcher's side.
    #[arg(long, default_value_t = 1_000_000)]
    answer_cases: u64,
    /// Run just these cases of --seed, one at a time on a fresh sink each.
    #[arg(long, num_args = 1.., requires = "seed")]
    case: Vec<u64>,
    /// Replay these corpus files instead of fuzzing.
    #[arg(long, num_args = 1..)]
    replay: Vec<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tailflight_fuzz::count_panics_quietly();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if !args.case.is_empty() {
        let seed = args.seed.unwrap_or_default();
        for &number in &args.case {
            let case = tailflight_fuzz::make_case(seed, number);
            println!("case {number}: mutations {:?}", case.mutations);
            println!("{}", tailflight_fuzz::describe_valid_plan(seed, number));
            let violation =
                runtime.block_on(tailflight_fuzz::run_alone(&case, args.work.join("alone")))?;
            println!("  {}", violation.as_deref().unwrap_or("clean"));
        }
        return Ok(());
    }
    if !args.replay.is_empty() {
        let mut failed = 0;
        for path in &args.replay {
            let violation =
                runtime.block_on(tailflight_fuzz::replay(path, args.work.join("replay")))?;
            match violation {
                Some(v) => {
                    failed += 1;
                    println!("{}: {v}", path.display());
                }
                None => println!("{}: clean", path.display()),
            }
        }
        anyhow::ensure!(failed == 0, "{failed} corpus cases still break a rule");
        return Ok(());
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let campaign = tailflight_fuzz::Campaign {
        cases: args.cases,
        seed,
        jobs: args.jobs,
        work: args.work.clone(),
        cases_per_sink: args.cases_per_sink,
        corpus: Some(args.corpus.clone()),
    };
    println!(
        "fuzzing the sink's input: {} cases, seed {seed}, {} at once, scratch {}",
        args.cases,
        args.jobs,
        args.work.display()
    );
    let report = runtime.block_on(tailflight_fuzz::run(&campaign, |report| {
        eprintln!(
            "  {} cases in {:.0} s ({:.0}/s), {} crashers, peak RSS {} MiB",
            report.cases,
            report.elapsed.as_secs_f64(),
            report.cases as f64 / report.elapsed.as_secs_f64().max(1e-9),
            report.crashers.len(),
            report.peak_rss_kib >> 10
        );
    }))?;
    let _ = std::fs::remove_dir_all(&args.work);
    println!(
        "sink input: {} cases ({} valid) on {} sinks in {:.1} s ({:.0} cases/s)",
        report.cases,
        report.valid_cases,
        report.sinks,
        report.elapsed.as_secs_f64(),
        report.cases as f64 / report.elapsed.as_secs_f64().max(1e-9)
    );
    println!("  stream endings: {:?}", report.endings);
    println!(
        "  valid streams refused as retryable: {} {:?}",
        report.valid_retryable, report.valid_retryable_reasons
    );
    println!(
        "  batches acknowledged: {}; streams given up on (acks held for missing bytes): {}",
        report.acked_batches, report.gave_up
    );
    println!(
        "  peak RSS of the process (fuzzer and sinks): {} MiB",
        report.peak_rss_kib >> 10
    );
    println!(
        "  panics raised and caught (decoding hostile IPC inside arrow): {:?}",
        tailflight_fuzz::panics_caught()
    );
    println!("  crashers: {}", report.crashers.len());
    let mut by_signature: std::collections::BTreeMap<String, Vec<&tailflight_fuzz::Crasher>> =
        Default::default();
    for crasher in &report.crashers {
        by_signature
            .entry(tailflight_fuzz::signature(&crasher.violation))
            .or_default()
            .push(crasher);
    }
    for (signature, crashers) in &by_signature {
        println!("    {} x {signature}", crashers.len());
        for crasher in crashers.iter().take(3) {
            println!("      {crasher}");
        }
    }
    let answers = tailflight_fuzz::answers::run(args.answer_cases, seed);
    println!(
        "watcher answers: {} cases: {} acks and {} watermark lists read, {} refused, {} crashers",
        answers.cases,
        answers.acks_read,
        answers.watermarks_read,
        answers.refused,
        answers.crashers.len()
    );
    for crasher in &answers.crashers {
        println!("    {crasher}");
    }
    anyhow::ensure!(
        report.crashers.is_empty() && answers.crashers.is_empty(),
        "crashers found (saved under {})",
        args.corpus.display()
    );
    Ok(())
}
