//! The rootfs module's error type.

use std::io;
use std::path::PathBuf;

const REBUILD: &str = "rebuild it with `cargo xtask rootfs`";

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("no rootfs found (looked at {looked}); a release keeps it at share/codebox/rootfs next to bin/codebox (unpack the whole tarball), a checkout builds it with `cargo xtask rootfs`, or name one with --rootfs or CODEBOX_ROOTFS")]
    NotFound { looked: String },
    #[error("rootfs at {path} has no readable manifest; {REBUILD}")]
    ManifestUnreadable {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("rootfs manifest {path} is malformed at line {line}: {reason}; {REBUILD}")]
    ManifestMalformed {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("rootfs at {root} is incomplete: {entry} is missing; {REBUILD}")]
    Missing { root: PathBuf, entry: String },
    #[error("rootfs at {root} was tampered with: {entry} {what}; {REBUILD}")]
    Tampered {
        root: PathBuf,
        entry: String,
        what: String,
    },
    #[error("rootfs at {root} changed while in use: its manifest is no longer the one verified (sha256 {verified}… is now {now}…); restart codebox to verify and use the new tree")]
    Replaced {
        root: PathBuf,
        verified: String,
        now: String,
    },
    #[error("cannot read {path} while verifying the rootfs")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;
