//! The spawner's zygotes (`sandbox::zygote`): at most [`MAX_ZYGOTES`], one per kind of
//! Python sandbox (`zygote::key`: the binds, environment and policy fixed in its mount
//! namespace), started on the first request of that kind and used from the moment it is
//! ready. Until then, and whenever a zygote cannot serve a request, the sandbox is
//! started cold: a zygote only ever makes a spawn faster, never makes one fail.
//!
//! A zygote's children live in its pid namespace, so a zygote is only replaced (by a
//! newer kind, least recently used first) while it has none; one that dies takes its
//! children with it, and their watches report their ends as usual. A zygote that died
//! is logged once (WARN, with how it ended), its kind starts cold for [`COOL_DOWN`] and
//! then gets a new zygote; every launch and end goes to the supervisor as a
//! [`ZygoteEvent`] (`health.spawner.zygotes`).

use std::collections::{HashMap, HashSet};
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant};

use super::wire::ZygoteEvent;
use crate::sandbox::cgroup::CgroupManager;
use crate::sandbox::zygote::{self, PendingFork, Zygote};
use crate::sandbox::SandboxSpec;

/// Zygotes kept at once: a server has two of one kind (with the data set for its pool,
/// ~100 MB; without, for the calls that find the pool empty, ~15 MB), and a kind that
/// changed (a new catalog) may start while the old one still has children.
pub const MAX_ZYGOTES: usize = 4;
/// How long a zygote may take to load before it is given up.
const READY_LIMIT: Duration = Duration::from_secs(120);
/// After a zygote of a kind failed, that kind is started cold for this long.
const COOL_DOWN: Duration = Duration::from_secs(60);
/// A zygote forks no more after this long; a fresh one (a new address-space layout and
/// hash seed) takes over, and the old one ends with its last child.
const RETIRE_AFTER: Duration = Duration::from_secs(50 * 60);

struct Entry {
    zygote: Zygote,
    /// Spawner ids of the live sandboxes it forked.
    children: HashSet<u64>,
    last_used: Instant,
    launched: Instant,
    /// Forks no more (retired, or it broke the protocol); killed when its last child
    /// ends, never before: its children live in its pid namespace.
    draining: bool,
}

/// What one poll of the zygotes' descriptors is about.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    Control(usize),
    Output(usize),
    Ended(usize),
}

/// The zygotes of one spawner.
pub struct Zygotes {
    enabled: bool,
    entries: Vec<Entry>,
    /// Which zygote (by key) forked each live sandbox.
    parent_of: HashMap<u64, String>,
    cooling: HashMap<String, Instant>,
    /// For the supervisor, taken by [`Zygotes::take_events`].
    events: Vec<ZygoteEvent>,
}

impl Zygotes {
    pub fn new(enabled: bool) -> Zygotes {
        Zygotes {
            enabled,
            entries: Vec::new(),
            parent_of: HashMap::new(),
            cooling: HashMap::new(),
            events: Vec::new(),
        }
    }

    /// What happened to the zygotes since the last call, for the supervisor.
    pub fn take_events(&mut self) -> Vec<ZygoteEvent> {
        std::mem::take(&mut self.events)
    }

    /// A fork of a sandbox for `spec` from its zygote, under way, or `None`: the caller
    /// spawns it cold. Launches the zygote of a kind not seen before (ready for a later
    /// request). A fork that fails later is reported with [`Zygotes::fork_failed`].
    pub fn start_fork(
        &mut self,
        id: u64,
        spec: &SandboxSpec,
        cgroups: Option<&CgroupManager>,
        warm_up: bool,
    ) -> Option<PendingFork> {
        if !self.enabled {
            return None;
        }
        let key = zygote::key(spec)?;
        let current = |e: &Entry| e.zygote.key() == key && !e.draining;
        if let Some(i) = self.entries.iter().position(current) {
            if self.entries[i].launched.elapsed() > RETIRE_AFTER {
                tracing::debug!("retiring a zygote after its time; a fresh one takes over");
                self.drain(i, false);
            }
        }
        let Some(i) = self.entries.iter().position(current) else {
            self.launch(key, spec, cgroups);
            return None;
        };
        let entry = &mut self.entries[i];
        if !entry.zygote.is_ready() {
            return None;
        }
        match entry.zygote.start_fork(spec, cgroups, warm_up) {
            Ok(pending) => {
                entry.children.insert(id);
                entry.last_used = Instant::now();
                self.parent_of.insert(id, key);
                Some(pending)
            }
            Err(e) => {
                let broken = zygote_broken(&e);
                tracing::warn!(id, broken, error = %format!("{:#}", anyhow::Error::new(e)), "forking from the zygote failed; starting the sandbox cold");
                if broken {
                    self.drain(i, true);
                }
                None
            }
        }
    }

    fn launch(&mut self, key: String, spec: &SandboxSpec, cgroups: Option<&CgroupManager>) {
        if self
            .cooling
            .get(&key)
            .is_some_and(|until| Instant::now() < *until)
        {
            return;
        }
        if self.entries.len() >= MAX_ZYGOTES {
            // Replace the least recently used zygote without children, if any.
            let idle = (0..self.entries.len())
                .filter(|i| self.entries[*i].children.is_empty())
                .min_by_key(|i| self.entries[*i].last_used);
            match idle {
                Some(i) => self.remove(i, false, None),
                None => return,
            }
        }
        match Zygote::launch(spec, cgroups) {
            Ok(zygote) => {
                if let Some(pid) = zygote.pid() {
                    self.events.push(ZygoteEvent::Launched { pid });
                }
                self.entries.push(Entry {
                    zygote,
                    children: HashSet::new(),
                    last_used: Instant::now(),
                    launched: Instant::now(),
                    draining: false,
                })
            }
            Err(e) => {
                tracing::error!(error = %format!("{:#}", anyhow::Error::new(e)), "launching a zygote failed; its kind of sandbox starts cold for a minute");
                self.cooling.insert(key, Instant::now() + COOL_DOWN);
            }
        }
    }

    /// A fork under way failed: a failure of the child's own setup leaves its zygote as
    /// it is; anything else (the zygote broke the protocol, did not answer) replaces it.
    pub fn fork_failed(&mut self, id: u64, error: &zygote::Error) {
        let parent = self.parent_of.get(&id).cloned();
        self.child_ended(id);
        if !zygote_broken(error) {
            return;
        }
        let of = |e: &Entry| Some(e.zygote.key()) == parent.as_deref() && !e.draining;
        if let Some(i) = self.entries.iter().position(of) {
            self.drain(i, true);
        }
    }

    /// Zygote `i` forks no more; it is killed now if it has no child, else when its
    /// last one ends. `failed`: its kind cools down.
    fn drain(&mut self, i: usize, failed: bool) {
        if failed {
            let key = self.entries[i].zygote.key().to_string();
            self.cooling.insert(key, Instant::now() + COOL_DOWN);
        }
        self.entries[i].draining = true;
        if self.entries[i].children.is_empty() {
            self.remove(i, false, None);
        }
    }

    /// A sandbox this spawner watched has ended.
    pub fn child_ended(&mut self, id: u64) {
        if self.parent_of.remove(&id).is_none() {
            return;
        }
        let Some(i) = self.entries.iter().position(|e| e.children.contains(&id)) else {
            return;
        };
        self.entries[i].children.remove(&id);
        if self.entries[i].draining && self.entries[i].children.is_empty() {
            self.remove(i, false, None);
        }
    }

    /// The descriptors to poll, each with what its readiness means.
    pub fn poll_fds(&self) -> Vec<(BorrowedFd<'_>, Event)> {
        let mut out = Vec::new();
        for (i, e) in self.entries.iter().enumerate() {
            let [control, stdout, stderr] = e.zygote.poll_fds();
            out.push((control, Event::Control(i)));
            out.push((stdout, Event::Output(i)));
            out.push((stderr, Event::Output(i)));
            if let Some(pidfd) = e.zygote.pidfd() {
                out.push((pidfd, Event::Ended(i)));
            }
        }
        out
    }

    /// Handles what one poll reported (indices as [`Zygotes::poll_fds`] gave them).
    pub fn handle(&mut self, events: &[Event]) {
        // Each with what was seen first (one zygote's death is often seen twice: its
        // socket's end and its pidfd).
        let mut dead: Vec<(usize, &'static str)> = Vec::new();
        let mut misbehaved: Vec<usize> = Vec::new();
        for event in events {
            match *event {
                Event::Output(i) => self.entries[i].zygote.drain_output(),
                Event::Control(i) => match self.entries[i].zygote.on_readable() {
                    Ok(()) => {}
                    Err(zygote::Error::Gone) => dead.push((i, "its socket closed")),
                    Err(e) => {
                        tracing::warn!(error = %e, "a zygote misbehaved; it forks no more");
                        misbehaved.push(i);
                    }
                },
                Event::Ended(i) => dead.push((i, "it ended")),
            }
        }
        for (i, e) in self.entries.iter().enumerate() {
            if !e.zygote.is_ready() && e.launched.elapsed() > READY_LIMIT {
                tracing::error!("a zygote did not get ready in 2 minutes; giving it up");
                dead.push((i, "it did not get ready in 2 minutes"));
            }
        }
        for i in misbehaved {
            if !dead.iter().any(|(d, _)| *d == i) {
                self.entries[i].draining = true;
                let key = self.entries[i].zygote.key().to_string();
                self.cooling.insert(key, Instant::now() + COOL_DOWN);
            }
        }
        dead.sort_unstable_by_key(|(i, _)| *i);
        dead.dedup_by_key(|(i, _)| *i);
        for (i, seen) in dead.into_iter().rev() {
            self.remove(i, true, Some(seen));
        }
        // A misbehaving zygote whose children have all ended.
        while let Some(i) = self
            .entries
            .iter()
            .position(|e| e.draining && e.children.is_empty())
        {
            self.remove(i, false, None);
        }
    }

    /// Kills zygote `i` (and any child it still has); `failed`: its kind cools down.
    /// `died`: it ended on its own (what was seen), which is logged once and told to the
    /// supervisor as unexpected.
    fn remove(&mut self, i: usize, failed: bool, died: Option<&str>) {
        let mut entry = self.entries.remove(i);
        entry.zygote.drain_output();
        if failed {
            self.cooling
                .insert(entry.zygote.key().to_string(), Instant::now() + COOL_DOWN);
        }
        for id in &entry.children {
            self.parent_of.remove(id);
        }
        let pid = entry.zygote.pid();
        let ended = entry.zygote.shutdown();
        let how = match (died, &ended) {
            (Some(seen), Some(ended)) => format!("{seen}: {ended}"),
            (Some(seen), None) => seen.to_string(),
            (None, _) => "retired".to_string(),
        };
        if died.is_some() {
            tracing::warn!(
                zygote = pid,
                how,
                children = entry.children.len(),
                cold_for_s = COOL_DOWN.as_secs(),
                "a zygote died; its kind of sandbox starts cold for a while, then a new zygote takes over"
            );
        }
        if let Some(pid) = pid {
            self.events.push(ZygoteEvent::Ended {
                pid,
                unexpected: died.is_some(),
                how,
            });
        }
    }

    /// Kills every zygote (the spawner is leaving).
    pub fn shutdown(&mut self) {
        while !self.entries.is_empty() {
            self.remove(0, false, None);
        }
    }
}

/// Whether a failed fork says the zygote itself is broken (it closed its socket, broke
/// the protocol, or a request could not be written to it), rather than the one child, its
/// cgroup or its deadline.
fn zygote_broken(error: &zygote::Error) -> bool {
    matches!(error, zygote::Error::Gone | zygote::Error::Io { .. })
        || matches!(error, zygote::Error::Protocol(why) if !why.contains("did not get ready"))
}
