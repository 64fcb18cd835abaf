//! The load: K clients, each its own MCP session on its own HTTP connection, each calling
//! `print(1)` in a loop until the time is up, every result checked.

use std::net::SocketAddr;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use crate::bench::mcp::{self, Outcome};
use crate::bench::mcp_http::HttpSession;
use crate::bench::Lang;

/// A refused client waits this long before it asks again, as a polite client would.
const BUSY_BACKOFF: Duration = Duration::from_millis(10);
/// Error messages kept for the report (the count is always exact).
const KEPT_ERRORS: usize = 5;

#[derive(Default)]
pub struct Tally {
    /// Round trips of the successful executions, in ms.
    pub latencies: Vec<f64>,
    pub warm: usize,
    pub cold: usize,
    /// Successful executions whose result had no `start`.
    pub unreported: usize,
    /// "busy, retry" refusals of admission.
    pub busy: usize,
    pub busy_example: Option<String>,
    pub errors: usize,
    pub error_examples: Vec<String>,
    /// From the start signal to the last answer any client received.
    pub elapsed: Duration,
}

impl Tally {
    fn error(&mut self, e: &anyhow::Error) {
        self.errors += 1;
        let msg = format!("{e:#}");
        if self.error_examples.len() < KEPT_ERRORS && !self.error_examples.contains(&msg) {
            self.error_examples.push(msg);
        }
    }

    fn merge(&mut self, other: Tally) {
        self.latencies.extend(other.latencies);
        self.warm += other.warm;
        self.cold += other.cold;
        self.unreported += other.unreported;
        self.busy += other.busy;
        self.busy_example = self.busy_example.take().or(other.busy_example);
        for e in other.error_examples {
            if self.error_examples.len() < KEPT_ERRORS && !self.error_examples.contains(&e) {
                self.error_examples.push(e);
            }
        }
        self.errors += other.errors;
        self.elapsed = self.elapsed.max(other.elapsed);
    }
}

/// Runs `clients` clients for `duration`; sessions are opened before the clock starts
/// and closed (`DELETE`) after it stops.
pub fn run(addr: SocketAddr, lang: Lang, clients: usize, duration: Duration) -> Tally {
    let go = Arc::new(Barrier::new(clients + 1));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let go = go.clone();
            std::thread::spawn(move || client(addr, lang, &go, duration))
        })
        .collect();
    go.wait();
    let mut total = Tally::default();
    for t in threads {
        match t.join() {
            Ok(tally) => total.merge(tally),
            Err(_) => total.error(&anyhow::anyhow!("a client thread panicked")),
        }
    }
    total
}

fn client(addr: SocketAddr, lang: Lang, go: &Barrier, duration: Duration) -> Tally {
    let mut tally = Tally::default();
    let opened = HttpSession::open(addr);
    // Every client waits for the start, also one whose session failed.
    go.wait();
    let mut session = match opened {
        Ok(s) => s,
        Err(e) => {
            tally.error(&e.context("opening a session"));
            return tally;
        }
    };
    let started = Instant::now();
    while started.elapsed() < duration {
        match mcp::execute_print_one(&mut session, lang) {
            Ok((Outcome::Ok { start }, ms)) => {
                tally.latencies.push(ms);
                match start.as_deref() {
                    Some("warm") => tally.warm += 1,
                    Some("cold") => tally.cold += 1,
                    _ => tally.unreported += 1,
                }
            }
            Ok((Outcome::Busy(msg), _)) => {
                tally.busy += 1;
                tally.busy_example.get_or_insert(msg);
                std::thread::sleep(BUSY_BACKOFF);
            }
            Err(e) => {
                tally.error(&e);
                // The session may be broken: go on in a new one, or stop this client.
                match HttpSession::open(addr) {
                    Ok(s) => session = s,
                    Err(e) => {
                        tally.error(&e.context("reopening a session"));
                        tally.elapsed = started.elapsed();
                        return tally;
                    }
                }
            }
        }
        tally.elapsed = started.elapsed();
    }
    if let Err(e) = session.close() {
        tally.error(&e.context("closing the session"));
    }
    tally
}

/// Executions per second over the run.
pub fn rate(t: &Tally) -> f64 {
    t.latencies.len() as f64 / t.elapsed.as_secs_f64().max(f64::MIN_POSITIVE)
}
