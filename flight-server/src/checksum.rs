//! The checksums the wire carries: CRC-32C over each data row, and the
//! digest a seal row names for a whole file.
//!
//! Both are computed with crc-fast, which picks the CPU's carry-less multiply
//! at run time (VPCLMULQDQ on AVX-512 machines), several times faster than a
//! plain CRC-32C loop or BLAKE3 (docs/measurements.md). Every byte is
//! checksummed once per row on each end and once more for the seal on each
//! end, so this speed is throughput.
//!
//! The seal digest defaults to CRC-64/NVME (the full-object checksum S3 uses):
//! it guards against accidental damage and placement errors, not against a
//! forger. [`SealDigest::Blake3`] records a cryptographic digest instead, at
//! a quarter of the speed. A sink verifies whichever algorithm the seal names.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::str::FromStr;

use crc_fast::CrcAlgorithm;

/// CRC-32C (Castagnoli) of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// CRC-32C of the first `len` bytes of `file` (a file's head fingerprint);
/// an error if the file is shorter.
pub fn crc32c_of_file_prefix(file: &File, len: u64) -> io::Result<u32> {
    let mut buffer = vec![0u8; len as usize];
    file.read_exact_at(&mut buffer, 0)?;
    Ok(crc32c(&buffer))
}

/// CRC-32C of the concatenation of the bytes behind `crc` and `data`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    // The register before the final inversion is the checksum inverted back;
    // continuing from it is much cheaper than combining two checksums.
    let mut digest =
        crc_fast::Digest::new_with_init_state(CrcAlgorithm::Crc32Iscsi, u64::from(crc ^ u32::MAX));
    digest.update(data);
    digest.finalize() as u32
}

/// CRC-64/NVME of `data`: the checksum behind `crc64nvme:` seal digests.
pub fn crc64nvme(data: &[u8]) -> u64 {
    crc_fast::checksum(CrcAlgorithm::Crc64Nvme, data)
}

/// CRC-64/NVME of the concatenation of the bytes behind `crc` and `data`.
pub fn crc64nvme_append(crc: u64, data: &[u8]) -> u64 {
    // As for CRC-32C: continue from the register (the checksum inverted).
    let mut digest = crc_fast::Digest::new_with_init_state(CrcAlgorithm::Crc64Nvme, !crc);
    digest.update(data);
    digest.finalize()
}

/// CRC-64/NVME of the concatenation of two byte strings, from their
/// checksums and the second one's length.
///
/// crc-fast's combine squares 64×64 bit matrices, hundreds of thousands of
/// instructions a call. A sink joins two runs of a file's written bytes this
/// way each time a range arrives before the one it follows, which batches of
/// one connection placed in parallel make common. Here, shifting
/// the first checksum over `second_len` zero bytes is one multiplication
/// modulo the polynomial by x^(8·second_len), built from a table of squares
/// in one multiplication per set bit of `second_len`, each of at most 64
/// steps.
///
/// It needs no correction for the initial value and the final XOR because
/// they are equal (all ones): the CRC of A then B is the CRC of A, shifted
/// over B's bits, XORed with the CRC of B.
pub fn crc64nvme_combine(first: u64, second: u64, second_len: u64) -> u64 {
    gf2::multiply(gf2::x_to_the_8n(second_len), first) ^ second
}

/// Arithmetic on polynomials over GF(2) modulo CRC-64/NVME's, in the
/// reflected order its checksums are kept in: the coefficient of x^0 is
/// the most significant bit, that of x^63 the least.
mod gf2 {
    /// The polynomial without its x^64 term, reflected.
    const POLY: u64 = 0xAD93_D235_94C9_3659_u64.reverse_bits();
    /// x^0, the polynomial 1.
    const ONE: u64 = 1 << 63;

    /// `a` times `b`, modulo the polynomial.
    pub const fn multiply(mut a: u64, mut b: u64) -> u64 {
        let mut product = 0;
        // Each step takes a's coefficient of the next power of x, and
        // multiplies b by x (x^64 folds back in as the polynomial).
        while a != 0 {
            if a & ONE != 0 {
                product ^= b;
            }
            a <<= 1;
            b = (b >> 1) ^ if b & 1 != 0 { POLY } else { 0 };
        }
        product
    }

    /// x^(2^k) modulo the polynomial, for k in 0..67: enough for 8n with
    /// any 64-bit n.
    const SQUARES: [u64; 67] = {
        let mut table = [0; 67];
        table[0] = ONE >> 1; // x^1
        let mut k = 1;
        while k < 67 {
            table[k] = multiply(table[k - 1], table[k - 1]);
            k += 1;
        }
        table
    };

    /// x^(8n) modulo the polynomial: the shift over `n` bytes.
    pub fn x_to_the_8n(n: u64) -> u64 {
        let mut power = ONE;
        let mut bits = n;
        // 8n = n << 3: bit j of n is bit j + 3 of the exponent.
        let mut k = 3;
        while bits != 0 {
            if bits & 1 != 0 {
                power = multiply(power, SQUARES[k]);
            }
            bits >>= 1;
            k += 1;
        }
        power
    }
}

/// The seal digest text of a CRC-64/NVME checksum.
pub fn crc64nvme_digest(crc: u64) -> String {
    format!("crc64nvme:{crc:016x}")
}

/// Which whole-file digest seal rows carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SealDigest {
    /// `crc64nvme:<16 hex digits>`.
    #[default]
    Crc64Nvme,
    /// `blake3:<64 hex digits>`.
    Blake3,
}

impl SealDigest {
    const ALL: [SealDigest; 2] = [SealDigest::Crc64Nvme, SealDigest::Blake3];

    fn name(self) -> &'static str {
        match self {
            SealDigest::Crc64Nvme => "crc64nvme",
            SealDigest::Blake3 => "blake3",
        }
    }

    /// The algorithm a digest text (`name:hex`) was made with.
    pub fn of_digest(digest: &str) -> Result<Self, UnknownDigest> {
        let (name, _) = digest
            .split_once(':')
            .ok_or_else(|| UnknownDigest(digest.chars().take(40).collect()))?;
        name.parse()
    }

    /// Digest text of the first `size` bytes of `file`, read with pread (the
    /// file's cursor is left alone).
    pub fn of_file_prefix(self, file: &File, size: u64) -> io::Result<String> {
        self.of_file_prefix_unless(file, size, &|| false)
    }

    /// As [`Self::of_file_prefix`], but gives up (`Interrupted`) between
    /// reads of 1 MiB once `halted` says so: a long hash must not hold up a
    /// stop.
    pub fn of_file_prefix_unless(
        self,
        file: &File,
        size: u64,
        halted: &dyn Fn() -> bool,
    ) -> io::Result<String> {
        let mut hasher = self.hasher();
        let mut buffer = vec![0u8; (1 << 20).min(size as usize)];
        let mut offset = 0;
        while offset < size {
            if halted() {
                return Err(io::Error::new(io::ErrorKind::Interrupted, "stopping"));
            }
            let want = buffer.len().min((size - offset) as usize);
            let got = file.read_at(&mut buffer[..want], offset)?;
            if got == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the file ends at {offset}, short of {size}"),
                ));
            }
            hasher.update(&buffer[..got]);
            offset += got as u64;
        }
        Ok(hasher.finish())
    }

    /// A fresh hasher for this algorithm.
    pub fn hasher(self) -> FileHasher {
        match self {
            SealDigest::Crc64Nvme => FileHasher(HasherState::Crc64(Box::new(
                crc_fast::Digest::new(CrcAlgorithm::Crc64Nvme),
            ))),
            SealDigest::Blake3 => FileHasher(HasherState::Blake3(Box::default())),
        }
    }
}

impl fmt::Display for SealDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SealDigest {
    type Err = UnknownDigest;

    fn from_str(name: &str) -> Result<Self, UnknownDigest> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.name() == name)
            .ok_or_else(|| UnknownDigest(name.chars().take(40).collect()))
    }
}

/// A digest algorithm this build does not know.
#[derive(Debug, thiserror::Error)]
#[error("unknown digest algorithm '{0}' (known: crc64nvme, blake3)")]
pub struct UnknownDigest(String);

/// Digest of a file's bytes fed in order from offset 0. The state is boxed:
/// the watcher keeps one per file it is reading (BLAKE3's state is ~2 KiB,
/// CRC-64's ~300 bytes with its folding constants).
pub struct FileHasher(HasherState);

enum HasherState {
    Crc64(Box<crc_fast::Digest>),
    Blake3(Box<blake3::Hasher>),
}

impl FileHasher {
    pub fn update(&mut self, data: &[u8]) {
        match &mut self.0 {
            HasherState::Crc64(digest) => digest.update(data),
            HasherState::Blake3(hasher) => {
                hasher.update(data);
            }
        }
    }

    /// The digest text a seal row carries.
    pub fn finish(&self) -> String {
        match &self.0 {
            HasherState::Crc64(digest) => crc64nvme_digest(digest.finalize()),
            HasherState::Blake3(hasher) => format!("blake3:{}", hasher.finalize().to_hex()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_check_value_and_appends() {
        // The catalogue's check value for CRC-32/ISCSI.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c_append(crc32c(b"1234"), b"56789"), 0xe306_9283);
        assert_eq!(crc32c_append(0, b"123456789"), 0xe306_9283);
        assert_eq!(crc32c_append(crc32c(b"123456789"), b""), 0xe306_9283);
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 31 + i / 97) as u8).collect();
        for split in [0, 1, 7, 64, 4095, 4096, 9999, 10_000] {
            let (head, tail) = data.split_at(split);
            assert_eq!(crc32c_append(crc32c(head), tail), crc32c(&data), "{split}");
        }
    }

    #[test]
    fn crc64_appends_and_combines_like_one_pass() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 13 + i / 331) as u8).collect();
        let whole = crc64nvme(&data);
        let mut hasher = SealDigest::Crc64Nvme.hasher();
        hasher.update(&data);
        assert_eq!(hasher.finish(), crc64nvme_digest(whole));
        for split in [0, 1, 4096, 65_537, 70_000] {
            let (head, tail) = data.split_at(split);
            assert_eq!(crc64nvme_append(crc64nvme(head), tail), whole, "{split}");
            assert_eq!(
                crc64nvme_combine(crc64nvme(head), crc64nvme(tail), tail.len() as u64),
                whole,
                "{split}"
            );
        }
    }

    #[test]
    fn crc64_combine_agrees_with_crc_fast_for_any_length() {
        let first = crc64nvme(b"the first part");
        let second = crc64nvme(b"and the second");
        let lengths = [
            0,
            1,
            3,
            8,
            4095,
            4096,
            1 << 20,
            1 << 40,
            u64::MAX - 7,
            u64::MAX,
        ];
        for len in lengths {
            assert_eq!(
                crc64nvme_combine(first, second, len),
                crc_fast::checksum_combine(CrcAlgorithm::Crc64Nvme, first, second, len),
                "{len}"
            );
        }
    }

    #[test]
    fn digests_name_their_algorithm_and_do_not_depend_on_chunking() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        for kind in SealDigest::ALL {
            let mut whole = kind.hasher();
            whole.update(&data);
            let mut pieces = kind.hasher();
            for piece in data.chunks(4093) {
                pieces.update(piece);
            }
            let digest = whole.finish();
            assert_eq!(digest, pieces.finish());
            assert_eq!(SealDigest::of_digest(&digest).unwrap(), kind);
        }
        let mut check = SealDigest::Crc64Nvme.hasher();
        check.update(b"123456789");
        assert_eq!(check.finish(), "crc64nvme:ae8b14860a799888");
    }

    #[test]
    fn file_prefixes_hash_like_their_bytes() {
        let path = std::env::temp_dir().join(format!("tailflight-prefix-{}", std::process::id()));
        let data: Vec<u8> = (0..(3u32 << 20) + 5).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let file = File::open(&path).unwrap();
        for kind in SealDigest::ALL {
            for size in [0, 1, 1 << 20, data.len() as u64 - 1, data.len() as u64] {
                let mut expected = kind.hasher();
                expected.update(&data[..size as usize]);
                assert_eq!(kind.of_file_prefix(&file, size).unwrap(), expected.finish());
            }
            let short = kind
                .of_file_prefix(&file, data.len() as u64 + 1)
                .unwrap_err();
            assert_eq!(short.kind(), io::ErrorKind::UnexpectedEof, "{short}");
        }
        assert_eq!(
            crc32c_of_file_prefix(&file, 4096).unwrap(),
            crc32c(&data[..4096])
        );
        assert!(crc32c_of_file_prefix(&file, data.len() as u64 + 1).is_err());
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn unknown_algorithms_are_named_in_the_error() {
        let err = SealDigest::of_digest("sha1:abcd").unwrap_err().to_string();
        assert!(err.contains("'sha1'"), "{err}");
        assert!(SealDigest::of_digest("no-colon").is_err());
        assert_eq!("blake3".parse::<SealDigest>().unwrap(), SealDigest::Blake3);
    }
}
