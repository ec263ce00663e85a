//! Who may read a sink (subscribe, list, describe): decided apart from who
//! may write. Readers present a bearer token (`authorization: Bearer T`)
//! from the sink's token file, which is read again whenever it changes, so
//! tokens are rotated by editing it. Under mutual TLS a client certificate
//! (a watcher's) grants write access only, unless the sink says writers may
//! read too; and a subscriber's token never grants write access.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::SystemTime;

use tonic::{Request, Status};

/// The sink's read-access settings.
#[derive(Clone, Debug, Default)]
pub struct ReadAccess {
    /// Bearer tokens that grant read access, one a line (`#` starts a
    /// comment); none: reading needs no token.
    pub tokens_file: Option<PathBuf>,
    /// Whether a client certificate the sink's CA signed also grants read
    /// access (mutual TLS only).
    pub writers_may_read: bool,
}

/// A file's modification time, length and inode: a file edited or
/// replaced has another.
type FileStamp = (SystemTime, u64, u64);

/// Checks read access on every call.
pub(crate) struct ReadGate {
    access: ReadAccess,
    mutual_tls: bool,
    /// The tokens, with the file's stamp when they were read.
    tokens: Mutex<Option<(FileStamp, HashSet<String>)>>,
}

impl ReadGate {
    pub fn new(access: ReadAccess, mutual_tls: bool) -> Self {
        Self {
            access,
            mutual_tls,
            tokens: Mutex::new(None),
        }
    }

    /// Whether `request` may read; the error says what is missing.
    pub fn check<T>(&self, request: &Request<T>) -> Result<(), Status> {
        let presented = bearer(request);
        let Some(_) = &self.access.tokens_file else {
            if self.mutual_tls && !self.access.writers_may_read {
                return Err(Status::permission_denied(
                    "a client certificate grants write access only: this sink serves readers with --subscriber-tokens, or lets writers read with --writers-may-read",
                ));
            }
            return Ok(());
        };
        match presented {
            Some(token) if self.is_token(token)? => Ok(()),
            Some(_) => Err(Status::unauthenticated(
                "the bearer token is not one of this sink's subscriber tokens",
            )),
            None if self.mutual_tls && self.access.writers_may_read => Ok(()),
            None => Err(Status::unauthenticated(
                "this sink requires a subscriber token: send 'authorization: Bearer <token>'",
            )),
        }
    }

    /// Refuses a write that presents a subscriber's token: reading rights
    /// never grant writing.
    pub fn refuse_readers<T>(&self, request: &Request<T>) -> Result<(), Status> {
        match bearer(request) {
            Some(token) if self.access.tokens_file.is_some() && self.is_token(token)? => {
                Err(Status::permission_denied(
                    "a subscriber token grants read access only; writing takes a watcher's connection",
                ))
            }
            _ => Ok(()),
        }
    }

    fn is_token(&self, token: &str) -> Result<bool, Status> {
        let Some(path) = &self.access.tokens_file else {
            return Ok(false);
        };
        let unreadable = |e: std::io::Error| {
            Status::unavailable(format!(
                "the sink cannot read its subscriber tokens in {}: {e}",
                path.display()
            ))
        };
        let meta = std::fs::metadata(path).map_err(unreadable)?;
        let stamp = (
            meta.modified().map_err(unreadable)?,
            meta.len(),
            std::os::unix::fs::MetadataExt::ino(&meta),
        );
        let mut tokens = self
            .tokens
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let fresh = matches!(&*tokens, Some((read_at, _)) if *read_at == stamp);
        if !fresh {
            let text = std::fs::read_to_string(path).map_err(unreadable)?;
            let set = text
                .lines()
                .map(|line| line.split('#').next().unwrap_or_default().trim())
                .filter(|line| !line.is_empty())
                .map(str::to_owned)
                .collect();
            *tokens = Some((stamp, set));
        }
        Ok(tokens.as_ref().is_some_and(|(_, set)| set.contains(token)))
    }
}

fn bearer<T>(request: &Request<T>) -> Option<&str> {
    request
        .metadata()
        .get("authorization")?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}
