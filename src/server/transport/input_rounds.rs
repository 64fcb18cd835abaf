//! Input rounds (SEP-2322 multi-round-trip requests) for executions of 2026-07-28 clients
//! that can elicit but do not use tasks.
//!
//! Such an execution runs detached from its request. The request waits for whichever
//! comes first: the result (answered as usual) or a question (see [`InputRoute`]). On a
//! question the call is answered `input_required` with the question and a `requestState`:
//! an unguessable id of the parked call, which belongs to the client that made it and to
//! that tool. The client calls the tool again with the state and its `inputResponses`;
//! the answer goes to the waiting code and the call waits again. A call whose question is
//! not answered in time goes on (the code gets the asker's timeout); a parked call nobody
//! comes back for is dropped — its sandbox killed — once [`PARK_GRACE`] past its
//! question's wait. A retry whose state is unknown, expired, another client's or another
//! tool's is refused with `-32602`; one without the answer is asked the same question
//! again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use rmcp::model::{
    CallToolResponse, CallToolResult, InputRequest, InputRequests, InputRequiredResult,
    InputResponses,
};
use rmcp::ErrorData as McpError;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::server::transport::input_route::Question;

/// A parked call is dropped this long after its question's wait ended.
pub const PARK_GRACE: Duration = Duration::from_secs(30);

/// Calls one client may have parked at once; the oldest goes when a new one comes.
const MAX_PARKED_PER_CLIENT: usize = 16;

/// A call in progress between its rounds.
pub struct Driving {
    result: oneshot::Receiver<Result<CallToolResult, McpError>>,
    questions: mpsc::Receiver<Question>,
    /// The open question: its key, the request, where the answer goes.
    open: Option<(String, InputRequest, oneshot::Sender<serde_json::Value>)>,
    /// Kills the execution when the call is dropped (parked too long, or its request
    /// went away while it was not parked).
    _kill: DropGuard,
}

impl Driving {
    /// A call whose execution sends its result on the other end of `result`, its
    /// questions on the other end of `questions`, and stops when `execution` is
    /// cancelled.
    pub fn new(
        result: oneshot::Receiver<Result<CallToolResult, McpError>>,
        questions: mpsc::Receiver<Question>,
        execution: CancellationToken,
    ) -> Driving {
        Driving {
            result,
            questions,
            open: None,
            _kill: execution.drop_guard(),
        }
    }
}

struct Parked {
    owner: String,
    tool: String,
    driving: Driving,
    until: Instant,
    /// The timer that drops the call at `until`, stopped when the call leaves the map
    /// first (resumed, or evicted): a client retrying in a loop leaves no timers behind.
    _timer: Option<Timer>,
}

struct Timer(tokio::task::AbortHandle);

impl Drop for Timer {
    fn drop(&mut self) {
        self.0.abort();
    }
}

type Calls = Mutex<HashMap<String, Parked>>;

/// The parked calls of every client. Each parked call has a timer that drops it at its
/// time, so a call nobody comes back for has its sandbox killed then even when no other
/// call parks or resumes.
#[derive(Default)]
pub struct ParkedCalls {
    calls: Arc<Calls>,
    /// This process's name among replicas: every `requestState` starts with it, so a
    /// retry that reached another replica is told where its call waits.
    replica: Option<crate::replica::ReplicaName>,
}

impl ParkedCalls {
    pub fn with_replica(replica: Option<crate::replica::ReplicaName>) -> ParkedCalls {
        ParkedCalls {
            calls: Arc::default(),
            replica,
        }
    }

    /// Waits for the call's next step: its result, or a question, upon which it is parked
    /// and answered `input_required`. `cancelled` ends the wait (the request's own cancel)
    /// and with it the execution.
    pub async fn drive(
        &self,
        owner: &str,
        tool: &str,
        mut driving: Driving,
        wait: Duration,
        cancelled: CancellationToken,
    ) -> Result<CallToolResponse, McpError> {
        // A question the code stopped waiting for (its wait ended) is not asked again.
        if driving
            .open
            .as_ref()
            .is_some_and(|(_, _, tx)| tx.is_closed())
        {
            driving.open = None;
        }
        if driving.open.is_none() {
            tokio::select! {
                result = &mut driving.result => {
                    return match result {
                        Ok(answer) => answer.map(CallToolResponse::Complete),
                        Err(_) => Err(McpError::internal_error("the execution ended without an answer", None)),
                    };
                }
                question = driving.questions.recv() => {
                    let Some(q) = question else {
                        // The execution dropped its route: only its result can come.
                        return match (&mut driving.result).await {
                            Ok(answer) => answer.map(CallToolResponse::Complete),
                            Err(_) => Err(McpError::internal_error("the execution ended without an answer", None)),
                        };
                    };
                    let key = format!("q{}", rand_hex(4));
                    driving.open = Some((key, q.request, q.answer));
                }
                () = cancelled.cancelled() => {
                    return Err(McpError::internal_error("the call was cancelled", None));
                }
            }
        }
        let (key, request, _) = driving.open.as_ref().expect("an open question");
        let mut requests = InputRequests::new();
        requests.insert(key.clone(), request.clone());
        let state = match &self.replica {
            Some(replica) => replica.qualify(&rand_hex(16)),
            None => rand_hex(16),
        };
        self.park(
            state.clone(),
            Parked {
                owner: owner.to_string(),
                tool: tool.to_string(),
                driving,
                until: Instant::now() + wait + PARK_GRACE,
                _timer: None,
            },
        );
        Ok(CallToolResponse::InputRequired(InputRequiredResult::new(
            Some(requests),
            Some(state),
        )))
    }

    /// The call parked under `state` for `owner` and `tool`, with `responses` delivered:
    /// `Err` when there is no such call.
    pub fn resume(
        &self,
        owner: &str,
        tool: &str,
        state: &str,
        responses: Option<InputResponses>,
    ) -> Result<Driving, McpError> {
        use crate::replica::{elsewhere_message, placement, Placement};
        if let (Some(here), Placement::Elsewhere { owner: made_by }) =
            (&self.replica, placement(self.replica.as_ref(), state))
        {
            tracing::info!(made_by, "a requestState another replica made");
            return Err(McpError::invalid_params(
                elsewhere_message("the call parked under requestState", state, made_by, here),
                None,
            ));
        }
        let parked = {
            let mut calls = self.calls.lock().expect("parked calls lock");
            Self::sweep(&mut calls);
            match calls.get(state) {
                Some(p) if p.owner == owner && p.tool == tool => calls.remove(state),
                Some(_) => {
                    tracing::warn!(
                        "a requestState was presented by another client or for another tool"
                    );
                    None
                }
                None => None,
            }
        };
        let Some(mut parked) = parked else {
            return Err(McpError::invalid_params(
                "unknown or expired requestState: call the tool again without it",
                None,
            ));
        };
        let answered = match (&parked.driving.open, responses) {
            (Some((key, _, _)), Some(mut responses)) => responses.remove(key),
            _ => None,
        };
        if let Some(answer) = answered {
            if let Some((_, _, tx)) = parked.driving.open.take() {
                // The code may have stopped waiting (its wait ended); then nobody reads it.
                let _ = tx.send(answer);
            }
        }
        Ok(parked.driving)
    }

    fn park(&self, state: String, mut parked: Parked) {
        parked._timer = Self::drop_at(Arc::downgrade(&self.calls), parked.until);
        let mut calls = self.calls.lock().expect("parked calls lock");
        Self::sweep(&mut calls);
        let owner = parked.owner.clone();
        let mine: Vec<(String, Instant)> = calls
            .iter()
            .filter(|(_, p)| p.owner == owner)
            .map(|(s, p)| (s.clone(), p.until))
            .collect();
        if mine.len() >= MAX_PARKED_PER_CLIENT {
            if let Some((oldest, _)) = mine.iter().min_by_key(|(_, until)| *until) {
                tracing::info!("a client's oldest parked call was dropped for a new one");
                calls.remove(oldest);
            }
        }
        calls.insert(state, parked);
    }

    /// Sweeps the calls at `until` (the time of a call just parked).
    fn drop_at(calls: Weak<Calls>, until: Instant) -> Option<Timer> {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let timer = runtime.spawn(async move {
            tokio::time::sleep_until(until).await;
            if let Some(calls) = calls.upgrade() {
                let mut calls = calls.lock().expect("parked calls lock");
                Self::sweep(&mut calls);
            }
        });
        Some(Timer(timer.abort_handle()))
    }

    /// Drops the calls past their time; each drop kills its execution.
    fn sweep(calls: &mut HashMap<String, Parked>) {
        let now = Instant::now();
        calls.retain(|_, p| p.until > now);
    }

    /// Calls parked now.
    pub fn len(&self) -> usize {
        let mut calls = self.calls.lock().expect("parked calls lock");
        Self::sweep(&mut calls);
        calls.len()
    }
}

/// `n` random bytes as hex.
fn rand_hex(n: usize) -> String {
    let mut raw = vec![0u8; n];
    getrandom::fill(&mut raw).expect("the kernel's random source");
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests;
