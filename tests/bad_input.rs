//! A real sink process refuses malformed DoPut streams from a hand-made Flight
//! client — paths that escape the root, bad checksums, foreign schemas,
//! oversized messages, garbage bytes, a missing or garbled hello, malformed
//! rows — each with an error that names the problem. After every refusal the
//! sink is still running, nothing was written outside its root, and a good
//! client still gets its batch acknowledged. A positive control checks that a
//! valid batch lands and that sending it again is acknowledged as a duplicate.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arrow_array::{ArrayRef, BinaryArray, RecordBatch, UInt8Array, UInt32Array};
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::utils::batches_to_flight_data;
use arrow_flight::{FlightData, FlightDescriptor};
use arrow_schema::{Field, Schema};
use flight_server::{Ack, BatchBuilder, Hello, SealDigest, range_schema};
use tonic::Code;
use tonic::transport::Endpoint;

/// The sink's `--max-message-bytes`.
const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Only stops a hung test; no run comes near it.
const HANG_GUARD: Duration = Duration::from_secs(120);
/// The hello's source name: files land under `<root>/src/`.
const SOURCE: &str = "src";

/// What came back from one DoPut stream.
#[derive(Debug)]
struct Outcome {
    acks: Vec<Ack>,
    error: Option<tonic::Status>,
}

/// A sink process in a scratch folder, with a runtime for hand-made clients.
struct SinkUnderTest {
    root: PathBuf,
    endpoint: String,
    process: common::Proc,
    runtime: tokio::runtime::Runtime,
    probes: u64,
    /// Last, so the processes stop before their folder is removed.
    dir: common::Scratch,
}

impl SinkUnderTest {
    fn start(name: &str) -> Self {
        let dir = common::scratch(name);
        let root = dir.join("root");
        let endpoint = format!("http://127.0.0.1:{}", common::free_port());
        let listen = endpoint.trim_start_matches("http://").to_owned();
        let mut args = common::strings(&["sink", "--listen", &listen]);
        args.extend(["--root".into(), root.display().to_string()]);
        args.extend(["--state".into(), dir.join("state").display().to_string()]);
        args.extend(["--max-message-bytes".into(), MAX_MESSAGE_BYTES.to_string()]);
        let mut process = common::Proc::spawn(&dir, "sink", &args);
        common::wait_until("the sink answers status", HANG_GUARD, || {
            assert!(
                process.is_running(),
                "the sink exited at start:\n{}",
                process.log_text()
            );
            common::sink_status(&endpoint, &[]).is_some()
        });
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        Self {
            dir,
            root,
            endpoint,
            process,
            runtime,
            probes: 0,
        }
    }

    /// Where files of the hello's source land.
    fn dest(&self, key: &str) -> PathBuf {
        self.root.join(SOURCE).join(key)
    }

    /// Sends `messages` as one DoPut stream on a fresh connection and
    /// collects the acks and the error that ended the stream, if any.
    fn put(&self, messages: Vec<FlightData>) -> Outcome {
        let endpoint = self.endpoint.clone();
        let call = async move {
            let channel = Endpoint::from_shared(endpoint)
                .expect("endpoint URL")
                .connect()
                .await
                .expect("connect to the sink");
            let mut client =
                FlightServiceClient::new(channel).max_decoding_message_size(usize::MAX);
            let mut acks = Vec::new();
            let mut responses = match client.do_put(futures::stream::iter(messages)).await {
                Ok(response) => response.into_inner(),
                Err(status) => {
                    return Outcome {
                        acks,
                        error: Some(status),
                    };
                }
            };
            loop {
                match responses.message().await {
                    Ok(Some(put)) => acks.push(
                        Ack::decode(&put.app_metadata).expect("the sink's ack is JSON of Ack"),
                    ),
                    Ok(None) => return Outcome { acks, error: None },
                    Err(status) => {
                        return Outcome {
                            acks,
                            error: Some(status),
                        };
                    }
                }
            }
        };
        self.runtime
            .block_on(async { tokio::time::timeout(HANG_GUARD, call).await })
            .expect("the DoPut stream hung")
    }

    /// The sink survived, wrote nothing outside its root, and still
    /// acknowledges a valid batch from a good client.
    fn assert_unharmed(&mut self, after: &str) {
        assert!(
            self.process.is_running(),
            "the sink died after {after}:\n{}",
            self.process.log_text()
        );
        self.assert_nothing_outside_root(after);
        self.probes += 1;
        let key = format!("probe/{}.bin", self.probes);
        let data = pattern(4096, self.probes);
        let outcome = self.put(vec![
            hello_message(SOURCE),
            batch_message(&data_batch(&key, 0, &data), 0),
        ]);
        assert!(
            outcome.error.is_none(),
            "after {after}, a valid batch was refused: {:?}",
            outcome.error
        );
        assert_eq!(
            outcome.acks.len(),
            1,
            "after {after}: one ack for one batch: {:?}",
            outcome.acks
        );
        let ack = &outcome.acks[0];
        assert_eq!(
            (ack.seq, ack.placed, ack.duplicate),
            (0, data.len() as u64, 0),
            "after {after}: {ack:?}"
        );
        assert_eq!(
            std::fs::read(self.dest(&key)).ok(),
            Some(data),
            "after {after}: probe content at {key}"
        );
    }

    /// The only files outside the root and the manifest are the sink's log
    /// and what the test itself planted.
    fn assert_nothing_outside_root(&self, after: &str) {
        let stray: Vec<String> = common::list_files(&self.dir)
            .into_iter()
            .filter(|f| !f.starts_with("root/") && !f.starts_with("state/") && f != "sink.log")
            .collect();
        assert!(
            stray.is_empty(),
            "after {after}, files appeared outside the sink's root: {stray:?}"
        );
    }
}

/// Asserts the stream was refused before any ack, and returns the error.
fn refusal(outcome: Outcome, what: &str) -> tonic::Status {
    assert!(
        outcome.acks.is_empty(),
        "{what}: the sink acknowledged {:?}",
        outcome.acks
    );
    outcome
        .error
        .unwrap_or_else(|| panic!("{what}: the sink accepted the stream instead of refusing it"))
}

/// Asserts an InvalidArgument refusal whose message mentions every `needle`.
fn assert_invalid(outcome: Outcome, what: &str, needles: &[&str]) {
    let status = refusal(outcome, what);
    assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
    for needle in needles {
        assert!(
            status.message().contains(needle),
            "{what}: the error does not mention {needle:?}: {}",
            status.message()
        );
    }
}

/// The first message of a correct stream: the range schema with the hello.
fn hello_message(source: &str) -> FlightData {
    let hello = serde_json::to_vec(&Hello::new(source)).expect("hello JSON");
    schema_message(&range_schema()).with_descriptor(FlightDescriptor::new_cmd(hello))
}

/// An IPC schema message without descriptor.
fn schema_message(schema: &Schema) -> FlightData {
    let mut messages =
        batches_to_flight_data(schema, std::iter::empty::<&RecordBatch>()).expect("encode schema");
    messages.remove(0)
}

/// `batch` IPC-encoded, with `seq` as its app_metadata.
fn batch_message(batch: &RecordBatch, seq: u64) -> FlightData {
    let mut messages = batches_to_flight_data(&batch.schema(), [batch]).expect("encode batch");
    let message = messages.pop().expect("a batch message");
    message.with_app_metadata(seq.to_be_bytes().to_vec())
}

/// One data row of generation 1.
fn data_batch(key: &str, offset: u64, data: &[u8]) -> RecordBatch {
    let mut builder = BatchBuilder::with_capacity(1, data.len());
    builder.push_data(key, 1, offset, data);
    builder.finish()
}

fn with_column(batch: &RecordBatch, index: usize, column: ArrayRef) -> RecordBatch {
    let mut columns = batch.columns().to_vec();
    columns[index] = column;
    RecordBatch::try_new(batch.schema(), columns).expect("same types as the wire schema")
}

/// Deterministic bytes that differ from one seed to another.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u64)
                .wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(97))
                .to_le_bytes()[1]
        })
        .collect()
}

/// Deterministic noise (xorshift64).
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn assert_absent(path: &Path, what: &str) {
    assert!(
        std::fs::symlink_metadata(path).is_err(),
        "{what}: {} was created",
        path.display()
    );
}

#[test]
fn paths_escaping_the_root_are_refused() {
    let mut sink = SinkUnderTest::start("bad-input-escape");
    let outside = sink.dir.join("outside");
    std::fs::create_dir_all(&outside).unwrap();

    // 1. Relative paths that climb out of the source's folder or the root.
    for key in ["../escape.bin", "../../escape.bin", "a/../../../escape.bin"] {
        let outcome = sink.put(vec![
            hello_message(SOURCE),
            batch_message(&data_batch(key, 0, b"escape"), 0),
        ]);
        assert_invalid(outcome, &format!("file_key {key:?}"), &[key, "'..'"]);
        assert_absent(&sink.root.join("escape.bin"), key);
        assert_absent(&sink.dir.join("escape.bin"), key);
        sink.assert_unharmed(&format!("file_key {key:?}"));
    }

    // 2. An absolute path (outside the root, in this test's scratch folder).
    let absolute = sink.dir.join("escape-absolute.bin");
    let key = absolute.display().to_string();
    let outcome = sink.put(vec![
        hello_message(SOURCE),
        batch_message(&data_batch(&key, 0, b"escape"), 0),
    ]);
    assert_invalid(outcome, "an absolute file_key", &[&key, "absolute"]);
    assert_absent(&absolute, "an absolute file_key");
    sink.assert_unharmed("an absolute file_key");

    // 3. A symlink planted inside the root, to a directory outside it.
    std::fs::create_dir_all(sink.root.join(SOURCE)).unwrap();
    std::os::unix::fs::symlink(&outside, sink.root.join(SOURCE).join("link")).unwrap();
    let outcome = sink.put(vec![
        hello_message(SOURCE),
        batch_message(&data_batch("link/f.bin", 0, b"escape"), 0),
    ]);
    assert_invalid(
        outcome,
        "a path through a symlinked directory",
        &["link/f.bin", "symlink"],
    );
    assert_absent(
        &outside.join("f.bin"),
        "a path through a symlinked directory",
    );
    sink.assert_unharmed("a path through a symlinked directory");

    // 4. A dangling symlink planted where the file would be created.
    let target = outside.join("target.bin");
    std::os::unix::fs::symlink(&target, sink.root.join(SOURCE).join("filelink.bin")).unwrap();
    let outcome = sink.put(vec![
        hello_message(SOURCE),
        batch_message(&data_batch("filelink.bin", 0, b"escape"), 0),
    ]);
    assert_invalid(outcome, "a file symlink", &["filelink.bin", "symlink"]);
    assert_absent(&target, "a file symlink");
    sink.assert_unharmed("a file symlink");

    // 5. Control rows carry paths too: an Open to a new generation and a Rename.
    let mut builder = BatchBuilder::with_capacity(1, 0);
    builder.push_open("opened.bin", 2, "../../escape-open.bin");
    let outcome = sink.put(vec![
        hello_message(SOURCE),
        batch_message(&builder.finish(), 0),
    ]);
    assert_invalid(
        outcome,
        "an Open row to an escaping path",
        &["../../escape-open.bin"],
    );
    assert_absent(
        &sink.dir.join("escape-open.bin"),
        "an Open row to an escaping path",
    );
    sink.assert_unharmed("an Open row to an escaping path");

    builder.push_data("renamed.bin", 1, 0, b"will not move");
    builder.push_rename("renamed.bin", 1, "../../escape-rename.bin");
    let outcome = sink.put(vec![
        hello_message(SOURCE),
        batch_message(&builder.finish(), 0),
    ]);
    assert_invalid(
        outcome,
        "a Rename row to an escaping path",
        &["../../escape-rename.bin"],
    );
    assert_absent(
        &sink.dir.join("escape-rename.bin"),
        "a Rename row to an escaping path",
    );
    sink.assert_unharmed("a Rename row to an escaping path");

    // 6. A source name is a path component too.
    for source in ["..", "a/b", "/abs", ""] {
        let outcome = sink.put(vec![
            hello_message(source),
            batch_message(&data_batch("escape.bin", 0, b"escape"), 0),
        ]);
        assert_invalid(
            outcome,
            &format!("source {source:?}"),
            &[&format!("{source:?}"), "source name"],
        );
        assert_absent(&sink.dir.join("escape.bin"), &format!("source {source:?}"));
        sink.assert_unharmed(&format!("source {source:?}"));
    }
    assert!(
        common::list_files(&outside).is_empty(),
        "files appeared in the outside folder: {:?}",
        common::list_files(&outside)
    );
}

#[test]
fn a_wrong_crc32c_is_refused_and_nothing_is_placed() {
    let mut sink = SinkUnderTest::start("bad-input-crc");
    let good = data_batch("crc/a.bin", 0, &pattern(1000, 7));
    let claimed = good
        .column(5)
        .as_any()
        .downcast_ref::<UInt32Array>()
        .unwrap()
        .value(0);
    let bad = with_column(
        &good,
        5,
        Arc::new(UInt32Array::from(vec![claimed ^ 0x8000_0001])),
    );
    let outcome = sink.put(vec![hello_message(SOURCE), batch_message(&bad, 0)]);
    assert_invalid(outcome, "a wrong crc32c", &["crc32c", "crc/a.bin"]);
    assert_absent(&sink.dest("crc/a.bin"), "a wrong crc32c");
    sink.assert_unharmed("a wrong crc32c");

    // The same batch with its right checksum is then placed in full.
    let outcome = sink.put(vec![hello_message(SOURCE), batch_message(&good, 0)]);
    assert!(
        outcome.error.is_none(),
        "the corrected batch: {:?}",
        outcome.error
    );
    assert_eq!(outcome.acks.iter().map(|a| a.placed).sum::<u64>(), 1000);
    assert_eq!(
        std::fs::read(sink.dest("crc/a.bin")).unwrap(),
        pattern(1000, 7)
    );
}

#[test]
fn a_foreign_schema_is_refused() {
    let mut sink = SinkUnderTest::start("bad-input-schema");
    let good = data_batch("schema/a.bin", 0, b"some bytes");
    let nullable: Vec<Field> = range_schema()
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_nullable(true))
        .collect();
    let variants = [
        (
            "every field nullable",
            good.clone()
                .with_schema(Arc::new(Schema::new(nullable)))
                .unwrap(),
        ),
        (
            "the digest column missing",
            good.project(&[0, 1, 2, 3, 4, 5, 6]).unwrap(),
        ),
    ];
    for (what, batch) in variants {
        let hello = serde_json::to_vec(&Hello::new(SOURCE)).unwrap();
        let schema =
            schema_message(&batch.schema()).with_descriptor(FlightDescriptor::new_cmd(hello));
        let outcome = sink.put(vec![schema, batch_message(&batch, 0)]);
        assert_invalid(outcome, what, &["schema"]);
        assert_absent(&sink.dest("schema/a.bin"), what);
        sink.assert_unharmed(what);
    }
}

#[test]
fn a_message_over_the_size_limit_is_refused() {
    let mut sink = SinkUnderTest::start("bad-input-oversize");
    let data = pattern(2 << 20, 3);
    let outcome = sink.put(vec![
        hello_message(SOURCE),
        batch_message(&data_batch("big/a.bin", 0, &data), 0),
    ]);
    let status = refusal(outcome, "a 2 MiB message");
    let message = status.message().to_lowercase();
    assert!(
        message.contains("too large") && message.contains(&MAX_MESSAGE_BYTES.to_string()),
        "the error should say the message is too large and give the limit: {status:?}"
    );
    assert_absent(&sink.dest("big/a.bin"), "a 2 MiB message");
    sink.assert_unharmed("a 2 MiB message");
}

#[test]
fn garbage_bytes_are_refused_without_a_crash() {
    let mut sink = SinkUnderTest::start("bad-input-garbage");
    let garbage = |seed| {
        FlightData::new()
            .with_data_header(noise(200, seed))
            .with_data_body(noise(4000, seed + 1))
            .with_app_metadata(0u64.to_be_bytes().to_vec())
    };

    // Noise after a valid hello and schema.
    let outcome = sink.put(vec![hello_message(SOURCE), garbage(11)]);
    assert_invalid(outcome, "noise after the schema", &["undecodable"]);
    sink.assert_unharmed("noise after the schema");

    // Noise as the very first message, with no descriptor at all.
    let outcome = sink.put(vec![garbage(23)]);
    refusal(outcome, "noise as the first message");
    sink.assert_unharmed("noise as the first message");

    // A valid batch header over a body of noise.
    let valid = batch_message(&data_batch("garbage/a.bin", 0, &pattern(4000, 5)), 0);
    let scrambled = noise(valid.data_body.len(), 31);
    let outcome = sink.put(vec![hello_message(SOURCE), valid.with_data_body(scrambled)]);
    refusal(outcome, "a batch body of noise");
    assert_absent(&sink.dest("garbage/a.bin"), "a batch body of noise");
    sink.assert_unharmed("a batch body of noise");
}

/// A header whose buffers reach past the end of the body makes arrow-ipc's
/// decoder panic inside the sink's DoPut task (flight-server/src/service.rs,
/// `do_put`): the task dies, its response channel is dropped, and the client
/// sees a clean end of stream, neither an ack nor an error.
#[test]
fn a_batch_body_cut_short_is_refused() {
    let mut sink = SinkUnderTest::start("bad-input-short-body");
    let valid = batch_message(&data_batch("short/a.bin", 0, &pattern(4000, 5)), 0);
    let cut = valid.data_body.slice(..valid.data_body.len() / 2);
    let outcome = sink.put(vec![hello_message(SOURCE), valid.with_data_body(cut)]);
    refusal(outcome, "a batch body cut short");
    assert_absent(&sink.dest("short/a.bin"), "a batch body cut short");
    sink.assert_unharmed("a batch body cut short");
}

#[test]
fn a_missing_or_garbled_hello_is_refused() {
    let mut sink = SinkUnderTest::start("bad-input-hello");
    let batch = || batch_message(&data_batch("hello/a.bin", 0, b"abc"), 0);
    let with_cmd = |cmd: &[u8]| {
        schema_message(&range_schema()).with_descriptor(FlightDescriptor::new_cmd(cmd.to_vec()))
    };
    let variants = [
        ("no descriptor", schema_message(&range_schema())),
        (
            "a descriptor that is not JSON",
            with_cmd(b"\x00\xffnot json"),
        ),
        (
            "a path descriptor",
            schema_message(&range_schema())
                .with_descriptor(FlightDescriptor::new_path(vec!["src".into()])),
        ),
        (
            "a JSON hello without a source",
            with_cmd(br#"{"protocol": 1}"#),
        ),
        (
            "another protocol version",
            with_cmd(br#"{"protocol": 999, "source": "src"}"#),
        ),
    ];
    for (what, first) in variants {
        let outcome = sink.put(vec![first, batch()]);
        assert_invalid(outcome, what, &["hello"]);
        sink.assert_unharmed(what);
    }
    assert_absent(&sink.dest("hello/a.bin"), "a bad hello");
}

#[test]
fn malformed_rows_are_refused_with_their_reason() {
    let mut sink = SinkUnderTest::start("bad-input-rows");
    let good = data_batch("rows/a.bin", 0, b"abc");

    let unknown_kind = with_column(&good, 0, Arc::new(UInt8Array::from(vec![9u8])));
    let mut builder = BatchBuilder::with_capacity(1, 0);
    builder.push_open("rows/a.bin", 2, "rows/a.bin");
    let open_with_data = with_column(
        &builder.finish(),
        4,
        Arc::new(BinaryArray::from(vec![&b"xyz"[..]])),
    );
    let overflow = data_batch("rows/a.bin", u64::MAX - 1, b"abcd");
    // Within u64, past any file: the sink once panicked taking room ahead of it.
    let past_any_file = data_batch("rows/a.bin", u64::MAX - 87, &[7u8; 87]);
    let unopened = {
        builder.push_data("rows/a.bin", 5, 0, b"abc");
        builder.finish()
    };
    let variants = [
        (
            "an unknown row kind",
            batch_message(&unknown_kind, 0),
            "unknown row kind 9",
        ),
        (
            "an Open row carrying bytes",
            batch_message(&open_with_data, 0),
            "carries data bytes",
        ),
        (
            "offset + length past u64",
            batch_message(&overflow, 0),
            "end past the largest file offset",
        ),
        (
            "a range ending past the largest file offset",
            batch_message(&past_any_file, 0),
            "end past the largest file offset",
        ),
        (
            "data of a generation never opened",
            batch_message(&unopened, 0),
            "generation 5 was never opened",
        ),
        (
            "app_metadata that is no sequence number",
            batch_message(&good, 0).with_app_metadata(vec![1, 2, 3]),
            "8-byte sequence number",
        ),
    ];
    for (what, message, needle) in variants {
        let outcome = sink.put(vec![hello_message(SOURCE), message]);
        assert_invalid(outcome, what, &[needle]);
        sink.assert_unharmed(what);
    }
    assert_absent(&sink.dest("rows/a.bin"), "malformed rows");
}

#[test]
fn a_valid_batch_is_placed_once_and_its_resend_is_a_duplicate() {
    let mut sink = SinkUnderTest::start("bad-input-control");
    let data = pattern(64 << 10, 42);
    let batch = data_batch("ok/a.bin", 0, &data);
    let len = data.len() as u64;

    let first = sink.put(vec![hello_message(SOURCE), batch_message(&batch, 0)]);
    assert!(first.error.is_none(), "first delivery: {:?}", first.error);
    assert_eq!(first.acks.len(), 1);
    assert_eq!(
        (first.acks[0].placed, first.acks[0].duplicate),
        (len, 0),
        "{:?}",
        first.acks[0]
    );

    let again = sink.put(vec![hello_message(SOURCE), batch_message(&batch, 0)]);
    assert!(again.error.is_none(), "re-delivery: {:?}", again.error);
    assert_eq!(again.acks.len(), 1);
    assert_eq!(
        (again.acks[0].placed, again.acks[0].duplicate),
        (0, len),
        "{:?}",
        again.acks[0]
    );
    assert_eq!(std::fs::read(sink.dest("ok/a.bin")).unwrap(), data);

    // The same new range twice in one pipelined stream: exactly one ack places it.
    let fresh = data_batch("ok/b.bin", 0, &data);
    let both = sink.put(vec![
        hello_message(SOURCE),
        batch_message(&fresh, 0),
        batch_message(&fresh, 1),
    ]);
    assert!(
        both.error.is_none(),
        "pipelined duplicate: {:?}",
        both.error
    );
    let mut seqs: Vec<u64> = both.acks.iter().map(|a| a.seq).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, [0, 1], "{:?}", both.acks);
    assert_eq!(
        both.acks.iter().map(|a| a.placed).sum::<u64>(),
        len,
        "{:?}",
        both.acks
    );
    assert_eq!(
        both.acks.iter().map(|a| a.duplicate).sum::<u64>(),
        len,
        "{:?}",
        both.acks
    );
    assert_eq!(std::fs::read(sink.dest("ok/b.bin")).unwrap(), data);

    let status = common::sink_status(&sink.endpoint, &[]).expect("sink status");
    assert_eq!(
        common::status_u64(&status, "placed_bytes"),
        2 * len,
        "{status}"
    );
    assert_eq!(
        common::status_u64(&status, "duplicate_bytes"),
        2 * len,
        "{status}"
    );
    sink.assert_unharmed("the positive control");
}

/// A seal is checked against the bytes on disk with the algorithm it names:
/// a wrong digest or an unknown algorithm rejects the row, and a seal
/// re-sent with the other algorithm over the same bytes is a duplicate.
#[test]
fn seals_are_checked_against_the_bytes_on_disk() {
    let mut sink = SinkUnderTest::start("bad-input-seal");
    let data = pattern(200_000, 7);
    let len = data.len() as u64;
    let placed = sink.put(vec![
        hello_message(SOURCE),
        batch_message(&data_batch("seal/a.bin", 0, &data), 0),
    ]);
    assert!(placed.error.is_none(), "data: {:?}", placed.error);
    let digest_of = |kind: SealDigest, bytes: &[u8]| {
        let mut hasher = kind.hasher();
        hasher.update(bytes);
        hasher.finish()
    };
    let seal_with = |digest: &str| {
        let mut builder = BatchBuilder::with_capacity(1, 0);
        builder.push_seal("seal/a.bin", 1, len, digest);
        batch_message(&builder.finish(), 1)
    };
    let rejection = |outcome: Outcome, what: &str| {
        assert!(outcome.error.is_none(), "{what}: {:?}", outcome.error);
        let rejected = &outcome.acks.first().expect("an ack").rejected;
        assert_eq!(rejected.len(), 1, "{what}: {:?}", outcome.acks);
        rejected[0].error.clone()
    };

    let mut other = data.clone();
    other[123_456] ^= 1;
    for kind in [SealDigest::Crc64Nvme, SealDigest::Blake3] {
        let wrong = digest_of(kind, &other);
        let error = rejection(
            sink.put(vec![hello_message(SOURCE), seal_with(&wrong)]),
            "a wrong digest",
        );
        assert!(error.contains("the source says"), "{kind}: {error}");
    }
    let error = rejection(
        sink.put(vec![hello_message(SOURCE), seal_with("sha1:0123")]),
        "an unknown digest algorithm",
    );
    assert!(error.contains("unknown digest algorithm 'sha1'"), "{error}");

    for (what, kind) in [
        ("the seal", SealDigest::Crc64Nvme),
        ("the seal again", SealDigest::Crc64Nvme),
        ("the seal with the other algorithm", SealDigest::Blake3),
    ] {
        let outcome = sink.put(vec![
            hello_message(SOURCE),
            seal_with(&digest_of(kind, &data)),
        ]);
        assert!(outcome.error.is_none(), "{what}: {:?}", outcome.error);
        assert!(
            outcome.acks.iter().all(|a| a.rejected.is_empty()),
            "{what}: {:?}",
            outcome.acks
        );
    }
    let error = rejection(
        sink.put(vec![
            hello_message(SOURCE),
            seal_with(&digest_of(SealDigest::Blake3, &other)),
        ]),
        "a wrong digest after the seal",
    );
    assert!(error.contains("already sealed"), "{error}");
    let status = common::sink_status(&sink.endpoint, &[]).expect("sink status");
    assert_eq!(common::status_u64(&status, "sealed_files"), 1, "{status}");
    assert_eq!(std::fs::read(sink.dest("seal/a.bin")).unwrap(), data);
    sink.assert_unharmed("seals");
}

/// A stream refused at its second batch must not strand the first: whether
/// or not that one was placed before the refusal, sending it again is
/// acknowledged, and every byte ends up recorded exactly once.
#[test]
fn a_refused_stream_does_not_strand_the_batches_before_it() {
    let mut sink = SinkUnderTest::start("bad-input-stranded");
    let rows = 500;
    let row_bytes = 256;
    let mut total = 0;
    for round in 0..6u64 {
        // Many small files make placing the good batch take a while, so the
        // refusal of the next one can overtake it.
        let mut builder = BatchBuilder::with_capacity(rows, rows * row_bytes);
        for f in 0..rows {
            builder.push_data(
                &format!("stranded/{round}/{f}.bin"),
                1,
                0,
                &pattern(row_bytes, round * 1000 + f as u64),
            );
        }
        let good = builder.finish();
        let len = (rows * row_bytes) as u64;
        let bad = data_batch("stranded/bad.bin", 0, b"x");
        let bad = with_column(&bad, 5, Arc::new(UInt32Array::from(vec![0u32])));
        let refused = sink.put(vec![
            hello_message(SOURCE),
            batch_message(&good, 0),
            batch_message(&bad, 1),
        ]);
        // The good batch may or may not be acknowledged before the refusal.
        let status = refused
            .error
            .unwrap_or_else(|| panic!("round {round}: a bad batch after a good one was accepted"));
        assert!(
            status.message().contains("crc32c"),
            "round {round}: {status:?}"
        );

        let again = sink.put(vec![hello_message(SOURCE), batch_message(&good, 0)]);
        assert!(
            again.error.is_none(),
            "round {round}: the re-sent batch was refused: {:?}",
            again.error
        );
        assert_eq!(again.acks.len(), 1, "round {round}: {:?}", again.acks);
        assert_eq!(
            again.acks[0].placed + again.acks[0].duplicate,
            len,
            "round {round}: {:?}",
            again.acks[0]
        );
        for f in [0, rows / 2, rows - 1] {
            let path = sink.dest(&format!("stranded/{round}/{f}.bin"));
            assert_eq!(
                std::fs::read(&path).ok(),
                Some(pattern(row_bytes, round * 1000 + f as u64)),
                "{}",
                path.display()
            );
        }
        total += len;
    }
    let status = common::sink_status(&sink.endpoint, &[]).expect("sink status");
    assert_eq!(
        common::status_u64(&status, "placed_bytes"),
        total,
        "{status}"
    );
    sink.process.stop();
    let audit = common::audit(&sink.dir.join("state"));
    assert_eq!(audit["overlapping_placements"], 0, "{audit}");
    assert_eq!(audit["record_mismatches"], 0, "{audit}");
}

/// Runs tailflight with `args`; returns its exit code and what it printed.
fn exit_of(args: &[String]) -> (Option<i32>, String) {
    let output = std::process::Command::new(common::bin())
        .args(args)
        .output()
        .expect("run tailflight");
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    (output.status.code(), text)
}

/// Size and count flags the wire cannot carry, the memory cannot hold or
/// that would make a loop spin are refused at startup, each with its flag,
/// the value and the bound, as the caller's mistake (exit 2), before
/// anything is opened; a message size over 2 GiB used to reach an
/// `expect` in the wire's batch builder.
#[test]
fn size_and_count_flags_out_of_bounds_are_refused_at_startup() {
    let dir = common::scratch("bad-flags");
    let sink = common::sink_command(
        &dir,
        common::free_port(),
        &[
            "--max-message-bytes",
            "3221225472",
            "--journal-max-range",
            "1GiB",
            "--hold-limit",
            "1TiB",
        ],
    );
    let (code, text) = exit_of(&sink);
    assert_eq!(code, Some(2), "{text}");
    for said in [
        "--max-message-bytes 3GiB is outside 64KiB..=2147483647",
        "--journal-max-range 1GiB is outside 0..=16MiB",
        "--hold-limit 1TiB is outside 0..=64GiB",
    ] {
        assert!(text.contains(said), "{said:?} in {text}");
    }
    assert!(!dir.join("state").exists(), "nothing was opened: {text}");

    let source = dir.join("source");
    std::fs::create_dir_all(&source).unwrap();
    let mut watch = common::strings(&["watch", "--source", "s", "--to", "http://127.0.0.1:1"]);
    watch.extend(["--dir".into(), source.display().to_string()]);
    watch.extend([
        "--state".into(),
        dir.join("watch-state").display().to_string(),
    ]);
    watch.extend(common::strings(&[
        "--batch-bytes",
        "3GiB",
        "--connections",
        "0",
        "--poll-min",
        "1s",
        "--poll-max",
        "10ms",
    ]));
    let (code, text) = exit_of(&watch);
    assert_eq!(code, Some(2), "{text}");
    for said in [
        "--batch-bytes 3GiB is outside 4KiB..=2147483647",
        "--connections 0 is outside 1..=256",
        "--max-message-bytes 64MiB cannot carry a batch of --batch-bytes 3GiB",
        "--poll-min 1s is longer than --poll-max 10ms",
    ] {
        assert!(text.contains(said), "{said:?} in {text}");
    }
    assert!(
        !dir.join("watch-state").exists(),
        "nothing was opened: {text}"
    );
}

/// A writer with pyarrow alone (ops/examples/put_file.py, no tailflight
/// code) lays its batches out as Arrow's own IPC writer does, rows at
/// offsets no block boundary matches: the sink places the file byte for
/// byte and accepts its seal.
#[test]
fn a_pyarrow_writer_is_placed_byte_for_byte() {
    let python = std::env::var_os("TAILFLIGHT_PYTHON").expect(
        "TAILFLIGHT_PYTHON names no Python with pyarrow: run the suite with ops/test.sh, which \
         makes one",
    );
    let mut sink = SinkUnderTest::start("bad-input-pyarrow");
    let content = pattern((5 << 19) + 777, 11);
    let file = sink.dir.join("from-pyarrow.bin");
    std::fs::write(&file, &content).unwrap();
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("ops/examples/put_file.py");
    let endpoint = sink.endpoint.replace("http://", "grpc://");
    let sent = std::process::Command::new(python)
        .arg(example)
        .arg(&endpoint)
        .arg(SOURCE)
        .arg(&file)
        .arg("py/a.bin")
        // Rows over the sink's direct-write minimum, in messages under its
        // limit, one batch at a time: a range that arrived ahead of the
        // bytes before it would be held, and a held range is copied.
        .args([
            "--chunk",
            "700013",
            "--rows-per-batch",
            "1",
            "--window",
            "1",
        ])
        .output()
        .expect("run the pyarrow writer");
    assert!(
        sent.status.success(),
        "the pyarrow writer failed:\n{}{}",
        String::from_utf8_lossy(&sent.stdout),
        String::from_utf8_lossy(&sent.stderr)
    );
    std::fs::remove_file(&file).unwrap();
    assert!(std::fs::read(sink.dest("py/a.bin")).unwrap() == content);
    let status = common::sink_status(&sink.endpoint, &[]).expect("sink status");
    assert_eq!(
        common::status_u64(&status, "placed_bytes"),
        content.len() as u64,
        "{status}"
    );
    // Where the sink writes large ranges directly (a disk filesystem, as
    // the suite's temporary folder is here and in CI), each row's middle
    // was received aligned like its file offset: none needed staging.
    let direct = common::status_u64(&status, "direct_written_bytes");
    if direct > 0 {
        assert!(direct >= 3 * (600 << 10), "{status}");
        assert_eq!(
            common::status_u64(&status, "direct_staged_bytes"),
            0,
            "{status}"
        );
    }
    sink.assert_unharmed("a pyarrow writer");
}
