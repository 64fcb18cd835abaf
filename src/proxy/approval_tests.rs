//! The proxy with an approval gate: what is asked, when, and what a refusal looks like.

use std::sync::Mutex;

use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction};

use super::*;
use crate::approval::{ApprovalPolicy, ApprovalSection, AskError, Asker, Gate};

/// Answers every question with `answer` after `delay`, keeping the messages.
struct Fixed {
    answer: ElicitationAction,
    delay: Duration,
    asked: Mutex<Vec<String>>,
}

impl Asker for Fixed {
    fn ask(
        &self,
        request: ElicitRequestParams,
        _wait: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<ElicitResult, AskError>> + Send>> {
        if let ElicitRequestParams::FormElicitationParams { message, .. } = request {
            self.asked.lock().unwrap().push(message);
        }
        let (answer, delay) = (self.answer.clone(), self.delay);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            Ok(ElicitResult::new(answer).with_content(json!({"approve": true})))
        })
    }
}

fn gated(h: &Harness, answer: ElicitationAction, delay: Duration) -> Arc<Fixed> {
    let asker = Arc::new(Fixed {
        answer,
        delay,
        asked: Mutex::default(),
    });
    let section: ApprovalSection = toml::from_str(r#"require_approval = ["fs__*"]"#).unwrap();
    let policy = Arc::new(ApprovalPolicy::from_section(&section).unwrap());
    let gate = Gate::new(
        policy,
        asker.clone(),
        Box::new(|v: &mut Value| v.to_string()),
        None,
    );
    h.session.set_approval(gate);
    asker
}

#[tokio::test]
async fn a_declined_call_never_reaches_the_backend_and_says_why() {
    let mut h = harness(&["fs__*", "mem__*"], ProxyLimits::default());
    let asker = gated(&h, ElicitationAction::Decline, Duration::ZERO);
    let r = h
        .rpc(
            1,
            "tools/call",
            json!({"name": "fs__read", "arguments": {"path": "/etc"}}),
        )
        .await;
    assert_eq!(r["error"]["code"], code::APPROVAL);
    assert_eq!(
        r["error"]["message"],
        "approval declined by the user for fs__read"
    );
    assert_eq!(h.backend.calls.load(Ordering::SeqCst), 0);
    let calls = h.session.report().tool_calls;
    assert_eq!(calls[0].error_kind, Some("approval"));
    let asked = asker.asked.lock().unwrap().clone();
    assert!(asked[0].contains(r#"{"path":"/etc"}"#), "{asked:?}");
    assert!(
        asked[0].contains("(server \"fs\", tool \"read\")"),
        "{asked:?}"
    );
    // An ungated tool is not asked about.
    let r = h.rpc(2, "tools/call", json!({"name": "mem__fail"})).await;
    assert!(r["result"].is_object(), "{r}");
    assert_eq!(asker.asked.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn a_call_the_allowlist_denies_is_never_asked_about() {
    let mut h = harness(&["mem__*"], ProxyLimits::default());
    let asker = gated(&h, ElicitationAction::Accept, Duration::ZERO);
    let r = h.rpc(1, "tools/call", json!({"name": "fs__read"})).await;
    assert_eq!(r["error"]["code"], code::DENIED);
    let r = h
        .rpc(2, "tools/call", json!({"name": "fs__nonexistent_tool"}))
        .await;
    assert_eq!(r["error"]["code"], code::DENIED);
    assert!(asker.asked.lock().unwrap().is_empty());
}

#[tokio::test]
async fn the_call_timeout_starts_after_the_approval() {
    let limits = ProxyLimits {
        call_timeout: Duration::from_millis(100),
        ..ProxyLimits::default()
    };
    let mut h = harness(&["fs__*"], limits);
    let asker = gated(&h, ElicitationAction::Accept, Duration::from_millis(400));
    let r = h
        .rpc(
            1,
            "tools/call",
            json!({"name": "fs__read", "arguments": {"path": "/a"}}),
        )
        .await;
    // Approved after 400 ms, four times the call's own timeout: the call still runs,
    // with exactly the arguments the user saw.
    assert_eq!(
        r["result"]["structuredContent"]["echo"],
        json!({"path": "/a"})
    );
    assert_eq!(h.backend.calls.load(Ordering::SeqCst), 1);
    assert_eq!(asker.asked.lock().unwrap().len(), 1);
}

/// A server still connecting: configured, no tools listed yet; a call by name waits for
/// it and then reaches its tool (here: counted, then answered).
struct Connecting {
    calls: AtomicU32,
}

impl ToolBackend for Connecting {
    fn catalog(&self) -> Arc<Catalog> {
        Arc::new(Catalog {
            version: 1,
            tools: vec![],
            servers: vec![crate::upstream::catalog::CatalogServer {
                name: "db".into(),
                ident: "db".into(),
            }],
        })
    }

    fn index(&self) -> Arc<crate::catalog::SearchIndex> {
        Arc::new(crate::catalog::SearchIndex::build(&self.catalog()))
    }

    fn call(
        &self,
        _name: String,
        _arguments: Option<serde_json::Map<String, Value>>,
        _timeout: Duration,
    ) -> Pin<Box<dyn Future<Output = Result<CallToolResult, CallError>> + Send + 'static>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(CallToolResult::structured(json!({"dropped": true}))) })
    }
}

/// A tool of a server that is not ready yet is called once the server is up, whatever
/// its annotations say then: `destructive = "deny"` must not let it through as harmless
/// (it did: an unlisted name counted as not destructive), and `"ask"` must ask.
#[tokio::test]
async fn a_tool_of_a_server_not_ready_is_not_taken_for_harmless() {
    for (mode, asked, reached) in [("deny", 0, 0), ("ask", 1, 1)] {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        theirs.set_nonblocking(true).unwrap();
        let backend = Arc::new(Connecting {
            calls: AtomicU32::new(0),
        });
        let allow = AllowList::new(&["db__*"]).unwrap();
        let session = ProxySession::new(backend.clone(), allow, ProxyLimits::default());
        tokio::spawn(session.clone().serve(UnixStream::from_std(ours).unwrap()));
        let asker = Arc::new(Fixed {
            answer: ElicitationAction::Accept,
            delay: Duration::ZERO,
            asked: Mutex::default(),
        });
        let section: ApprovalSection =
            toml::from_str(&format!("destructive = \"{mode}\"")).unwrap();
        let policy = Arc::new(ApprovalPolicy::from_section(&section).unwrap());
        let gate = Gate::new(
            policy,
            asker.clone(),
            Box::new(|v: &mut Value| v.to_string()),
            None,
        );
        session.set_approval(gate);
        let mut h = Harness {
            session,
            backend: Arc::new(Echo {
                calls: AtomicU32::new(0),
            }),
            sandbox: BufReader::new(UnixStream::from_std(theirs).unwrap()),
            serving: tokio::spawn(async {}),
        };
        let r = h
            .rpc(1, "tools/call", json!({"name": "db__drop_table"}))
            .await;
        let asked_now = asker.asked.lock().unwrap().clone();
        assert_eq!(asked_now.len(), asked, "{mode}: {asked_now:?}");
        assert_eq!(backend.calls.load(Ordering::SeqCst), reached, "{mode}: {r}");
        if mode == "deny" {
            assert_eq!(r["error"]["code"], code::APPROVAL, "{r}");
            let m = r["error"]["message"].as_str().unwrap();
            assert!(m.contains("not listed yet"), "{m}");
        } else {
            assert!(asked_now[0].contains("not listed yet"), "{asked_now:?}");
        }
    }
}
