//! The cgroup layer's error type: every variant names the file or directory involved.

use std::io;
use std::path::PathBuf;

use super::Controller;

/// Errors of the cgroup layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot parse {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("cannot write {value:?} to {path}")]
    Write {
        path: PathBuf,
        value: String,
        #[source]
        source: io::Error,
    },
    #[error("cannot set {what} in {path}")]
    SetLimit {
        path: PathBuf,
        what: &'static str,
        #[source]
        source: cgroups_rs::error::Error,
    },
    #[error("cannot create cgroup {path}")]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot open cgroup directory {path}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot open {path} for the sandbox init to join its cgroup")]
    OpenTasks {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the cgroup spans {count} v1 hierarchies; at most {max} can be joined")]
    TooManyHierarchies { count: usize, max: usize },
    #[error("cannot remove cgroup {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot change the owner of {path}")]
    Chown {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot kill process {pid} of cgroup {path}")]
    Signal {
        pid: i32,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cgroup {path} still has processes {pids:?} after being killed")]
    StillPopulated { path: PathBuf, pids: Vec<i32> },
    #[error(
        "the supervisor's v2 cgroup {path} also holds other processes {pids:?}: it is not \
         delegated to codebox (run it with systemd Delegate=yes)"
    )]
    SharedCgroup { path: PathBuf, pids: Vec<i32> },
    #[error(
        "a {controller} limit was asked for, but no cgroup hierarchy this process may write \
         has the {controller} controller"
    )]
    ControllerUnavailable { controller: Controller },
    #[error(
        "no cgroup hierarchy is writable by this process (rootless needs a delegated \
         cgroup)"
    )]
    NoHierarchy,
    #[error("invalid cgroup limit: {0}")]
    InvalidLimit(String),
    #[error("invalid cgroup name hint {0:?}")]
    InvalidName(String),
}

pub type Result<T> = std::result::Result<T, Error>;
