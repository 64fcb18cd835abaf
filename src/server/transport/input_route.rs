//! How a running execution asks its 2026-07-28 client something (the user's approval of a
//! gated call): 2026-07-28 is stateless, so the server cannot send the client a request;
//! the question travels in an answer instead.
//!
//! - In a task: the task reads `input_required` with the question in `inputRequests`; the
//!   client answers with `tasks/update` ([`InputRoute::Task`]).
//! - In a plain call: the call is answered with an `input_required` result (SEP-2322) and
//!   the client calls again with `inputResponses` and the `requestState` it got
//!   ([`InputRoute::Rounds`], driven by [`crate::server::transport::input_rounds`]).
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
    Task(TaskQuestions),
    Rounds(mpsc::Sender<Question>),
}

/// A task's way to ask: its context, and how a question nobody waits for any more (its
/// wait ended, the execution ended) is taken back, so the task does not read
/// `input_required` for a question whose answer would go nowhere.
#[derive(Clone)]
pub struct TaskQuestions {
    pub task: TaskContext,
    pub withdraw: std::sync::Arc<dyn Fn(&str) + Send + Sync>,
}

/// Takes a task's open question back when dropped unanswered.
struct Withdraw<'a> {
    questions: &'a TaskQuestions,
    key: Option<String>,
}

impl Drop for Withdraw<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            (self.questions.withdraw)(&key);
        }
    }
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
            InputRoute::Task(questions) => {
                let mut withdraw = Withdraw {
                    questions,
                    key: Some(key.clone()),
                };
                let asked = questions.task.request_input(key, request);
                let answer = tokio::time::timeout(wait, asked).await;
                if matches!(answer, Ok(Ok(_))) {
                    withdraw.key = None;
                }
                drop(withdraw);
                match answer {
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

/// An [`crate::approval::Asker`] for 2026-07-28 clients: the question goes out through
/// the execution's [`InputRoute`] as an `elicitation/create` input request; the client's
/// answer is read as an `ElicitResult` (anything else is a failure, which the gate treats
/// as a refusal).
pub struct InputAsker {
    route: InputRoute,
}

impl InputAsker {
    pub fn new(route: InputRoute) -> InputAsker {
        InputAsker { route }
    }
}

impl crate::approval::Asker for InputAsker {
    fn ask(
        &self,
        request: rmcp::model::ElicitRequestParams,
        wait: Duration,
    ) -> std::pin::Pin<
        Box<
            dyn std::future::Future<
                    Output = Result<rmcp::model::ElicitResult, crate::approval::AskError>,
                > + Send,
        >,
    > {
        use crate::approval::AskError;
        let route = self.route.clone();
        Box::pin(async move {
            let question = InputRequest::Elicitation(rmcp::model::ElicitRequest::new(request));
            match route.ask(question, wait).await {
                Ok(answer) => serde_json::from_value(answer).map_err(|e| {
                    tracing::info!(error = %e, "approval: the client's answer is not an elicitation result");
                    AskError::Failed(format!("the answer is not an elicitation result: {e}"))
                }),
                Err(RouteError::TimedOut(d)) => Err(AskError::TimedOut(d)),
                Err(e @ RouteError::Abandoned(_)) => Err(AskError::Failed(e.to_string())),
            }
        })
    }
}
