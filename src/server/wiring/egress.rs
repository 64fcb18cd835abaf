//! The egress proxy's part in an execution (`crate::egress` is the proxy itself):
//!
//! - the network mode every sandbox is spawned with, and the trust bundle it binds;
//! - a request's `network` argument, which can only narrow the server's allowlist;
//! - the listener of a proxy-mode sandbox, served for the run and its report taken at the
//!   end (a keep-alive interpreter's listener is served anew for each run);
//! - configured secrets redacted from everything an execution returns, whatever the PII
//!   mode: a secret never enters the sandbox, so one that comes back out got there by a
//!   way the proxy did not see (an API that reflects a transformed credential, say);
//! - the execute tools' descriptions and input schema saying what network the code has.

use std::os::fd::OwnedFd;

use rmcp::handler::server::router::tool::ToolRouter;

use crate::egress::{Egress, EgressReport, EgressRun, Narrowing, NetworkMode};
use crate::server::CodeboxServer;

impl CodeboxServer {
    /// The narrowing a call asks for with `network`, or why it is refused.
    pub(in crate::server) fn narrowing(
        &self,
        asked: Option<&[String]>,
    ) -> Result<Narrowing, String> {
        let s = &self.state.settings;
        match (asked, &s.egress) {
            (None, _) => Ok(Narrowing::none()),
            (Some(hosts), Some(egress)) => {
                egress.policy().narrowed(hosts).map_err(|e| e.to_string())
            }
            (Some(_), None) => Err(format!(
                "network: this server's sandboxes have no egress (network mode {}); \
                 the code cannot reach any host",
                s.profile.network_mode
            )),
        }
    }
}

impl CodeboxServer {
    /// A narrowing that allows no host (for sandboxes that need none).
    pub(in crate::server) fn no_hosts(&self) -> Narrowing {
        match &self.state.settings.egress {
            Some(egress) => egress
                .policy()
                .narrowed(&[])
                .expect("an empty list holds no pattern to refuse"),
            None => Narrowing::none(),
        }
    }
}

/// `health.network`: the mode, and in proxy mode the policy (hosts, never secret values)
/// and the counters since start.
pub(crate) fn health(settings: &crate::server::Settings) -> serde_json::Value {
    let mode = serde_json::to_value(settings.profile.network_mode).unwrap_or_default();
    match &settings.egress {
        Some(egress) => {
            let mut v = egress.health();
            if let Some(o) = v.as_object_mut() {
                o.insert("mode".into(), mode);
                o.insert(
                    "proxy".into(),
                    format!("http://127.0.0.1:{}", crate::runtime::EGRESS_PORT).into(),
                );
            }
            v
        }
        None => serde_json::json!({ "mode": mode }),
    }
}

/// Starts the egress proxy on a proxy-mode sandbox's listener, for one run, with the
/// call's narrowing and the execution's approval gate.
pub(in crate::server) fn serve(
    egress: Option<&Egress>,
    listener: Option<OwnedFd>,
    call: &crate::server::tools::execute::Checked,
) -> Option<EgressRun> {
    match (egress, listener) {
        (Some(egress), Some(listener)) => Some(egress.start_gated(
            std::net::TcpListener::from(listener),
            call.narrowing.clone(),
            call.approval.clone(),
        )),
        (None, Some(_)) => {
            // A proxy-mode sandbox on a server without egress: its connections are
            // refused when the listener closes here.
            tracing::warn!("a sandbox came with an egress listener but egress is off");
            None
        }
        (_, None) => None,
    }
}

/// A keep-alive interpreter's listener, served for one more run: a copy of the same
/// socket, so the interpreter keeps its listener between runs (connections made while no
/// run is on wait in its backlog).
pub(in crate::server) fn serve_again(
    egress: Option<&Egress>,
    listener: Option<&OwnedFd>,
    call: &crate::server::tools::execute::Checked,
) -> Result<Option<EgressRun>, String> {
    let copy = match listener {
        Some(l) => Some(
            l.try_clone()
                .map_err(|e| format!("cannot serve the session's egress listener: {e}"))?,
        ),
        None => None,
    };
    Ok(serve(egress, copy, call))
}

/// Ends a run's proxy (every connection of it) and returns its report.
pub(in crate::server) async fn finish(run: Option<EgressRun>) -> Option<EgressReport> {
    match run {
        Some(run) => Some(run.finish().await),
        None => None,
    }
}

/// `text` with every configured secret replaced (as it is when there are none).
pub(crate) fn without_secrets(settings: &crate::server::Settings, text: String) -> String {
    match &settings.egress {
        Some(egress) if !egress.secrets().is_empty() => {
            let out = egress.secrets().redact_all(text.as_bytes());
            String::from_utf8(out)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
        }
        _ => text,
    }
}

/// Tells the model what network its code has: in proxy mode the execute tools say so in
/// their description and take `network` (hosts, narrowing the server's allowlist).
pub(in crate::server) fn describe_network(
    router: &mut ToolRouter<CodeboxServer>,
    mode: NetworkMode,
) {
    if mode != NetworkMode::Proxy {
        return;
    }
    for name in ["execute_python", "execute_typescript"] {
        let Some(route) = router.map.get_mut(name) else {
            continue;
        };
        let tool = &mut route.attr;
        if let Some(d) = &tool.description {
            let d = d
                .replace(
                    "matplotlib; no network)",
                    "matplotlib; HTTP(S) to allowed hosts only, see health)",
                )
                .replace(
                    "(Deno 2; no network)",
                    "(Deno 2; fetch to allowed hosts only, see health)",
                );
            tool.description = Some(d.into());
        }
        let mut schema = (*tool.input_schema).clone();
        if let Some(serde_json::Value::Object(props)) = schema.get_mut("properties") {
            props.insert(
                "network".into(),
                serde_json::json!({"type": "array", "items": {"type": "string"},
                    "description": "hosts the code may reach (narrows the allowlist; [] none)"}),
            );
        }
        tool.input_schema = std::sync::Arc::new(schema);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::Secrets;
    use crate::execution::ExecutionResult;

    fn result(stdout: &str) -> ExecutionResult {
        let outcome = crate::sandbox::Outcome {
            status: Some(crate::sandbox::ProgramStatus::Exited(0)),
            timed_out: false,
            stdout: crate::sandbox::Captured {
                bytes: stdout.as_bytes().to_vec(),
                tail: Vec::new(),
                tail_room: 0,
                truncated: false,
                total_bytes: stdout.len() as u64,
            },
            stderr: Default::default(),
            duration: std::time::Duration::from_millis(1),
            landlock: None,
            cgroup: None,
        };
        crate::execution::result_from(crate::runtime::Language::Python, None, false, outcome)
    }

    #[test]
    fn secrets_are_redacted_everywhere_a_result_carries_text() {
        let secrets = Secrets::new(&["s3cr3t-token".to_string()]).unwrap();
        let mut r = result("got s3cr3t-token back\n");
        r.stderr = "Bearer s3cr3t-token".into();
        r.tool_channel_error = Some("s3cr3t-token".into());
        let mut rec = crate::egress::ConnectionRecord::new(
            crate::egress::ConnectionKind::Http,
            "api.example.com".into(),
            80,
        );
        rec.reason = Some("echo s3cr3t-token".into());
        r.network = Some(EgressReport {
            connections: vec![rec],
            ..Default::default()
        });
        r.redact_secrets(&secrets);
        let text = serde_json::to_string(&r).unwrap();
        assert!(!text.contains("s3cr3t-token"), "{text}");
        assert!(r.stdout.contains(crate::egress::REDACTED), "{}", r.stdout);
        // Nothing configured: nothing touched.
        let mut r = result("plain");
        r.redact_secrets(&Secrets::none());
        assert_eq!(r.stdout, "plain");
    }

    #[test]
    fn proxy_mode_adds_network_to_the_execute_tools() {
        let mut router = CodeboxServer::all_tools();
        describe_network(&mut router, NetworkMode::None);
        let t = router.get("execute_python").unwrap().clone();
        assert!(!t.input_schema["properties"]
            .as_object()
            .unwrap()
            .contains_key("network"));
        describe_network(&mut router, NetworkMode::Proxy);
        for name in ["execute_python", "execute_typescript"] {
            let t = router.get(name).unwrap();
            assert!(
                t.input_schema["properties"]["network"].is_object(),
                "{name}"
            );
            let d = t.description.as_deref().unwrap();
            assert!(d.contains("allowed hosts only"), "{d}");
            assert!(!d.contains("no network"), "{d}");
        }
    }
}
