//! Skills meet sandboxes: which skills directory a client's run binds at `/skills`, and
//! the syntax check of a skill before it is saved, run in a throw-away sandbox.
//!
//! The check runs where any execution runs (an admission slot, the server's profile,
//! no tools, no workspace, at most [`CHECK_TIMEOUT`]): the code is only compiled, never
//! run (see `crate::skills::check`), but the compilers are large programs fed untrusted
//! text, so they get the sandbox anyway rather than the supervisor's privileges.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::pii::PiiMode;
use crate::proxy::AllowList;
use crate::runtime::Language;
use crate::sandbox::ProgramStatus;
use crate::server::tools::execute::Checked;
use crate::server::CodeboxServer;
use crate::skills::{check, SkillLanguage};
use crate::spawner::SpawnSpec;

/// Wall-clock limit of one syntax check.
const CHECK_TIMEOUT: Duration = Duration::from_secs(20);

/// How long the check of a skill saved from running code waits for a sandbox slot
/// (`Admission::enter_nested`): longer than one check takes, so one other such check
/// ahead of it does not make it fail.
const NESTED_SLOT_WAIT: Duration = Duration::from_secs(30);

/// Who asks for a syntax check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::server) enum CheckFor {
    /// The `save_skill` tool: a sandbox like any execution's (the client's rate limits,
    /// an admission slot or a queue place).
    Tool,
    /// Code running in an execution (`codebox.save_skill`): that execution holds the
    /// client's rate-limit place and an admission slot already, so the check takes
    /// neither again (waiting for them could wait for the caller's own end) and gets
    /// its sandbox from `Admission::enter_nested`.
    RunningCode,
}

impl CodeboxServer {
    /// The host directory bound at `/skills` for a run of `client`, in a session or not
    /// (see `ClientSkills::bind_dir`); `None` without skills. Runs on the blocking pool: it
    /// may copy skills into the client's view.
    pub(in crate::server) async fn skills_dir_for(
        &self,
        client: &str,
        session: bool,
    ) -> Result<Option<std::path::PathBuf>, String> {
        let Some(skills) = &self.state.skills else {
            return Ok(None);
        };
        // The common case, a client without skills of its own outside a session, needs
        // one small directory read: no trip to the blocking pool.
        match skills.binds_view(client, session) {
            Ok(false) => return Ok(skills.shared_root().map(|p| p.to_path_buf())),
            Ok(true) => {}
            Err(e) => {
                tracing::error!(error = %e, "cannot read the client's skills");
                return Err(format!("the skills could not be prepared: {e}"));
            }
        }
        let state = self.state.clone();
        let client = client.to_string();
        let joined = tokio::task::spawn_blocking(move || match &state.skills {
            Some(skills) => skills.bind_dir(&client, session),
            None => Ok(None),
        })
        .await;
        match joined {
            Ok(Ok(dir)) => Ok(dir),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "cannot prepare the client's skills");
                Err(format!("the skills could not be prepared: {e}"))
            }
            Err(e) => {
                tracing::error!(error = %e, "preparing the client's skills panicked");
                Err("the skills could not be prepared".into())
            }
        }
    }

    /// Compiles `code` in a throw-away sandbox: `Ok(Ok(()))` when it compiles,
    /// `Ok(Err(message))` with the compiler's message when not, `Err(why)` when the
    /// check itself could not run.
    pub(in crate::server) async fn check_skill_syntax(
        &self,
        client: &str,
        name: &str,
        language: SkillLanguage,
        code: &str,
        ct: CancellationToken,
        asker: CheckFor,
    ) -> Result<Result<(), String>, String> {
        let s = &self.state;
        // A check is a sandbox like an execution: it counts against the client's limits
        // (a check from running code is part of the execution that counts already).
        let _permit = match asker {
            CheckFor::Tool => Some(
                s.rate
                    .admit(client)
                    .map_err(|limited| limited.to_string())?,
            ),
            CheckFor::RunningCode => None,
        };
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).map_err(|e| format!("no random marker: {e}"))?;
        let marker: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let program = check::program(language, name, code, &format!("codebox-parsed-{marker}"));
        let mut limits = s.settings.profile.limits.clone();
        limits.timeout = limits.timeout.min(CHECK_TIMEOUT);
        let c = Checked {
            files: Default::default(),
            limits,
            allow: AllowList::none(),
            pii: PiiMode::Off,
            // A check never needs a host (a TypeScript skill's remote imports stay
            // unresolved).
            narrowing: self.no_hosts(),
            packages: None,
            output_chars: s.settings.output_budget.default_chars,
            outputs: Vec::new(),
            // No tools and no hosts: nothing to approve.
            approval: None,
        };
        let wrappers = self.wrapper_dir();
        // A TypeScript skill's imports are resolved, so it sees the upstream wrappers and
        // the client's other skills as it will when it runs. Python's compile resolves
        // nothing: its check binds what the pool binds and is served warm.
        let skills = match language {
            SkillLanguage::Typescript => self.skills_dir_for(client, false).await?,
            SkillLanguage::Python => s
                .skills
                .as_ref()
                .and_then(|k| k.shared_root())
                .map(|p| p.to_path_buf()),
        };
        let spec = SpawnSpec {
            language: match language {
                SkillLanguage::Python => Language::Python,
                SkillLanguage::Typescript => Language::TypeScript,
            },
            profile: s.settings.profile.source.clone(),
            limits: c.limits.clone(),
            workspace: None,
            workspace_mount: None,
            network: Some(s.settings.network.clone()),
            packages: None,
            servers: wrappers.as_ref().map(|w| w.path().to_path_buf()),
            skills,
            pooled: false,
        };
        let admitted = match asker {
            CheckFor::Tool => s.admission.enter().await,
            CheckFor::RunningCode => s.admission.enter_nested(NESTED_SLOT_WAIT).await,
        }
        .map_err(|busy| {
            tracing::info!(%busy, ?asker, "no sandbox for a skill's syntax check");
            crate::metrics::global().refused(crate::metrics::labels::Refusal::from(&busy));
            busy.to_string()
        })?;
        let outcome = self
            .run_once(
                spec,
                &program,
                &c,
                admitted,
                &|_| {},
                async move { ct.cancelled().await },
                |_, _| {},
            )
            .await?
            .outcome;
        let stdout = String::from_utf8_lossy(&outcome.stdout.bytes);
        match check::verdict(&stdout) {
            Some(verdict) => Ok(verdict),
            None => {
                let how = match outcome.status {
                    _ if outcome.timed_out => "it timed out".to_string(),
                    Some(ProgramStatus::Exited(code)) => format!("the checker exited with {code}"),
                    Some(ProgramStatus::Signaled(sig)) => {
                        format!("the checker was killed by signal {sig}")
                    }
                    None => "the checker was killed".to_string(),
                };
                let stderr = String::from_utf8_lossy(&outcome.stderr.bytes);
                tracing::warn!(%how, stderr = %check::bounded(&stderr), "a skill syntax check failed to run");
                Err(format!("the syntax check did not finish ({how})"))
            }
        }
    }
}
