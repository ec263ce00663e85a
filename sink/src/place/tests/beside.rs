//! Writes made beside the round: small ranges go into their files after
//! their request is submitted, into room taken first; the file still grows
//! in order, and a failed batch leaves no file waiting.

use std::os::unix::fs::MetadataExt;
use std::sync::mpsc;
use std::time::Duration;

use super::*;

/// A file placed and recorded up to `head`, so that later ranges are
/// journaled (a new file is flushed instead).
fn started_file(fixture: &Fixture, placer: &Placer, source: &Source, head: &[u8]) {
    let first = rows(|b| b.push_data("a.dat", 1, 0, head));
    place_and_record(placer, source, 1, &first);
    assert_eq!(std::fs::read(fixture.dest("s/a.dat")).unwrap(), head);
}

#[test]
fn small_ranges_are_written_once_their_request_is_submitted_into_room_taken_first() {
    let fixture = Fixture::new("beside");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let dest = fixture.dest("s/a.dat");
    started_file(&fixture, &placer, &source, b"head");

    let second = rows(|b| b.push_data("a.dat", 1, 4, b"tail"));
    let Placed {
        mut request,
        ack,
        writes,
    } = placer.place_beside(&source, 2, &second).unwrap();
    assert_eq!((ack.placed, request.journal_bytes), (4, 4));
    assert_eq!(
        request.journal[0].bytes.as_ptr(),
        second.row(0).data.as_ptr(),
        "the journal shares the batch's bytes, not a copy"
    );
    assert!(
        request.written.is_some(),
        "the round has writes to wait for"
    );
    assert_eq!(
        std::fs::read(&dest).unwrap(),
        b"head",
        "nothing is written before the request is submitted"
    );
    let taken = std::fs::metadata(&dest).unwrap().blocks() * 512;
    assert!(
        taken >= 64 << 10,
        "room is taken ahead of the file's end ({taken} bytes)"
    );

    writes.finish();
    request.wait_written().unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"headtail");
    record_placed(&request);

    let mut hasher = SealDigest::Crc64Nvme.hasher();
    hasher.update(b"headtail");
    let seal = rows(|b| b.push_seal("a.dat", 1, 8, &hasher.finish()));
    let (_, ack) = placer.place(&source, 3, &seal).unwrap();
    assert!(ack.rejected.is_empty(), "{:?}", ack.rejected);
    let meta = std::fs::metadata(&dest).unwrap();
    assert_eq!(meta.len(), 8);
    assert!(
        meta.blocks() * 512 <= 4096,
        "a sealed file gives its room back ({} bytes taken)",
        meta.blocks() * 512
    );
}

/// A batch that reaches a file another batch has writes pending into
/// waits for them: it never writes past bytes not in the file yet.
#[test]
fn a_batch_waits_for_another_batchs_pending_writes_into_its_file() {
    let fixture = Fixture::new("beside-wait");
    let placer = Arc::new(fixture.placer());
    let source = placer.source("s").unwrap();
    let dest = fixture.dest("s/a.dat");
    started_file(&fixture, &placer, &source, b"head");

    let second = rows(|b| b.push_data("a.dat", 1, 4, b"tail"));
    let first = placer.place_beside(&source, 2, &second).unwrap();
    record_placed(&first.request);

    let (placed, told) = mpsc::channel();
    let waiting = {
        let placer = placer.clone();
        let source = source.clone();
        std::thread::spawn(move || {
            let third = rows(|b| b.push_data("a.dat", 1, 8, b"more"));
            let next = placer.place_beside(&source, 3, &third).unwrap();
            next.writes.finish();
            placed.send(()).unwrap();
        })
    };
    assert_eq!(
        told.recv_timeout(Duration::from_millis(300)),
        Err(mpsc::RecvTimeoutError::Timeout),
        "the later batch waits for the earlier one's writes"
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"head");
    first.writes.finish();
    told.recv().unwrap();
    waiting.join().unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), b"headtailmore");
}

/// A batch that fails after deferring writes makes them before it answers
/// (its bytes are in the file, unrecorded, as any failed batch's are), and
/// leaves its files to the next batch.
#[test]
fn a_failed_batch_makes_its_deferred_writes_and_leaves_no_file_waiting() {
    let fixture = Fixture::new("beside-failed");
    let placer = fixture.placer();
    let source = placer.source("s").unwrap();
    let dest = fixture.dest("s/a.dat");
    started_file(&fixture, &placer, &source, b"head");

    let failing = rows(|b| {
        b.push_data("a.dat", 1, 4, b"tail");
        b.push_data("b.dat", 7, 0, b"never opened");
    });
    let failed = placer.place_beside(&source, 2, &failing);
    assert!(
        matches!(&failed, Err(SinkError::Peer(message)) if message.contains("never opened")),
        "{:?}",
        failed.as_ref().err()
    );
    assert_eq!(std::fs::read(&dest).unwrap(), b"headtail");

    let again = rows(|b| b.push_data("a.dat", 1, 4, b"tailmore"));
    let placed = placer.place_beside(&source, 3, &again).unwrap();
    assert_eq!(
        placed.ack.placed, 8,
        "the failed batch's bytes were not recorded"
    );
    placed.writes.finish();
    assert_eq!(std::fs::read(&dest).unwrap(), b"headtailmore");
}

/// The room taken ahead grows with the file: little for a small file, at
/// most 1 MiB for one that keeps growing.
#[test]
fn the_room_taken_ahead_grows_with_the_file_up_to_a_bound() {
    use crate::place::beside::room_ahead;
    assert_eq!(room_ahead(0), 64 << 10);
    assert_eq!(room_ahead(256 << 10), 64 << 10);
    assert_eq!(room_ahead(2 << 20), 256 << 10);
    assert_eq!(room_ahead(8 << 20), 1 << 20);
    assert_eq!(room_ahead(1 << 40), 1 << 20);
}
