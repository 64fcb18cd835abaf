//! Warm microVMs in `codebox serve`: per language, a template booted once
//! (`template.rs`, kernel stage) and clones restored from it ahead of demand, each with
//! its program started and waiting for its code, as the namespace backend's warm pool
//! keeps sandboxes.
//!
//! - One keeper task per language makes the template (its jail from the spawner, with
//!   the RAM memfd), then keeps [`WarmVms::size`] clones waiting, restoring one at a time
//!   off the request path; a template that fails is made again after [`RETRY_AFTER`]
//!   (doubling while it fails), and calls boot cold meanwhile; clones that keep failing
//!   have their template made again.
//! - A waiting clone's program was started deferred: no deadline, its `/servers` and
//!   `/skills` bound as empty mounts. A call takes one ([`WarmVms::take`]) only if its
//!   program is the template's (the profile's limits; the timeout may differ), hands it
//!   its trees, clock, entropy and deadline (`WaitingClone::hand_out`), and runs it like
//!   a cold VM. A clone that fails there is dropped, and the call boots cold.
//! - Each clone's jail may live [`IDLE_MAX`] waiting plus the longest run the server
//!   allows; one waiting longer is retired and replaced, so no jail is killed by its
//!   lifetime while it runs.
//! - Waiting clones hold no admission slot (like pooled sandboxes): the VMs alive at
//!   once are at most the running executions plus `size` per language, plus one being
//!   restored per language.
//! - [`WarmVms::shutdown`] stops the keepers and kills every waiting clone, waiting
//!   until the spawner has reaped them (a template or clone still being made is
//!   dropped, which has the spawner kill it).

use std::collections::{HashMap, VecDeque};
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::jail::{Jailed, Sockets};
use super::jail_process::JailProcess;
use super::qemu::{Accel, Machine};
use super::template::{self, Stage, Template, WaitingClone};
use super::wire::RunSpec;
use super::Error;
use crate::runtime::Language;
use crate::spawner::wire::VmmSpec;
use crate::spawner::SpawnerClient;

/// The most clones a language keeps waiting, whatever `pool_size` says: each is a VM
/// (under TCG ~100 MiB of the host's memory, mostly QEMU's translation cache).
pub const MAX_WAITING: usize = 2;
/// How long a clone may wait before it is retired and replaced.
pub const IDLE_MAX: Duration = Duration::from_secs(600);
/// How long after a failed template the keeper tries again.
pub const RETRY_AFTER: Duration = Duration::from_secs(30);
/// How often a keeper with nothing to do looks for clones to retire.
const LOOK_EVERY: Duration = Duration::from_secs(15);

/// What the keepers need to launch jails.
pub struct Launcher {
    pub spawner: SpawnerClient,
    pub guest_dir: std::path::PathBuf,
    pub build_id: String,
    pub accel: Accel,
}

impl Launcher {
    /// A jail for `machine` from the spawner, living at most `lifetime`, with `ram` as
    /// the guest's RAM file when the machine has one.
    pub async fn jail(
        &self,
        machine: Machine,
        lifetime: Duration,
        ram: Option<std::os::fd::BorrowedFd<'_>>,
    ) -> Result<Jailed, Error> {
        let (jail, ports) = self
            .spawner
            .spawn_vmm(
                VmmSpec {
                    guest_dir: self.guest_dir.clone(),
                    machine: machine.clone(),
                    lifetime_ms: u64::try_from(lifetime.as_millis()).unwrap_or(u64::MAX),
                },
                ram,
            )
            .await
            .map_err(|e| Error::VmGone(format!("the VMM's jail could not be started: {e}")))?;
        let [control, stdout, stderr, channel] = ports;
        Ok(Jailed {
            process: JailProcess::Remote(jail),
            sockets: Sockets {
                control,
                stdout,
                stderr,
                channel,
            },
            machine,
        })
    }
}

/// Where a language's template stands.
enum TemplateState {
    Making,
    Ready(Arc<Template>),
    /// The last attempt's error; another comes after [`RETRY_AFTER`].
    Failed(String),
}

struct LangState {
    template: TemplateState,
    waiting: VecDeque<(WaitingClone, Instant)>,
    /// Calls that found a clone waiting, and that found none (they booted cold).
    handed_out: u64,
    missed: u64,
    /// The last clone's launch to waiting.
    last_restore: Option<Duration>,
    /// The last clone restore's error, if the last one failed.
    restore_error: Option<String>,
}

struct Lang {
    language: Language,
    spec: RunSpec,
    state: Mutex<LangState>,
    /// A clone was taken, or the pool is stopping.
    wake: Notify,
}

/// The warm microVMs of a server.
pub struct WarmVms {
    langs: HashMap<Language, Arc<Lang>>,
    size: usize,
    stop: CancellationToken,
    keepers: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl WarmVms {
    /// Starts a keeper per language of `specs` (what the profile's sandbox runs) that
    /// keeps `size` clones waiting (at most [`MAX_WAITING`]); `longest_run`: the longest
    /// timeout a call may ask for. On the current tokio runtime.
    pub fn start(
        launcher: Launcher,
        specs: Vec<(Language, RunSpec)>,
        size: usize,
        longest_run: Duration,
    ) -> Arc<WarmVms> {
        let size = size.min(MAX_WAITING);
        let launcher = Arc::new(launcher);
        let stop = CancellationToken::new();
        let langs: HashMap<Language, Arc<Lang>> = specs
            .into_iter()
            .map(|(language, spec)| {
                let lang = Arc::new(Lang {
                    language,
                    spec,
                    state: Mutex::new(LangState {
                        template: TemplateState::Making,
                        waiting: VecDeque::new(),
                        handed_out: 0,
                        missed: 0,
                        last_restore: None,
                        restore_error: None,
                    }),
                    wake: Notify::new(),
                });
                (language, lang)
            })
            .collect();
        let clone_lifetime = IDLE_MAX + Template::clone_lifetime(longest_run);
        let keepers = langs
            .values()
            .filter(|_| size > 0)
            .map(|lang| {
                tokio::spawn(keep(
                    lang.clone(),
                    launcher.clone(),
                    size,
                    clone_lifetime,
                    stop.clone(),
                ))
            })
            .collect();
        Arc::new(WarmVms {
            langs,
            size,
            stop,
            keepers: Mutex::new(keepers),
        })
    }

    /// How many clones each language keeps waiting.
    pub fn size(&self) -> usize {
        self.size
    }

    /// A waiting clone of `language` that can run `spec`, if one is waiting.
    pub fn take(&self, language: Language, spec: &RunSpec) -> Option<WaitingClone> {
        let lang = self.langs.get(&language)?;
        let mut st = lang.state.lock().expect("warm VMs lock");
        match &st.template {
            TemplateState::Ready(t) if t.runs(spec) => {}
            // Another program (limits the template does not have): never served from
            // the pool, so not a miss of it.
            TemplateState::Ready(_) => return None,
            TemplateState::Making | TemplateState::Failed(_) => {
                st.missed += 1;
                return None;
            }
        }
        // A clone past its waiting time is not handed out, even if its keeper has not
        // retired it yet (it may be busy restoring): its jail's lifetime would not cover
        // the longest run any more.
        let mut stale = Vec::new();
        let clone = loop {
            match st.waiting.pop_front() {
                Some((c, since)) if since.elapsed() >= IDLE_MAX => stale.push(c),
                Some((c, _)) => break Some(c),
                None => break None,
            }
        };
        match clone {
            Some(_) => st.handed_out += 1,
            None => st.missed += 1,
        }
        drop(st);
        // Dropped outside the lock: each kills its VM.
        drop(stale);
        lang.wake.notify_one();
        clone
    }

    /// Whether every language has its clones waiting, or no template to make them from
    /// until its next attempt: what a harness measuring one call at a time waits for,
    /// which must not wait for ever on a host where templates fail.
    pub fn is_full(&self) -> bool {
        self.size == 0
            || self.langs.values().all(|l| {
                let st = l.state.lock().expect("warm VMs lock");
                st.waiting.len() >= self.size || matches!(st.template, TemplateState::Failed(_))
            })
    }

    /// Per language: the template's state and figures, clones waiting, hand-outs.
    pub fn health(&self) -> serde_json::Value {
        let mut out = serde_json::Map::new();
        for (language, lang) in &self.langs {
            let st = lang.state.lock().expect("warm VMs lock");
            let template = match &st.template {
                TemplateState::Making => json!({"state": "making"}),
                TemplateState::Ready(t) => json!({
                    "state": "ready",
                    "stage": t.stage,
                    "boot_ms": t.figures.boot.as_millis() as u64,
                    "ready_ms": t.figures.ready.as_millis() as u64,
                    "snapshot_ms": t.figures.snapshot.as_millis() as u64,
                    "device_state_bytes": t.figures.state_bytes,
                }),
                TemplateState::Failed(why) => json!({"state": "failed", "error": why}),
            };
            out.insert(
                language.to_string(),
                json!({
                    "template": template,
                    "waiting": st.waiting.len(),
                    "target": self.size,
                    "handed_out": st.handed_out,
                    "missed": st.missed,
                    "last_restore_ms": st.last_restore.map(|d| d.as_millis() as u64),
                    "restore_error": st.restore_error,
                }),
            );
        }
        serde_json::Value::Object(out)
    }

    /// Stops the keepers and kills every waiting clone, waiting until the spawner has
    /// reaped them; a template or clone still being made is dropped, which kills it.
    pub async fn shutdown(&self) {
        self.stop.cancel();
        let keepers = std::mem::take(&mut *self.keepers.lock().expect("keepers lock"));
        for k in keepers {
            let _ = k.await;
        }
        for lang in self.langs.values() {
            let waiting: Vec<_> = {
                let mut st = lang.state.lock().expect("warm VMs lock");
                st.waiting.drain(..).collect()
            };
            for (clone, _) in waiting {
                clone.finish().await;
            }
        }
    }
}

/// Restore failures in a row after which a keeper makes its template again.
const REMAKE_AFTER_FAILURES: u32 = 5;
/// The longest pause between two attempts at a template that keeps failing.
const RETRY_AT_MOST: Duration = Duration::from_secs(600);

/// A language's keeper: its template, then its clones waiting, until the pool stops. A
/// template is made again after [`REMAKE_AFTER_FAILURES`] clones in a row failed.
async fn keep(
    lang: Arc<Lang>,
    launcher: Arc<Launcher>,
    size: usize,
    clone_lifetime: Duration,
    stop: CancellationToken,
) {
    loop {
        let Some(template) = make_until_made(&lang, &launcher, &stop).await else {
            return;
        };
        if !keep_clones(&lang, &launcher, &template, size, clone_lifetime, &stop).await {
            return;
        }
        tracing::warn!(language = %lang.language, "clones keep failing: making the microVM template again");
        lang.state.lock().expect("warm VMs lock").template = TemplateState::Making;
    }
}

/// Makes the template, again after a pause that doubles from [`RETRY_AFTER`] up to
/// [`RETRY_AT_MOST`] while it fails (a host that cannot make one is not kept busy);
/// `None` once the pool stops.
async fn make_until_made(
    lang: &Lang,
    launcher: &Launcher,
    stop: &CancellationToken,
) -> Option<Arc<Template>> {
    let mut pause = RETRY_AFTER;
    loop {
        let made = tokio::select! {
            made = make_template(launcher, lang.language, &lang.spec) => made,
            _ = stop.cancelled() => return None,
        };
        match made {
            Ok(t) => {
                tracing::info!(
                    language = %lang.language,
                    boot_ms = t.figures.boot.as_millis() as u64,
                    ready_ms = t.figures.ready.as_millis() as u64,
                    "microVM template ready"
                );
                let t = Arc::new(t);
                lang.state.lock().expect("warm VMs lock").template =
                    TemplateState::Ready(t.clone());
                return Some(t);
            }
            Err(e) => {
                tracing::warn!(language = %lang.language, error = %e, retry_s = pause.as_secs(), "making a microVM template failed; calls boot cold");
                lang.state.lock().expect("warm VMs lock").template =
                    TemplateState::Failed(e.to_string());
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = stop.cancelled() => return None,
                }
                pause = (pause * 2).min(RETRY_AT_MOST);
            }
        }
    }
}

/// Keeps `size` clones of `template` waiting; `false` once the pool stops, `true` when
/// clones failed [`REMAKE_AFTER_FAILURES`] times in a row.
async fn keep_clones(
    lang: &Lang,
    launcher: &Launcher,
    template: &Template,
    size: usize,
    clone_lifetime: Duration,
    stop: &CancellationToken,
) -> bool {
    let mut failures = 0u32;
    loop {
        // Clones past their waiting time are retired (their jail's lifetime counts from
        // their launch); `take` skips them too.
        let retired: Vec<_> = {
            let mut st = lang.state.lock().expect("warm VMs lock");
            let (keep, old): (VecDeque<_>, VecDeque<_>) = st
                .waiting
                .drain(..)
                .partition(|(_, since)| since.elapsed() < IDLE_MAX);
            st.waiting = keep;
            old.into_iter().collect()
        };
        for (clone, _) in retired {
            clone.finish().await;
        }
        let short = lang.state.lock().expect("warm VMs lock").waiting.len() < size;
        if short {
            let launched = Instant::now();
            let restored = tokio::select! {
                r = restore_one(launcher, template, clone_lifetime, launched) => r,
                _ = stop.cancelled() => return false,
            };
            let mut st = lang.state.lock().expect("warm VMs lock");
            match restored {
                Ok(clone) => {
                    failures = 0;
                    st.last_restore = Some(clone.restored);
                    st.restore_error = None;
                    st.waiting.push_back((clone, Instant::now()));
                    continue;
                }
                Err(e) => {
                    failures += 1;
                    tracing::warn!(language = %lang.language, error = %e, failures, "restoring a microVM clone failed");
                    st.restore_error = Some(e.to_string());
                    if failures >= REMAKE_AFTER_FAILURES {
                        return true;
                    }
                }
            }
        }
        // Nothing to do (or a restore failed: again after a pause that grows with the
        // failures in a row, so a broken host is not hammered).
        let pause = match failures {
            0 => LOOK_EVERY,
            n => (Duration::from_secs(1) * 2u32.saturating_pow(n)).min(RETRY_AFTER),
        };
        tokio::select! {
            _ = lang.wake.notified(), if failures == 0 => {}
            _ = tokio::time::sleep(pause) => {}
            _ = stop.cancelled() => return false,
        }
    }
}

/// Boots `language`'s template (kernel stage: each clone starts its own interpreter,
/// with its own hash seeds) with its jail from the spawner.
async fn make_template(
    launcher: &Launcher,
    language: Language,
    spec: &RunSpec,
) -> Result<Template, Error> {
    let (machine, ram) = template::machine_and_ram(spec, launcher.accel)?;
    let launched = Instant::now();
    let jailed = launcher
        .jail(machine, template::TEMPLATE_LIFETIME, Some(ram.as_fd()))
        .await?;
    template::make(
        jailed,
        ram,
        &launcher.build_id,
        language,
        spec.clone(),
        Stage::Kernel,
        launched,
    )
    .await
}

/// Launches and restores one clone of `template`, its program waiting.
async fn restore_one(
    launcher: &Launcher,
    template: &Template,
    lifetime: Duration,
    launched: Instant,
) -> Result<WaitingClone, Error> {
    let jailed = launcher
        .jail(template.clone_machine(), lifetime, Some(template.ram()))
        .await?;
    template.restore_waiting(jailed, launched).await
}
