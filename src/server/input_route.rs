//! How a running execution asks its 2026-07-28 client something (the user's approval of a
//! gated call): 2026-07-28 is stateless, so the server cannot send the client a request;
//! the question travels in an answer instead.
//!
//! - In a task: the task reads `input_required` with the question in `inputRequests`; the
//!   client answers with `tasks/update` ([`InputRoute::Task`]).
//! - In a plain call: the call is answered with an `input_required` result (SEP-2322) and
//!   the client calls again with `inputResponses` and the `requestState` it got
//!   ([`InputRoute::Rounds`], driven by [`super::input_rounds`]).
//!
//! The route travels with the execution in its request context's extensions, where the
//! execution's asker is chosen.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rmcp::model::InputRequest;
use rmcp::task_manager::{TaskContext, TaskExit};
use tokio::sync::{mpsc, oneshot};

/// One question of a running execution, and where its answer goes.
pub struct Question {
    pub request: InputRequest,
    pub answer: oneshot::Sender<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    #[error("no answer within {} s", .0.as_secs())]
    TimedOut(Duration),
    /// The task was cancelled, or the call was abandoned, while the question was open.
    #[error("the question was abandoned: {0}")]
    Abandoned(&'static str),
}

#[derive(Clone)]
pub enum InputRoute {
    Task(TaskContext),
    Rounds(mpsc::Sender<Question>),
}

/// Keys of input requests, unique for the process (a task wants them unique for its life).
static NEXT_KEY: AtomicU64 = AtomicU64::new(1);

impl InputRoute {
    /// Asks and waits at most `wait` for the answer (the client's result for the request,
    /// e.g. an `ElicitResult` as JSON).
    pub async fn ask(
        &self,
        request: InputRequest,
        wait: Duration,
    ) -> Result<serde_json::Value, RouteError> {
        let key = format!("codebox-{}", NEXT_KEY.fetch_add(1, Ordering::Relaxed));
        match self {
            InputRoute::Task(task) => {
                match tokio::time::timeout(wait, task.request_input(key, request)).await {
                    Err(_) => Err(RouteError::TimedOut(wait)),
                    Ok(Ok(answer)) => Ok(answer),
                    Ok(Err(TaskExit::Cancelled)) => Err(RouteError::Abandoned("task cancelled")),
                    Ok(Err(TaskExit::Error(e))) => {
                        tracing::warn!(error = %e.message, "a task's question could not be asked");
                        Err(RouteError::Abandoned("the task ended"))
                    }
                }
            }
            InputRoute::Rounds(questions) => {
                let (tx, rx) = oneshot::channel();
                let asked = async {
                    questions
                        .send(Question {
                            request,
                            answer: tx,
                        })
                        .await
                        .map_err(|_| RouteError::Abandoned("the call was abandoned"))?;
                    rx.await
                        .map_err(|_| RouteError::Abandoned("the call was abandoned"))
                };
                tokio::time::timeout(wait, asked)
                    .await
                    .unwrap_or(Err(RouteError::TimedOut(wait)))
            }
        }
    }
}
