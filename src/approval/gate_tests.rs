use std::sync::atomic::AtomicU32;
use std::sync::Mutex;

use rmcp::model::{ElicitResult, ElicitationAction};
use serde_json::json;

use super::*;
use crate::approval::ask::NoAsker;
use crate::approval::policy::ApprovalSection;

/// Answers from a script, counting questions and how many were open at once.
struct Scripted {
    answers: Mutex<Vec<Result<ElicitResult, AskError>>>,
    asked: Mutex<Vec<String>>,
    open: Arc<AtomicU32>,
    most_open: Arc<AtomicU32>,
    delay: Duration,
}

impl Scripted {
    fn new(answers: Vec<Result<ElicitResult, AskError>>, delay: Duration) -> Arc<Scripted> {
        Arc::new(Scripted {
            answers: Mutex::new(answers.into_iter().rev().collect()),
            asked: Mutex::default(),
            open: Arc::default(),
            most_open: Arc::default(),
            delay,
        })
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

impl Asker for Scripted {
    fn ask(
        &self,
        request: ElicitRequestParams,
        _wait: Duration,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<ElicitResult, AskError>> + Send>>
    {
        let ElicitRequestParams::FormElicitationParams { message, .. } = request else {
            panic!("form mode");
        };
        self.asked.lock().unwrap().push(message);
        let answer = self.answers.lock().unwrap().pop().unwrap_or(Ok(approve()));
        let (open, most, delay) = (self.open.clone(), self.most_open.clone(), self.delay);
        Box::pin(async move {
            let now = open.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            open.fetch_sub(1, Ordering::SeqCst);
            answer
        })
    }
}

fn approve() -> ElicitResult {
    ElicitResult::new(ElicitationAction::Accept).with_content(json!({"approve": true}))
}

fn decline() -> ElicitResult {
    ElicitResult::new(ElicitationAction::Decline)
}

fn policy(text: &str) -> Arc<ApprovalPolicy> {
    let s: ApprovalSection = toml::from_str(text).unwrap();
    Arc::new(ApprovalPolicy::from_section(&s).unwrap())
}

type Seen = Arc<Mutex<Vec<Decided>>>;

fn gate(policy: Arc<ApprovalPolicy>, asker: Arc<dyn Asker>) -> (Arc<Gate>, Seen) {
    let seen: Seen = Arc::default();
    let s = seen.clone();
    let gate = Gate::new(
        policy,
        asker,
        Box::new(|v: &mut Value| serde_json::to_string(v).unwrap()),
        Some(Arc::new(move |d: &Decided| {
            s.lock().unwrap().push(d.clone())
        })),
    );
    (gate, seen)
}

fn decisions(seen: &Seen) -> Vec<&'static str> {
    seen.lock()
        .unwrap()
        .iter()
        .map(|d| d.decision.as_str())
        .collect()
}

fn args(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

const DELETE: &str = r#"require_approval = ["gh__delete_*"]"#;

#[tokio::test]
async fn an_ungated_call_is_not_asked_about() {
    let asker = Scripted::new(vec![], Duration::ZERO);
    let (g, seen) = gate(policy(DELETE), asker.clone());
    assert_eq!(g.tool("gh__list", None, Some(false), None).await, Ok(()));
    assert!(asker.asked().is_empty());
    assert!(decisions(&seen).is_empty());
}

#[tokio::test]
async fn accepted_and_declined_with_the_reason_and_the_record() {
    let asker = Scripted::new(vec![Ok(approve()), Ok(decline())], Duration::ZERO);
    let (g, seen) = gate(policy(DELETE), asker.clone());
    let a = args(json!({"repo": "a"}));
    assert_eq!(
        g.tool(
            "gh__delete_repo",
            Some(("gh", "delete_repo")),
            Some(false),
            Some(&a)
        )
        .await,
        Ok(())
    );
    let b = args(json!({"repo": "b"}));
    let e = g
        .tool(
            "gh__delete_repo",
            Some(("gh", "delete_repo")),
            Some(false),
            Some(&b),
        )
        .await
        .unwrap_err();
    assert_eq!(e, "approval declined by the user for gh__delete_repo");
    let asked = asker.asked();
    assert!(asked[0].contains(r#"{"repo":"a"}"#), "{}", asked[0]);
    assert!(asked[1].contains(r#"{"repo":"b"}"#), "{}", asked[1]);
    assert_eq!(decisions(&seen), ["accepted", "declined"]);
    let d = &seen.lock().unwrap()[1];
    assert_eq!(d.subject, Subject::Tool("gh__delete_repo".into()));
    assert!(d.rule.contains("gh__delete_*"), "{}", d.rule);
}

#[tokio::test]
async fn a_declined_question_is_not_asked_again_but_other_arguments_are() {
    let asker = Scripted::new(vec![Ok(decline())], Duration::ZERO);
    let (g, seen) = gate(policy(DELETE), asker.clone());
    let a = args(json!({"repo": "a", "force": true}));
    // The same arguments in another key order are the same request.
    let a2 = args(json!({"force": true, "repo": "a"}));
    assert!(g
        .tool("gh__delete_repo", None, Some(false), Some(&a))
        .await
        .is_err());
    for _ in 0..5 {
        let e = g
            .tool("gh__delete_repo", None, Some(false), Some(&a2))
            .await
            .unwrap_err();
        assert!(e.contains("earlier in this execution"), "{e}");
    }
    assert_eq!(asker.asked().len(), 1);
    let other = args(json!({"repo": "b"}));
    assert_eq!(
        g.tool("gh__delete_repo", None, Some(false), Some(&other))
            .await,
        Ok(())
    );
    assert_eq!(asker.asked().len(), 2);
    assert_eq!(
        decisions(&seen),
        [
            "declined",
            "already_declined",
            "already_declined",
            "already_declined",
            "already_declined",
            "already_declined",
            "accepted"
        ]
    );
}

#[tokio::test]
async fn an_accept_without_approve_true_and_a_cancel_are_denials() {
    let odd = ElicitResult::new(ElicitationAction::Accept).with_content(json!({"approve": "yes"}));
    let asker = Scripted::new(
        vec![Ok(odd), Ok(ElicitResult::new(ElicitationAction::Cancel))],
        Duration::ZERO,
    );
    let (g, seen) = gate(policy(DELETE), asker);
    let e = g
        .tool("gh__delete_a", None, Some(false), None)
        .await
        .unwrap_err();
    assert!(
        e.starts_with("approval declined by the user for gh__delete_a"),
        "{e}"
    );
    let e = g
        .tool("gh__delete_b", None, Some(false), None)
        .await
        .unwrap_err();
    assert_eq!(e, "approval cancelled by the user for gh__delete_b");
    assert_eq!(decisions(&seen), ["declined", "cancelled"]);
}

#[tokio::test(start_paused = true)]
async fn no_answer_within_the_timeout_is_a_denial() {
    let asker = Scripted::new(vec![], Duration::from_secs(3600));
    let (g, seen) = gate(policy(&format!("{DELETE}\ntimeout = \"120s\"")), asker);
    let e = g
        .tool("gh__delete_repo", None, Some(false), None)
        .await
        .unwrap_err();
    assert_eq!(e, "approval for gh__delete_repo timed out after 120 s");
    assert_eq!(decisions(&seen), ["timed_out"]);
    let waited = seen.lock().unwrap()[0].waited;
    assert!(waited >= Duration::from_secs(120), "{waited:?}");
}

#[tokio::test]
async fn a_client_that_cannot_ask_gets_the_fallback() {
    let no = Arc::new(NoAsker::new("no elicitation capability"));
    let (g, seen) = gate(policy(DELETE), no.clone());
    let e = g
        .tool("gh__delete_repo", None, Some(false), None)
        .await
        .unwrap_err();
    assert_eq!(
        e,
        "gh__delete_repo needs approval (require_approval rule \"gh__delete_*\"), but the client cannot ask the user (no elicitation capability); approval fallback is deny"
    );
    let (g, seen_allow) = gate(policy(&format!("{DELETE}\nfallback = \"allow\"")), no);
    assert_eq!(
        g.tool("gh__delete_repo", None, Some(false), None).await,
        Ok(())
    );
    assert_eq!(decisions(&seen), ["fallback_denied"]);
    assert_eq!(decisions(&seen_allow), ["fallback_allowed"]);
}

#[tokio::test]
async fn past_max_questions_calls_are_denied_without_asking() {
    let asker = Scripted::new(vec![], Duration::ZERO);
    let (g, seen) = gate(
        policy(&format!("{DELETE}\nmax_questions = 2")),
        asker.clone(),
    );
    for i in 0..2 {
        let a = args(json!({"i": i}));
        assert_eq!(
            g.tool("gh__delete_x", None, Some(false), Some(&a)).await,
            Ok(())
        );
    }
    let a = args(json!({"i": 3}));
    let e = g
        .tool("gh__delete_x", None, Some(false), Some(&a))
        .await
        .unwrap_err();
    assert!(
        e.contains("already asked the user 2 questions (approval max_questions)"),
        "{e}"
    );
    assert_eq!(asker.asked().len(), 2);
    assert_eq!(
        decisions(&seen),
        ["accepted", "accepted", "too_many_questions"]
    );
}

#[tokio::test(start_paused = true)]
async fn questions_take_turns() {
    let asker = Scripted::new(vec![], Duration::from_secs(1));
    let (g, _) = gate(policy(DELETE), asker.clone());
    let mut calls = tokio::task::JoinSet::new();
    for i in 0..8 {
        let g = g.clone();
        calls.spawn(async move {
            let a = args(json!({"i": i}));
            g.tool("gh__delete_x", None, Some(false), Some(&a)).await
        });
    }
    let mut ok = 0;
    while let Some(r) = calls.join_next().await {
        match r.unwrap() {
            Ok(()) => ok += 1,
            Err(e) => assert!(e.contains("max_questions"), "{e}"),
        }
    }
    assert_eq!(ok, 8);
    assert_eq!(asker.most_open.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_ended_execution_abandons_its_question() {
    let asker = Scripted::new(vec![], Duration::from_secs(3600));
    let (g, seen) = gate(policy(DELETE), asker);
    let pending = {
        let g = g.clone();
        tokio::spawn(async move { g.tool("gh__delete_repo", None, Some(false), None).await })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    drop(g.abandon_on_drop());
    let e = pending.await.unwrap().unwrap_err();
    assert!(e.contains("abandoned"), "{e}");
    // Later questions are not asked either.
    let e = g
        .tool("gh__delete_other", None, Some(false), None)
        .await
        .unwrap_err();
    assert!(e.contains("abandoned"), "{e}");
    assert_eq!(decisions(&seen), ["abandoned", "abandoned"]);
}

#[tokio::test]
async fn destructive_deny_refuses_and_ask_asks() {
    let asker = Scripted::new(vec![], Duration::ZERO);
    let (g, seen) = gate(policy(r#"destructive = "deny""#), asker.clone());
    let e = g
        .tool(
            "db__drop_table",
            Some(("db", "drop_table")),
            Some(true),
            None,
        )
        .await
        .unwrap_err();
    assert!(
        e.starts_with("db__drop_table is refused: the tool is annotated destructiveHint: true"),
        "{e}"
    );
    assert_eq!(g.tool("db__read", None, Some(false), None).await, Ok(()));
    assert!(asker.asked().is_empty());
    assert_eq!(decisions(&seen), ["policy_denied"]);
    let (g, _) = gate(policy(r#"destructive = "ask""#), asker.clone());
    assert_eq!(
        g.tool(
            "db__drop_table",
            Some(("db", "drop_table")),
            Some(true),
            None
        )
        .await,
        Ok(())
    );
    assert!(
        asker.asked()[0].contains("destructiveHint"),
        "{:?}",
        asker.asked()
    );
}

#[tokio::test]
async fn a_host_approved_once_is_approved_for_the_execution() {
    let asker = Scripted::new(vec![Ok(approve()), Ok(decline())], Duration::ZERO);
    let (g, seen) = gate(policy(""), asker.clone());
    assert_eq!(
        g.host("api.example.com:443", "api.example.com").await,
        Ok(())
    );
    assert_eq!(
        g.host("api.example.com:443", "api.example.com").await,
        Ok(())
    );
    let e = g
        .host("b.example.com:443", "*.example.com")
        .await
        .unwrap_err();
    assert_eq!(
        e,
        "approval declined by the user for egress to b.example.com:443"
    );
    let e = g
        .host("b.example.com:443", "*.example.com")
        .await
        .unwrap_err();
    assert!(e.contains("not asked again"), "{e}");
    assert_eq!(asker.asked().len(), 2);
    assert!(asker.asked()[0].contains("[network] approve rule \"api.example.com\""));
    assert_eq!(
        decisions(&seen),
        ["accepted", "declined", "already_declined"]
    );
    assert_eq!(seen.lock().unwrap()[0].subject.kind(), "egress");
}

#[tokio::test]
async fn the_summary_is_what_the_glue_makes_of_the_arguments() {
    let asker = Scripted::new(vec![], Duration::ZERO);
    let g = Gate::new(
        policy(DELETE),
        asker.clone(),
        Box::new(|v: &mut Value| {
            v["to"] = json!("[EMAIL_1]");
            serde_json::to_string(v).unwrap()
        }),
        None,
    );
    let a = args(json!({"to": "alice@example.com"}));
    assert_eq!(
        g.tool("gh__delete_x", None, Some(false), Some(&a)).await,
        Ok(())
    );
    let asked = asker.asked();
    assert!(asked[0].contains("[EMAIL_1]"), "{}", asked[0]);
    assert!(!asked[0].contains("alice@"), "{}", asked[0]);
}

#[tokio::test]
async fn records_are_bounded_per_execution() {
    let no = Arc::new(NoAsker::new("none"));
    let (g, seen) = gate(policy(DELETE), no);
    for _ in 0..(MAX_RECORDS + 50) {
        let _ = g.tool("gh__delete_x", None, Some(false), None).await;
    }
    assert_eq!(seen.lock().unwrap().len(), MAX_RECORDS);
}

#[tokio::test(start_paused = true)]
async fn a_question_whose_call_is_dropped_is_reported_abandoned() {
    let asker = Scripted::new(vec![], Duration::from_secs(3600));
    let (g, seen) = gate(policy(DELETE), asker);
    let pending = {
        let g = g.clone();
        tokio::spawn(async move { g.tool("gh__delete_repo", None, Some(false), None).await })
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    // What the proxy does to its calls when the sandbox is gone.
    pending.abort();
    assert!(pending.await.unwrap_err().is_cancelled());
    assert_eq!(decisions(&seen), ["abandoned"]);
    assert!(seen.lock().unwrap()[0].waited >= Duration::from_secs(5));
}
