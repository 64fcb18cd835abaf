//! A one-shot execution on the microVM backend: a VM per call (a waiting clone, or one
//! booted now; its jail started by the spawner, the VM driven here), fd 3 served by the
//! same tool proxy as a namespace sandbox's. See `microvm::serve` for what this backend
//! does not do yet.

use std::sync::Arc;

use super::execute::{Checked, Ran};
use crate::execution::SandboxStart;
use crate::microvm::serve::{capture_tree, ServeVms, VmStart};
use crate::microvm::wire::Tree;
use crate::proxy::ProxySession;
use crate::server::CodeboxServer;
use crate::spawner::{SpawnSpec, Stream};

impl CodeboxServer {
    /// Gets a VM (a waiting clone, or one booted now) for `spec`'s language and limits
    /// under the profile's policy, runs `frame` in it with `proxy` on fd 3, and ends it.
    /// `admitted` (the admission slot and what the call holds) is released when the VM
    /// is gone.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn run_in_microvm(
        &self,
        vms: &Arc<ServeVms>,
        spec: &SpawnSpec,
        frame: Vec<u8>,
        c: &Checked,
        admitted: impl std::any::Any + Send,
        proxy: Arc<ProxySession>,
        cancel: impl std::future::Future<Output = ()>,
        on_output: impl FnMut(Stream, &[u8]),
    ) -> Result<Ran, String> {
        let s = &self.state;
        // What a namespace sandbox binds, the guest gets as trees.
        let dirs: Vec<(Tree, std::path::PathBuf)> = [
            (Tree::Servers, spec.servers.clone()),
            (Tree::Skills, spec.skills.clone()),
        ]
        .into_iter()
        .filter_map(|(tree, dir)| Some((tree, dir?)))
        .collect();
        // What the sandbox user may read of them, as a bind mount would show it.
        let reader = s.settings.sandbox_ids;
        let trees = tokio::task::spawn_blocking(move || {
            dirs.into_iter()
                .map(|(tree, dir)| Ok((tree, capture_tree(&dir, reader)?)))
                .collect::<Result<Vec<_>, crate::microvm::Error>>()
        })
        .await
        .map_err(|e| format!("capturing the trees for the microVM failed: {e}"))?
        .map_err(|e| {
            tracing::error!(error = %e, "capturing a tree for the microVM failed");
            format!("the microVM could not be given its trees: {e}")
        })?;
        // A cancel (the client's, or the server stopping) also ends a VM still booting:
        // dropping the boot drops the jail, which the spawner then kills.
        tokio::pin!(cancel);
        let started = tokio::select! {
            started = vms.start(
                &s.spawner,
                spec.language,
                &c.limits,
                &s.settings.profile.policy,
                &trees,
                admitted,
            ) => started,
            _ = &mut cancel => return Err("the execution was cancelled while its microVM booted".into()),
        };
        // Sent: the trees need not stay in memory for the run.
        drop(trees);
        let (sandbox, how) = started.map_err(|e| {
            tracing::error!(error = %e, language = %spec.language, "starting a microVM failed");
            format!("the microVM could not be started: {e}")
        })?;
        // The runtime's `codebox/exit` carries its report (layers, how TypeScript ended),
        // taken only when someone asks for the notice; the VM's end is what ends the run
        // here, so nobody waits for it.
        let (exit_notice, _not_waited) = tokio::sync::oneshot::channel();
        proxy.set_exit_notice(exit_notice);
        let serve_proxy = proxy.clone();
        let (outcome, ending) = crate::microvm::run::capture(
            sandbox,
            frame,
            Some(Box::new(move |stream| Box::pin(serve_proxy.serve(stream)))),
            (c.limits.stdout_cap, c.limits.stderr_cap),
            c.limits.timeout,
            &mut cancel,
            on_output,
        )
        .await
        .map_err(|e| format!("the microVM failed: {e}"))?;
        if !ending.end.is_normal() && !outcome.timed_out {
            // The sandbox's infrastructure failed, not the program (a killed or stopped
            // VMM, a guest that broke the protocol): no result to report as the program's.
            return Err(format!(
                "the microVM ended abnormally: {}",
                ending.end.describe()
            ));
        }
        Ok(Ran {
            outcome,
            tools: proxy.take_report(),
            network: None,
            start: Some(match how {
                VmStart::Warm => SandboxStart::Warm,
                VmStart::Cold => SandboxStart::Cold,
            }),
            interpreter: "none",
            zygote: false,
            backend: crate::microvm::Backend::Microvm,
        })
    }
}
