//! Structure-aware fuzzing of tailflight's input paths.
//!
//! - [`plan`]: a DoPut stream before it becomes bytes, and valid ones;
//! - [`mutate`]: what a broken or hostile peer changes in it;
//! - [`target`]: a real sink on a scratch root, and the rules every case
//!   must keep whatever its bytes;
//! - [`corpus`]: crashers kept as regression cases;
//! - [`answers`]: the watcher's reading of a sink's acks and watermarks.
//!
//! A case is its seed: the same seed makes the same stream, so a crasher
//! is reproduced from the number in its report.

pub mod answers;
pub mod corpus;
pub mod mutate;
pub mod plan;
pub mod target;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use arrow_flight::FlightData;
use futures::StreamExt;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use tonic::Code;

use crate::plan::{Expected, Plan};
use crate::target::Target;

/// What a fuzzing run is asked to do.
#[derive(Clone, Debug)]
pub struct Campaign {
    pub cases: u64,
    pub seed: u64,
    /// Streams sent at once.
    pub jobs: usize,
    /// Scratch directory for the sinks (a tmpfs keeps fsyncs cheap).
    pub work: PathBuf,
    /// Cases per sink: each sink is then stopped, audited and removed, so
    /// its root and manifest stay small.
    pub cases_per_sink: u64,
    /// Where crashers are written (none if `None`).
    pub corpus: Option<PathBuf>,
}

/// One stream that broke a rule.
#[derive(Clone, Debug)]
pub struct Crasher {
    pub case: u64,
    pub seed: u64,
    pub mutations: Vec<String>,
    pub violation: String,
    pub saved: Option<PathBuf>,
}

impl std::fmt::Display for Crasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "case {} of seed {}: {} (mutations: {})",
            self.case,
            self.seed,
            self.violation,
            if self.mutations.is_empty() {
                "none".to_string()
            } else {
                self.mutations.join("; ")
            }
        )
    }
}

/// What a run came to.
#[derive(Debug, Default)]
pub struct Report {
    pub cases: u64,
    pub valid_cases: u64,
    /// Valid streams refused as retryable, and a few of the reasons given.
    pub valid_retryable: u64,
    pub valid_retryable_reasons: Vec<String>,
    /// How streams ended, by gRPC code ("OK" when every batch was acked).
    pub endings: std::collections::BTreeMap<String, u64>,
    /// Mutated streams still waiting for acks at their time limit (ranges
    /// held for bytes that never came), ended as a vanished peer's.
    pub gave_up: u64,
    pub acked_batches: u64,
    pub sinks: u64,
    pub crashers: Vec<Crasher>,
    pub elapsed: Duration,
    /// Peak resident set of this process (the sinks run in it), in KiB.
    pub peak_rss_kib: u64,
}

/// One generated case: its messages, and what a valid one must leave.
pub struct Case {
    pub number: u64,
    pub messages: Vec<FlightData>,
    pub expected: Option<Expected>,
    pub mutations: Vec<String>,
}

/// Makes case `number` of `seed`: a valid stream, mutated 1-3 times in nine
/// cases out of ten.
pub fn make_case(seed: u64, number: u64) -> Case {
    let mut rng = SmallRng::seed_from_u64(seed ^ number.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let (mut plan, expected) = Plan::valid(&mut rng, number);
    let mut mutations = Vec::new();
    let mutate = !rng.random_bool(0.1);
    let count = if mutate { rng.random_range(1..=3) } else { 0 };
    let byte_level: Vec<bool> = (0..count).map(|_| rng.random_bool(0.35)).collect();
    for _ in byte_level.iter().filter(|b| !**b) {
        mutations.push(mutate::structure(&mut plan, &mut rng));
    }
    let mut messages = match plan.encode() {
        Ok(messages) => messages,
        Err(e) => {
            mutations.push(format!("(could not encode: {e}; sent nothing)"));
            Vec::new()
        }
    };
    for _ in byte_level.iter().filter(|b| **b) {
        mutations.push(mutate::bytes(&mut messages, &mut rng));
    }
    Case {
        number,
        messages,
        expected: (!mutate).then_some(expected),
        mutations,
    }
}

/// The rows of case `number`'s valid plan, before mutation, a line each.
pub fn describe_valid_plan(seed: u64, number: u64) -> String {
    let mut rng = SmallRng::seed_from_u64(seed ^ number.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let (plan, _) = Plan::valid(&mut rng, number);
    let mut lines = Vec::new();
    for (b, batch) in plan.batches.iter().enumerate() {
        for row in &batch.rows {
            lines.push(format!(
                "batch {b}: kind {} key {} gen {} offset {} len {} path {:?} digest {:?}",
                row.kind,
                row.file_key,
                row.generation,
                row.offset,
                row.data.len(),
                row.path,
                row.digest
            ));
        }
    }
    lines.join("\n")
}

/// Peak resident set size of this process (VmHWM), in KiB.
pub fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmHWM:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kib| kib.parse().ok())
        })
        .unwrap_or(0)
}

fn code_name(code: Code) -> String {
    format!("{code:?}")
}

/// Panics raised and caught while cases ran, by where they were raised.
/// The sink catches a panic of arrow's decoding of a peer's bytes and
/// refuses the stream; a panic anywhere else surfaces as a violation.
static PANICS: std::sync::Mutex<std::collections::BTreeMap<String, u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Counts panics instead of printing each: a million hostile streams raise
/// thousands of them inside arrow, each caught and refused.
pub fn count_panics_quietly() {
    std::panic::set_hook(Box::new(|info| {
        let place = info.location().map_or_else(
            || "unknown".to_string(),
            |l| format!("{}:{}", l.file(), l.line()),
        );
        let mut panics = PANICS.lock().unwrap_or_else(|p| p.into_inner());
        *panics.entry(place).or_default() += 1;
    }));
}

/// The panics counted so far (see [`count_panics_quietly`]).
pub fn panics_caught() -> std::collections::BTreeMap<String, u64> {
    PANICS.lock().unwrap_or_else(|p| p.into_inner()).clone()
}

/// A violation's text without its numbers and quoted names: crashers with
/// one signature are one bug.
pub fn signature(violation: &str) -> String {
    let mut out = String::new();
    let mut quoted = false;
    for c in violation.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                out.push('"');
            }
            _ if quoted => {}
            '0'..='9' => {
                if !out.ends_with('#') {
                    out.push('#');
                }
            }
            _ => out.push(c),
        }
    }
    out.chars().take(120).collect()
}

/// Most crashers of one signature kept in the corpus.
const SAVED_PER_SIGNATURE: usize = 3;

/// Runs a campaign; `progress` is called after each sink with the report so far.
pub async fn run(campaign: &Campaign, mut progress: impl FnMut(&Report)) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut report = Report::default();
    let mut saved: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut next = 0u64;
    while report.cases < campaign.cases {
        let end = next + campaign.cases_per_sink.min(campaign.cases - report.cases);
        let dir = campaign.work.join(format!("sink-{}", report.sinks));
        let target = Target::open(dir, report.sinks)?;
        report.sinks += 1;
        type Ran = (Case, Option<Result<target::Outcome, target::Violation>>);
        let results: Vec<Ran> = futures::stream::iter(next..end)
            .map(|number| {
                let target = &target;
                async move {
                    let case = make_case(campaign.seed, number);
                    // A poisoned sink refuses everything: the cases left
                    // wait for the next sink.
                    if target.sink.health().is_poisoned() {
                        return (case, None);
                    }
                    let outcome = target
                        .run(case.messages.clone(), case.expected.as_ref())
                        .await;
                    (case, Some(outcome))
                }
            })
            .buffer_unordered(campaign.jobs.max(1))
            .collect()
            .await;
        for (case, outcome) in results {
            let Some(outcome) = outcome else { continue };
            report.cases += 1;
            if case.expected.is_some() {
                report.valid_cases += 1;
            }
            match outcome {
                Ok(outcome) => {
                    if let (Some(_), Some(status)) = (&case.expected, &outcome.ended) {
                        report.valid_retryable += 1;
                        if report.valid_retryable_reasons.len() < 3 {
                            report
                                .valid_retryable_reasons
                                .push(status.message().to_string());
                        }
                    }
                    report.acked_batches += outcome.acks.len() as u64;
                    if outcome.timed_out {
                        report.gave_up += 1;
                    }
                    let ending = outcome
                        .ended
                        .as_ref()
                        .map_or_else(|| "OK".to_string(), |s| code_name(s.code()));
                    *report.endings.entry(ending).or_default() += 1;
                }
                Err(violation) => {
                    let count = saved.entry(signature(&violation.0)).or_default();
                    *count += 1;
                    let keep = *count <= SAVED_PER_SIGNATURE;
                    report
                        .crashers
                        .push(crasher(campaign, &case, violation.0, keep));
                }
            }
        }
        if let Err(violation) = target.close().await {
            report.crashers.push(Crasher {
                case: end,
                seed: campaign.seed,
                mutations: vec![format!("after cases {next}..{end} on one sink")],
                violation: violation.0,
                saved: None,
            });
        }
        next = end;
        report.elapsed = started.elapsed();
        report.peak_rss_kib = peak_rss_kib();
        progress(&report);
    }
    Ok(report)
}

fn crasher(campaign: &Campaign, case: &Case, violation: String, keep: bool) -> Crasher {
    let note = format!(
        "seed {} case {}\nmutations: {}\nviolation: {violation}\n",
        campaign.seed,
        case.number,
        case.mutations.join("; ")
    );
    let saved = campaign.corpus.as_ref().filter(|_| keep).and_then(|dir| {
        corpus::save(
            dir,
            &format!("seed{}-case{}", campaign.seed, case.number),
            &case.messages,
            &note,
        )
        .ok()
    });
    Crasher {
        case: case.number,
        seed: campaign.seed,
        mutations: case.mutations.clone(),
        violation,
        saved,
    }
}

/// Replays one corpus file on a fresh sink in `work`: the violation it
/// causes, if any.
pub async fn replay(path: &std::path::Path, work: PathBuf) -> anyhow::Result<Option<String>> {
    let messages = corpus::load(path)?;
    run_messages(messages, None, work).await
}

/// Runs one generated case alone on a fresh sink in `work`.
pub async fn run_alone(case: &Case, work: PathBuf) -> anyhow::Result<Option<String>> {
    run_messages(case.messages.clone(), case.expected.as_ref(), work).await
}

async fn run_messages(
    messages: Vec<FlightData>,
    expected: Option<&Expected>,
    work: PathBuf,
) -> anyhow::Result<Option<String>> {
    let target = Target::open(work, 0)?;
    let ran = target.run(messages, expected).await;
    if let Err(violation) = ran {
        // Kept for a look: the sink's root and manifest as the case left them.
        target.sink.shutdown().await;
        return Ok(Some(format!(
            "{} (left in {})",
            violation.0,
            target.dir.display()
        )));
    }
    let closed = target.close().await;
    Ok(match (ran, closed) {
        (Err(violation), _) | (Ok(_), Err(violation)) => Some(violation.0),
        (Ok(_), Ok(())) => None,
    })
}
