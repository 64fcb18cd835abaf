use std::time::Duration;

use rmcp::model::{
    CallToolResponse, CallToolResult, ContentBlock, ElicitRequest, ElicitRequestParams,
    InputRequest,
};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::*;
use crate::server::transport::input_route::{InputRoute, RouteError};

fn question() -> InputRequest {
    let params: ElicitRequestParams = serde_json::from_value(serde_json::json!({
        "mode": "form",
        "message": "approve?",
        "requestedSchema": {"type": "object", "properties": {}}
    }))
    .unwrap();
    InputRequest::Elicitation(ElicitRequest::new(params))
}

/// A fake execution: asks once through the route, then answers with what it got.
fn execution(wait: Duration) -> (Driving, CancellationToken) {
    let (result_tx, result_rx) = oneshot::channel();
    let (q_tx, q_rx) = mpsc::channel(1);
    let stop = CancellationToken::new();
    let route = InputRoute::Rounds(q_tx);
    let stopped = stop.clone();
    tokio::spawn(async move {
        let answer = tokio::select! {
            a = route.ask(question(), wait) => a,
            () = stopped.cancelled() => return,
        };
        let text = match answer {
            Ok(v) => format!("answered {v}"),
            Err(e) => format!("no answer: {e}"),
        };
        let _ = result_tx.send(Ok(CallToolResult::success(vec![ContentBlock::text(text)])));
    });
    (Driving::new(result_rx, q_rx, stop.clone()), stop)
}

fn text_of(r: CallToolResponse) -> String {
    match r {
        CallToolResponse::Complete(r) => r.content[0].as_text().unwrap().text.clone(),
        other => panic!("not a result: {other:?}"),
    }
}

fn open(r: CallToolResponse) -> (String, String) {
    match r {
        CallToolResponse::InputRequired(r) => {
            let key = r.input_requests.unwrap().into_keys().next().unwrap();
            (key, r.request_state.unwrap())
        }
        other => panic!("not input_required: {other:?}"),
    }
}

#[tokio::test]
async fn a_question_parks_the_call_and_the_answer_resumes_it() {
    let parked = ParkedCalls::default();
    let wait = Duration::from_secs(10);
    let (driving, _) = execution(wait);
    let first = parked
        .drive(
            "c",
            "execute_python",
            driving,
            wait,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let (key, state) = open(first);
    assert_eq!(state.len(), 32);
    assert_eq!(parked.len(), 1);

    // The state is the client's and the tool's: anything else is unknown.
    for (owner, tool, s) in [
        ("other", "execute_python", state.as_str()),
        ("c", "execute_typescript", state.as_str()),
        ("c", "execute_python", "0000"),
    ] {
        let e = parked.resume(owner, tool, s, None).err().unwrap();
        assert_eq!(e.code, rmcp::model::ErrorCode::INVALID_PARAMS);
    }
    assert_eq!(parked.len(), 1, "a refused resume leaves the call parked");

    // A retry without the answer is asked the same question again, under a new state.
    let driving = parked.resume("c", "execute_python", &state, None).unwrap();
    let again = parked
        .drive(
            "c",
            "execute_python",
            driving,
            wait,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let (key2, state2) = open(again);
    assert_eq!(key, key2);
    assert_ne!(state, state2);
    // The old state was used up.
    assert!(parked.resume("c", "execute_python", &state, None).is_err());

    let mut responses = rmcp::model::InputResponses::new();
    responses.insert(key, serde_json::json!({"action": "accept"}));
    let driving = parked
        .resume("c", "execute_python", &state2, Some(responses))
        .unwrap();
    let done = parked
        .drive(
            "c",
            "execute_python",
            driving,
            wait,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(text_of(done), r#"answered {"action":"accept"}"#);
    assert_eq!(parked.len(), 0);
}

#[tokio::test]
async fn an_unanswered_question_times_out_and_the_call_goes_on() {
    let parked = ParkedCalls::default();
    let wait = Duration::from_millis(200);
    let (driving, _) = execution(wait);
    let (_, state) = open(
        parked
            .drive("c", "t", driving, wait, CancellationToken::new())
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The client comes back late with nothing: the code already went on.
    let driving = parked.resume("c", "t", &state, None).unwrap();
    let done = parked
        .drive("c", "t", driving, wait, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        text_of(done),
        format!("no answer: {}", RouteError::TimedOut(wait))
    );
}

#[tokio::test]
async fn a_call_nobody_comes_back_for_is_dropped_and_its_execution_stopped() {
    let parked = ParkedCalls::default();
    let (driving, stop) = execution(Duration::from_secs(60));
    // A wait of zero: the call is dropped PARK_GRACE after it parked.
    open(
        parked
            .drive("c", "t", driving, Duration::ZERO, CancellationToken::new())
            .await
            .unwrap(),
    );
    assert!(!stop.is_cancelled());
    // Pretend the grace passed: move the deadline back.
    for p in parked.calls.lock().unwrap().values_mut() {
        p.until = Instant::now() - Duration::from_millis(1);
    }
    assert_eq!(parked.len(), 0);
    assert!(
        stop.is_cancelled(),
        "the dropped call's execution was not stopped"
    );
}

#[tokio::test]
async fn a_cancelled_request_stops_the_execution() {
    let parked = ParkedCalls::default();
    let (result_tx, result_rx) = oneshot::channel::<Result<CallToolResult, McpError>>();
    let (_q_tx, q_rx) = mpsc::channel(1);
    let stop = CancellationToken::new();
    let cancel = CancellationToken::new();
    cancel.cancel();
    let answer = parked
        .drive(
            "c",
            "t",
            Driving::new(result_rx, q_rx, stop.clone()),
            Duration::from_secs(1),
            cancel,
        )
        .await;
    assert!(answer.is_err());
    assert!(stop.is_cancelled());
    drop(result_tx);
}

#[tokio::test]
async fn one_client_parks_a_bounded_number_of_calls() {
    let parked = ParkedCalls::default();
    let wait = Duration::from_secs(10);
    let mut stops = Vec::new();
    for _ in 0..(MAX_PARKED_PER_CLIENT + 2) {
        let (driving, stop) = execution(wait);
        stops.push(stop);
        open(
            parked
                .drive("c", "t", driving, wait, CancellationToken::new())
                .await
                .unwrap(),
        );
    }
    assert_eq!(parked.len(), MAX_PARKED_PER_CLIENT);
    assert_eq!(stops.iter().filter(|s| s.is_cancelled()).count(), 2);
}

/// A parked call nobody comes back for is dropped at its time, and its execution
/// stopped, by its own timer: it was only swept when another call parked or resumed, so
/// on a quiet server the sandbox ran on to its own deadline.
#[tokio::test(start_paused = true)]
async fn a_parked_call_is_dropped_at_its_time_without_other_traffic() {
    let parked = ParkedCalls::default();
    let (driving, stop) = execution(Duration::from_secs(3600));
    open(
        parked
            .drive("c", "t", driving, Duration::ZERO, CancellationToken::new())
            .await
            .unwrap(),
    );
    tokio::time::sleep(PARK_GRACE - Duration::from_secs(1)).await;
    assert!(!stop.is_cancelled(), "dropped before its time");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        stop.is_cancelled(),
        "the parked call outlived its time: its execution still runs"
    );
    assert_eq!(parked.calls.lock().unwrap().len(), 0);
}

/// Whatever a client sends back as the answer (`inputResponses` or `tasks/update`), only
/// an elicitation result that accepts with `approve: true` approves: anything else is a
/// failure or a decline, never a panic.
#[tokio::test]
async fn an_answer_of_any_shape_other_than_an_approval_does_not_approve() {
    use crate::approval::message::{read_answer, Answer};
    use crate::approval::Asker;
    use crate::server::transport::input_route::InputAsker;
    let answers = [
        serde_json::json!("yes"),
        serde_json::json!(true),
        serde_json::json!(null),
        serde_json::json!([{"action": "accept", "content": {"approve": true}}]),
        serde_json::json!({"approve": true}),
        serde_json::json!({"action": "ACCEPT", "content": {"approve": true}}),
        serde_json::json!({"action": "accept", "content": "approve"}),
        serde_json::json!({"action": "accept", "content": {"approve": "true"}}),
        serde_json::json!({"action": "accept", "content": {"approve": [true]}}),
        serde_json::json!({"action": "decline", "content": {"approve": true}}),
        serde_json::json!({"action": "cancel", "content": {"approve": true}}),
        serde_json::json!({"action": 1}),
    ];
    for answer in answers {
        let (q_tx, mut q_rx) = mpsc::channel::<crate::server::transport::input_route::Question>(1);
        let sent = answer.clone();
        tokio::spawn(async move {
            if let Some(q) = q_rx.recv().await {
                let _ = q.answer.send(sent);
            }
        });
        let params: ElicitRequestParams = serde_json::from_value(serde_json::json!({
            "mode": "form", "message": "approve?",
            "requestedSchema": {"type": "object", "properties": {}}
        }))
        .unwrap();
        let asked = InputAsker::new(InputRoute::Rounds(q_tx))
            .ask(params, Duration::from_secs(5))
            .await;
        if let Ok(result) = asked {
            assert_ne!(read_answer(&result), Answer::Approved, "{answer} approved");
        }
    }
}

/// A resumed call's timer stops with it: a client that retries without answering, in a
/// loop, leaves no sleeping timer behind for each round (each lived up to the
/// question's wait plus the grace).
#[tokio::test]
async fn a_resumed_call_leaves_no_timer_behind() {
    let parked = ParkedCalls::default();
    let wait = Duration::from_secs(3600);
    let (driving, _stop) = execution(wait);
    let (_, mut state) = open(
        parked
            .drive("c", "t", driving, wait, CancellationToken::new())
            .await
            .unwrap(),
    );
    tokio::task::yield_now().await;
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    for _ in 0..50 {
        let driving = parked.resume("c", "t", &state, None).unwrap();
        state = open(
            parked
                .drive("c", "t", driving, wait, CancellationToken::new())
                .await
                .unwrap(),
        )
        .1;
    }
    tokio::task::yield_now().await;
    assert_eq!(metrics.num_alive_tasks(), before, "timers pile up");
}

/// A replica's requestState names it: a retry that reached another replica is told where
/// its call waits (and resumes nothing there); the owner resumes it as before.
#[tokio::test]
async fn a_replicas_request_state_names_it() {
    use crate::replica::ReplicaName;
    let r1 = ParkedCalls::with_replica(Some(ReplicaName::parse("codebox-1").unwrap()));
    let r2 = ParkedCalls::with_replica(Some(ReplicaName::parse("codebox-2").unwrap()));
    let wait = Duration::from_secs(60);
    let (driving, _stop) = execution(wait);
    let (_, state) = open(
        r1.drive("c", "t", driving, wait, CancellationToken::new())
            .await
            .unwrap(),
    );
    assert!(state.starts_with("codebox-1."), "{state}");
    let elsewhere = r2.resume("c", "t", &state, None).err().expect("not here");
    assert!(
        elsewhere.message.contains("\"codebox-1\"") && elsewhere.message.contains("\"codebox-2\""),
        "{}",
        elsewhere.message
    );
    // A forged prefix of the right replica is just unknown there.
    assert!(r1.resume("c", "t", "codebox-1.00", None).is_err());
    r1.resume("c", "t", &state, None)
        .expect("the owner resumes it");
}
