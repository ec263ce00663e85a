//! How fast this machine runs the cipher mutual TLS negotiates here
//! (AES-128-GCM, from aws-lc, the library rustls uses): one core, TLS's
//! largest record (16 KiB), sealed and opened in place. The benchmark suite
//! compares it with what TLS adds to a transfer's CPU time.
//!
//! `cipher-speed [SECONDS]` prints one JSON line: bytes/s sealing and opening.

use std::time::{Duration, Instant};

use aws_lc_rs::aead::{AES_128_GCM, Aad, LessSafeKey, Nonce, UnboundKey};

const RECORD: usize = 16 << 10;

fn nonce(sequence: u64) -> Nonce {
    let mut bytes = [0u8; 12];
    bytes[4..].copy_from_slice(&sequence.to_be_bytes());
    Nonce::assume_unique_for_key(bytes)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let seconds: f64 = match std::env::args().nth(1) {
        Some(arg) => arg.parse()?,
        None => 1.0,
    };
    let budget = Duration::from_secs_f64(seconds / 2.0);
    let key = LessSafeKey::new(UnboundKey::new(&AES_128_GCM, &[0x5a; 16])?);
    let header = [23u8, 3, 3, 0x40, 0x11];
    let mut record: Vec<u8> = (0..RECORD).map(|i| i as u8).collect();

    let start = Instant::now();
    let mut sealed = 0u64;
    let mut last_tag = None;
    while start.elapsed() < budget {
        for _ in 0..64 {
            let tag =
                key.seal_in_place_separate_tag(nonce(sealed), Aad::from(header), &mut record)?;
            last_tag = Some(tag);
            sealed += 1;
        }
    }
    let seal_rate = (sealed * RECORD as u64) as f64 / start.elapsed().as_secs_f64();

    // Open the last sealed record over and over: the same work as opening
    // a stream of them, and every one must authenticate.
    let tag = last_tag.ok_or("no record sealed")?;
    let mut ciphertext = record.clone();
    ciphertext.extend_from_slice(tag.as_ref());
    let mut scratch = ciphertext.clone();
    let start = Instant::now();
    let mut opened = 0u64;
    while start.elapsed() < budget {
        for _ in 0..64 {
            scratch.copy_from_slice(&ciphertext);
            key.open_in_place(nonce(sealed - 1), Aad::from(header), &mut scratch)?;
            opened += 1;
        }
    }
    let open_rate = (opened * RECORD as u64) as f64 / start.elapsed().as_secs_f64();
    println!(
        "{{\"cipher\":\"AES-128-GCM\",\"record_bytes\":{RECORD},\"seal_bytes_per_s\":{seal_rate:.0},\"open_bytes_per_s\":{open_rate:.0}}}"
    );
    Ok(())
}
