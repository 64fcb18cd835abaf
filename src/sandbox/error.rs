//! The sandbox module's error type.

use std::io;
use std::path::PathBuf;

use super::report::SetupFailure;

/// Errors raised while creating, running or tearing down a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot create {what}")]
    CreateFd {
        what: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("user namespaces are not available on this host ({reason}); {fix}")]
    UserNamespacesUnavailable {
        reason: String,
        fix: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("clone3 into new namespaces failed")]
    Clone {
        #[source]
        source: io::Error,
    },
    #[error("cannot write {path}")]
    WriteIdMap {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot release the sandbox init process")]
    Release {
        #[source]
        source: io::Error,
    },
    #[error("sandbox setup failed: {failure}")]
    Setup {
        failure: SetupFailure,
        #[source]
        source: io::Error,
    },
    #[error("sandbox setup was cut off: the sandbox init died before the program started")]
    SetupCutOff,
    #[error("waiting for the sandbox failed")]
    Wait {
        #[source]
        source: io::Error,
    },
    #[error("cannot kill the sandbox")]
    Kill {
        #[source]
        source: io::Error,
    },
    #[error("i/o with the sandbox failed while {doing}")]
    Io {
        doing: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("invalid sandbox spec: {0}")]
    InvalidSpec(String),
    #[error("the profile sets memory/pids/cpu limits but no cgroup is available to enforce them; run as root, or give codebox a delegated cgroup (see the book: docs/src/operations/service.md, Running rootless)")]
    NoCgroups,
    #[error("cannot set up the sandbox's cgroup")]
    Cgroup(#[from] super::cgroup::Error),
}

pub type Result<T> = std::result::Result<T, Error>;
