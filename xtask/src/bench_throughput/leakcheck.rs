//! The leak check around the load: the server's resources once it settles again (pool
//! refilled, nothing running) against before, and after the server stops, nothing of its
//! tree and none of its cgroups left.

use std::time::{Duration, Instant};

use anyhow::Result;

use crate::bench::leaks::{self, Snapshot};
use crate::bench::mcp::{self, Rpc};
use crate::bench::Lang;

/// How long the server may take to refill its pool and close the clients' connections.
const SETTLE: Duration = Duration::from_secs(10);
/// How long the server's cgroups may take to go after it exited.
const GONE: Duration = Duration::from_secs(5);

/// Polls until the pool is full, nothing runs, and no figure is above `before` (or
/// [`SETTLE`] passed); returns the last snapshot and what grew.
pub fn settle(
    control: &mut impl Rpc,
    pid: u32,
    lang: Lang,
    before: &Snapshot,
) -> Result<(Snapshot, Vec<String>)> {
    let deadline = Instant::now() + SETTLE;
    loop {
        let health = mcp::health(control)?;
        let after = Snapshot::take(pid);
        let grown = before.grown(&after);
        let pool_ok = mcp::pool_settled(&health, lang) != Some(false);
        if (pool_ok && grown.is_empty()) || Instant::now() > deadline {
            return Ok((after, grown));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// After the server exited: which of its processes still run, which cgroups are left.
pub fn leftovers(pid: u32, tree: &[(u32, u64)]) -> Vec<String> {
    let deadline = Instant::now() + GONE;
    loop {
        let procs = leaks::still_running(tree);
        let cgroups = leaks::server_cgroups(pid);
        if (procs.is_empty() && cgroups.is_empty()) || Instant::now() > deadline {
            return procs
                .iter()
                .map(|p| format!("process {p} still runs"))
                .chain(
                    cgroups
                        .iter()
                        .map(|c| format!("cgroup {} left", c.display())),
                )
                .collect();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
