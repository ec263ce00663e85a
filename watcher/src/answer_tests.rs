//! The tailer against a sink whose answers are garbled (byte counts near
//! `u64::MAX`, rejections of rows that do not exist, refusals, unknown
//! sequence numbers) and whose watermarks are nonsense (generations 0 and
//! `u64::MAX`, ends past the file, heads longer than it): it must go on,
//! and stop when asked, without a panic. What it does with a file such a
//! sink refuses is the sink's to decide; that it survives is the watcher's.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flight_server::FileWatermark;

use crate::WatchConfig;
use crate::progress::Progress;
use crate::stop::Stop;
use crate::tail::Tailer;
use crate::testkit::{Dest, FakeSinks, Scratch};
use manifest_db::WatchState;

fn nonsense_watermarks(seed: u64, paths: &[String]) -> Vec<(usize, FileWatermark)> {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let extremes = [0, 1, u64::MAX, u64::MAX - 1, 1 << 63, 4096];
    (0..8)
        .map(|i| {
            let path = paths[i % paths.len()].clone();
            let pick = |n: u64| extremes[(n % extremes.len() as u64) as usize];
            let mark = FileWatermark {
                key: if next() % 2 == 0 {
                    path.clone()
                } else {
                    format!("{path}/../x")
                },
                generation: pick(next()),
                path,
                contiguous_end: pick(next()),
                placed_bytes: pick(next()),
                sealed_size: (next() % 2 == 0).then(|| pick(next())),
                superseded: next() % 4 == 0,
                head_crc32c: next() as u32,
                head_len: pick(next()),
            };
            ((next() % 3) as usize, mark)
        })
        .collect()
}

fn run_against_a_garbling_sink(seed: u64) {
    let scratch = Scratch::new(&format!("garbled-{seed}"));
    let root = scratch.path().join("src");
    std::fs::create_dir_all(root.join("run")).expect("create the source");
    let paths: Vec<String> = (0..4).map(|i| format!("run/f{i}.dat")).collect();
    for (i, path) in paths.iter().enumerate() {
        std::fs::write(root.join(path), vec![i as u8 + 1; 5000 * (i + 1)]).expect("write");
    }
    let config = Arc::new(WatchConfig {
        root: root.clone(),
        source: "garbled".into(),
        sinks: vec!["one".into(), "two".into()],
        rescan_every: Duration::from_millis(50),
        batch_bytes: 4 << 10,
        max_row_bytes: 1 << 10,
        seal: true,
        seal_idle: Duration::from_millis(10),
        ..WatchConfig::default()
    });
    let state = WatchState::open(&scratch.path().join("state")).expect("open the watch state");
    let dest = Arc::new(Mutex::new(Dest {
        garble_answers: Some(seed | 1),
        ..Dest::default()
    }));
    let (sinks, outboxes, deliveries) = FakeSinks::start(config.sinks.len(), dest.clone());
    let stop = Arc::new(Stop::default());
    let tailer = Tailer::new(
        config,
        state,
        nonsense_watermarks(seed, &paths),
        outboxes,
        deliveries,
        Arc::new(Progress::default()),
        stop.clone(),
    )
    .expect("a tailer starts whatever the watermarks say");
    let thread = std::thread::spawn(move || tailer.run());
    // Keep the files changing while the answers are garbled.
    for round in 0..10u8 {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(root.join(&paths[round as usize % paths.len()]))
            .expect("open a source file");
        file.write_all(&[round; 3000]).expect("append");
        std::thread::sleep(Duration::from_millis(30));
    }
    stop.request();
    let result = thread.join();
    sinks.join();
    match result {
        Ok(outcome) => {
            if let Err(error) = outcome {
                // An error is an answer; only a panic is not.
                eprintln!("seed {seed}: the tailer stopped with: {error:#}");
            }
        }
        Err(_) => panic!("seed {seed}: the tailer panicked on a garbling sink's answers"),
    }
}

#[test]
fn garbled_answers_and_nonsense_watermarks_do_not_bring_the_tailer_down() {
    for seed in 1..=24 {
        run_against_a_garbling_sink(seed);
    }
}
