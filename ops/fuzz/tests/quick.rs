//! The quick fuzzing run CI makes (10,000 cases of a fixed seed, or of
//! `TAILFLIGHT_FUZZ_SEED`), and the replay of every crasher kept in the
//! corpus: each must now break no rule.

use std::path::PathBuf;

fn scratch(name: &str) -> PathBuf {
    let base = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    base.join(format!("tailflight-fuzz-{name}-{}", std::process::id()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_hostile_streams_break_no_rule() {
    tailflight_fuzz::count_panics_quietly();
    let seed = std::env::var("TAILFLIGHT_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_127);
    let work = scratch("quick");
    let campaign = tailflight_fuzz::Campaign {
        cases: 10_000,
        seed,
        jobs: 32,
        work: work.clone(),
        cases_per_sink: 2_500,
        corpus: None,
    };
    let report = tailflight_fuzz::run(&campaign, |_| {})
        .await
        .expect("the campaign ran");
    let _ = std::fs::remove_dir_all(&work);
    let crashers: Vec<String> = report.crashers.iter().map(|c| c.to_string()).collect();
    assert!(
        crashers.is_empty(),
        "seed {seed}: {} crashers:\n{}",
        crashers.len(),
        crashers.join("\n")
    );
    assert_eq!(report.cases, 10_000);
    // The generator must still reach the sink: valid streams placed, and
    // hostile ones refused as the peer's fault.
    assert!(report.valid_cases > 0);
    assert!(
        report.valid_retryable < report.valid_cases,
        "no valid stream got through"
    );
    assert!(report.endings.get("InvalidArgument").copied().unwrap_or(0) > 0);
    let answers = tailflight_fuzz::answers::run(10_000, seed);
    assert!(answers.crashers.is_empty(), "{:?}", answers.crashers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_crasher_in_the_corpus_now_breaks_no_rule() {
    tailflight_fuzz::count_panics_quietly();
    let corpus = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let entries = tailflight_fuzz::corpus::entries(&corpus).expect("read the corpus");
    let work = scratch("corpus");
    let mut failures = Vec::new();
    for entry in &entries {
        match tailflight_fuzz::replay(entry, work.clone()).await {
            Ok(None) => {}
            Ok(Some(violation)) => failures.push(format!("{}: {violation}", entry.display())),
            Err(e) => failures.push(format!("{}: {e:#}", entry.display())),
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
