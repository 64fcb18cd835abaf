//! Executions as tasks (see [`crate::tasks`]): which calls become tasks, the task's
//! operation (the execution with its own cancellation, its output in the task's status,
//! its end told to a stateful client), and `tasks/get`, `tasks/update`, `tasks/cancel`
//! for the calling client.
//!
//! A call becomes a task when tasks are on (`[tasks] enabled`), the tool is
//! `execute_python` or `execute_typescript`, and the request declares the tasks extension
//! (at `initialize` or in its own `_meta`). Everything else is answered as before.
//! Invalid arguments are refused before a task exists (`-32602`), as the synchronous call
//! refuses them.

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, CreateTaskResult, DetailedTask,
    ServerNotification, TaskPayload, TaskStatusNotification, TaskStatusNotificationParams,
};
use rmcp::service::RequestContext;
use rmcp::task_manager::{TaskContext, TaskExit};
use rmcp::{ErrorData as McpError, RoleServer};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::runtime::Language;
use crate::server::transport::input_rounds::Driving;
use crate::server::transport::input_route::{InputRoute, TaskQuestions};
use crate::server::{tool_error, CodeboxServer, ExecuteParams};
use crate::tasks::OutputTail;

/// A notification to the creating client waits at most this long.
const NOTIFY_BOUND: Duration = Duration::from_secs(5);

impl CodeboxServer {
    /// The language when this call should run as a task.
    pub(in crate::server) fn task_language(
        &self,
        request: &CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Option<Language> {
        if !self.state.tasks.settings().enabled {
            return None;
        }
        let language = match request.name.as_ref() {
            "execute_python" => Language::Python,
            "execute_typescript" => Language::TypeScript,
            _ => return None,
        };
        ctx.client_capabilities()
            .is_some_and(|caps| caps.supports_tasks())
            .then_some(language)
    }

    /// The language when this call should run in input rounds (see
    /// [`crate::server::transport::input_rounds`]): a retry carrying a `requestState`, or a call of a
    /// 2026-07-28 client that can elicit when approval gates could ask it something.
    pub(in crate::server) fn rounds_language(
        &self,
        request: &CallToolRequestParams,
        ctx: &RequestContext<RoleServer>,
    ) -> Option<Language> {
        let language = match request.name.as_ref() {
            "execute_python" => Language::Python,
            "execute_typescript" => Language::TypeScript,
            _ => return None,
        };
        if request.request_state.is_some() {
            return Some(language);
        }
        let can_elicit = ctx
            .client_capabilities()
            .is_some_and(|caps| caps.elicitation.is_some());
        // A stateless (2026-07-28) request, by its revision: over HTTP rmcp makes up a
        // peer info for each stateless request, so "no peer info" would miss them all.
        let stateless = crate::server::transport::client_log::is_stateless_request(ctx);
        (stateless && can_elicit && self.asks_for_approval()).then_some(language)
    }

    /// Runs the call detached from its request and answers with its result or its first
    /// question; a retry with a `requestState` resumes the parked call.
    pub(in crate::server) async fn execute_in_rounds(
        &self,
        language: Language,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let client = self.client_of(&ctx);
        let parked = &self.state.parked;
        let driving = match request.request_state.as_deref() {
            Some(state) => parked.resume(&client, &request.name, state, request.input_responses)?,
            None => {
                let arguments = serde_json::Value::Object(request.arguments.unwrap_or_default());
                let params: ExecuteParams = serde_json::from_value(arguments).map_err(|e| {
                    McpError::invalid_params(
                        format!("invalid arguments for {}: {e}", request.name),
                        None,
                    )
                })?;
                let (result_tx, result_rx) = oneshot::channel();
                let (questions_tx, questions_rx) = mpsc::channel(1);
                let mut exec_ctx = ctx.clone();
                exec_ctx.ct = CancellationToken::new();
                exec_ctx.extensions.insert(InputRoute::Rounds(questions_tx));
                let stop = exec_ctx.ct.clone();
                let server = self.clone();
                tokio::spawn(async move {
                    let answer = server.execute(language, params, exec_ctx).await;
                    let _ = result_tx.send(answer);
                });
                Driving::new(result_rx, questions_rx, stop)
            }
        };
        let answer = parked
            .drive(
                &client,
                &request.name,
                driving,
                self.approval_wait(),
                ctx.ct.clone(),
            )
            .await;
        crate::server::tools::render::bounded_answer(answer)
    }

    /// Starts the execution as a task of the calling client and answers with the task.
    pub(in crate::server) fn execute_as_task(
        &self,
        language: Language,
        request: CallToolRequestParams,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let arguments = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let params: ExecuteParams = serde_json::from_value(arguments).map_err(|e| {
            McpError::invalid_params(format!("invalid arguments for {}: {e}", request.name), None)
        })?;
        let client = self.client_of(&ctx);
        let server = self.clone();
        // The request ends with this answer; the execution must not end with it. Its own
        // token is cancelled by tasks/cancel (and the server's stop, inside execute).
        let mut exec_ctx = ctx.clone();
        exec_ctx.ct = CancellationToken::new();
        let stateful_peer = (!crate::server::transport::client_log::is_stateless_request(&ctx))
            .then(|| ctx.peer.clone());
        let owner = client.clone();
        let started = self
            .state
            .tasks
            .start(&client, "waiting to start".into(), move |task| {
                Box::pin(async move {
                    server
                        .run_task(language, params, exec_ctx, task, owner, stateful_peer)
                        .await
                })
            });
        match started {
            Ok(task) => {
                tracing::info!(task = %task.task_id, %client, "execution started as a task");
                Ok(CallToolResponse::Task(CreateTaskResult::new(task)))
            }
            Err(e) => {
                crate::metrics::global()
                    .execution_refused(language, crate::metrics::labels::Refusal::TooManyTasks);
                Ok(CallToolResponse::Complete(tool_error(e.to_string())))
            }
        }
    }

    /// The task's operation: the execution, cancelled when the task is.
    async fn run_task(
        &self,
        language: Language,
        params: ExecuteParams,
        ctx: RequestContext<RoleServer>,
        task: TaskContext,
        client: String,
        stateful_peer: Option<rmcp::Peer<RoleServer>>,
    ) -> Result<CallToolResult, TaskExit> {
        let mut ctx = ctx;
        // The code's questions (approvals) become the task's input requests.
        let withdraw = {
            let state = self.state.clone();
            let id = task.task_id().to_string();
            move |key: &str| state.tasks.withdraw_question(&id, key)
        };
        ctx.extensions.insert(InputRoute::Task(TaskQuestions {
            task: task.clone(),
            withdraw: Arc::new(withdraw),
        }));
        let exec_ct = ctx.ct.clone();
        let cancel_watch = {
            let task = task.clone();
            async move {
                task.cancelled().await;
                exec_ct.cancel();
                // Stay pending: the execution's own end settles the task.
                std::future::pending::<()>().await
            }
        };
        let tail = Arc::new(OutputTail::new(task.clone()));
        let started = std::time::Instant::now();
        task.set_status_message("running");
        let answer = tokio::select! {
            answer = self.execute_with(language, params, ctx, Some(tail)) => answer,
            () = cancel_watch => unreachable!("the cancel watch never ends"),
        };
        let outcome = if task.is_cancel_requested() {
            Err(TaskExit::Cancelled)
        } else {
            match crate::server::tools::render::bounded_answer(
                answer.map(CallToolResponse::Complete),
            ) {
                Ok(CallToolResponse::Complete(result)) => Ok(result),
                Ok(_) => Err(TaskExit::Error(McpError::internal_error(
                    "an execution answered with something other than a result",
                    None,
                ))),
                Err(e) => Err(TaskExit::Error(e)),
            }
        };
        let secs = started.elapsed().as_secs_f64();
        task.set_status_message(match &outcome {
            Ok(r) if r.is_error == Some(true) => format!("ended after {secs:.1} s with an error"),
            Ok(_) => format!("ended after {secs:.1} s"),
            Err(TaskExit::Cancelled) => {
                format!("cancelled after {secs:.1} s; the sandbox was killed")
            }
            Err(TaskExit::Error(e)) => format!("failed after {secs:.1} s: {}", e.message),
        });
        if let Some(peer) = stateful_peer {
            let tasks = &self.state.tasks;
            if let Ok(now) = tasks.get(&client, &tasks.public_id(task.task_id())) {
                notify_end(peer, now, &outcome);
            }
        }
        outcome
    }

    pub(in crate::server) fn tasks_get(
        &self,
        id: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<DetailedTask, McpError> {
        self.state.tasks.get(&self.client_of(ctx), id)
    }

    pub(in crate::server) fn tasks_update(
        &self,
        id: &str,
        responses: impl IntoIterator<Item = (String, serde_json::Value)>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        self.state.tasks.update(&self.client_of(ctx), id, responses)
    }

    pub(in crate::server) fn tasks_cancel(
        &self,
        id: &str,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<(), McpError> {
        let client = self.client_of(ctx);
        let answer = self.state.tasks.cancel(&client, id);
        if answer.is_ok() {
            tracing::info!(task = id, %client, "task cancel asked");
        }
        answer
    }

    /// The caller's tasks, for the `codebox://tasks` resource.
    pub(in crate::server) fn tasks_of(&self, client: &str) -> Vec<DetailedTask> {
        self.state.tasks.list(client)
    }
}

/// Tells a stateful (2025-11-25) client that its task ended, with the result inlined as
/// `tasks/get` will show it. Stateless (2026-07-28) clients poll: rmcp cannot route
/// `notifications/tasks` through `subscriptions/listen` yet.
fn notify_end(
    peer: rmcp::Peer<RoleServer>,
    now: DetailedTask,
    outcome: &Result<CallToolResult, TaskExit>,
) {
    let payload = match outcome {
        Ok(result) => match serde_json::to_value(result) {
            Ok(serde_json::Value::Object(result)) => TaskPayload::Completed { result },
            _ => return,
        },
        Err(TaskExit::Cancelled) => TaskPayload::Cancelled,
        Err(TaskExit::Error(e)) => match serde_json::to_value(e) {
            Ok(serde_json::Value::Object(error)) => TaskPayload::Failed { error },
            _ => return,
        },
    };
    let ended = DetailedTask::new(now.task, payload);
    let note = ServerNotification::TaskStatusNotification(TaskStatusNotification::new(
        TaskStatusNotificationParams::new(ended),
    ));
    tokio::spawn(async move {
        if tokio::time::timeout(NOTIFY_BOUND, peer.send_notification(note))
            .await
            .is_err()
        {
            tracing::debug!("a task's end notification was not taken within the bound");
        }
    });
}

impl CodeboxServer {
    /// Whether any approval gate is configured (a call may have to ask its client).
    fn asks_for_approval(&self) -> bool {
        let s = &self.state.settings;
        s.approval.gates_tools() || s.egress.as_ref().is_some_and(|e| e.policy().gates_hosts())
    }

    /// How long a question to the user waits for its answer.
    fn approval_wait(&self) -> Duration {
        self.state.settings.approval.timeout
    }
}
