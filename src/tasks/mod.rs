//! Executions as tasks of the MCP Tasks extension (`io.modelcontextprotocol/tasks`,
//! SEP-2663), for clients that declare it.
//!
//! A client that declares the extension (at `initialize`, or per request in `_meta`) and
//! calls `execute_python` / `execute_typescript` gets a task at once (`resultType:
//! "task"`) and polls `tasks/get`: `working` with the output so far in `statusMessage`,
//! `input_required` while the code waits for the user's approval (answered with
//! `tasks/update`), then `completed` with the execution's result inlined (a program that
//! failed is still `completed`, with `isError`), `failed` with a JSON-RPC error, or
//! `cancelled`. `tasks/cancel` kills the sandbox. Clients that do not declare it get
//! today's synchronous answer.
//!
//! rmcp's [`TaskManager`] runs the operations and keeps their states; this module adds
//! what a multi-client server needs on top: every task belongs to the client that
//! created it (another client's `tasks/get`, `tasks/update` or `tasks/cancel` gets the
//! answer an unknown id gets, so ids cannot be probed), a bound on the tasks one client
//! holds, and the lifetime from `[tasks]`.
//!
//! A replica (see [`crate::replica`]) hands out task ids `<replica>.<uuid>`: a task
//! lives in one process, and a 2026-07-28 client's `tasks/get` carries its id in the
//! `Mcp-Name` header, so a balancer can send the poll to the replica that holds it.
//! rmcp's manager keeps the bare UUID; the name is added on the way out and checked
//! (and taken off) on the way in. Another replica's id gets an error naming both.

pub mod config;
mod output_tail;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rmcp::model::{DetailedTask, Task};
use rmcp::task_manager::{TaskContext, TaskFuture, TaskManager, TaskOptions};
use rmcp::ErrorData as McpError;

use crate::replica::ReplicaName;

pub use config::{TaskSettings, TasksSection};
pub use output_tail::OutputTail;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error(
        "this client holds {held} tasks, the most one client may hold (tasks.max_per_client); \
         cancel some or wait until their results expire"
    )]
    TooMany { held: usize },
}

/// Who created a task, and when.
struct Owner {
    client: String,
    created: Instant,
}

/// The server's tasks; one per process, shared by every connection.
pub struct ExecutionTasks {
    manager: TaskManager,
    /// Keyed by rmcp's (bare) task id.
    owners: Mutex<HashMap<String, Owner>>,
    settings: TaskSettings,
    /// This replica's name, in front of every task id a client sees (`None`: one server).
    replica: Option<ReplicaName>,
}

impl ExecutionTasks {
    pub fn new(settings: TaskSettings) -> ExecutionTasks {
        ExecutionTasks {
            manager: TaskManager::new(),
            owners: Mutex::new(HashMap::new()),
            settings,
            replica: None,
        }
    }

    /// Names this process a replica: task ids start with `replica.`.
    pub fn with_replica(mut self, replica: Option<ReplicaName>) -> ExecutionTasks {
        self.replica = replica;
        self
    }

    /// The id a client sees for rmcp's task `internal`.
    pub fn public_id(&self, internal: &str) -> String {
        match &self.replica {
            Some(replica) => replica.qualify(internal),
            None => internal.to_string(),
        }
    }

    /// rmcp's id of the task a client names; another replica's id is refused with a
    /// message naming both, any other foreign id as unknown.
    fn internal_id<'a>(&self, public: &'a str) -> Result<&'a str, McpError> {
        use crate::replica::{elsewhere_message, placement, Placement};
        match (&self.replica, placement(self.replica.as_ref(), public)) {
            (None, Placement::Here) => Ok(public),
            (Some(_), Placement::Here) => Ok(public
                .split_once('.')
                .map_or(public, |(_, internal)| internal)),
            (Some(here), Placement::Elsewhere { owner }) => {
                tracing::info!(task = %unknown_shown(public), owner, "a task another replica made");
                Err(McpError::invalid_params(
                    elsewhere_message("task", &unknown_shown(public), owner, here),
                    None,
                ))
            }
            _ => Err(unknown_task(public)),
        }
    }

    /// `task` as a client sees it.
    fn published(&self, mut task: DetailedTask) -> DetailedTask {
        task.task.task_id = self.public_id(&task.task.task_id);
        task
    }

    pub fn settings(&self) -> TaskSettings {
        self.settings
    }

    /// Starts `operation` as a task of `client`; the task can be read with `tasks/get`
    /// before this returns.
    pub fn start<F>(&self, client: &str, status: String, operation: F) -> Result<Task, Error>
    where
        F: FnOnce(TaskContext) -> TaskFuture,
    {
        let mut owners = self.owners.lock().expect("task owners lock");
        self.forget_gone(&mut owners);
        let held = owners.values().filter(|o| o.client == client).count();
        if held >= self.settings.max_per_client {
            tracing::info!(held, "a client at its task bound was refused a new task");
            return Err(Error::TooMany { held });
        }
        let options = TaskOptions::new()
            .with_ttl_ms(self.settings.keep_for.as_millis() as u64)
            .with_poll_interval_ms(self.settings.poll_interval.as_millis() as u64)
            .with_status_message(status);
        let task = self.manager.spawn(options, operation);
        owners.insert(
            task.task_id.clone(),
            Owner {
                client: client.to_string(),
                created: Instant::now(),
            },
        );
        let mut task = task;
        task.task_id = self.public_id(&task.task_id);
        Ok(task)
    }

    /// `tasks/get` for `client`.
    pub fn get(&self, client: &str, id: &str) -> Result<DetailedTask, McpError> {
        let id = self.internal_id(id)?;
        self.owned(client, id)?;
        self.manager.get_task(id).map(|t| self.published(t))
    }

    /// `tasks/update` for `client`: answers to the task's input requests.
    pub fn update(
        &self,
        client: &str,
        id: &str,
        responses: impl IntoIterator<Item = (String, serde_json::Value)>,
    ) -> Result<(), McpError> {
        let id = self.internal_id(id)?;
        self.owned(client, id)?;
        self.manager.update_task(id, responses)
    }

    /// `tasks/cancel` for `client`: the execution is told to stop (its sandbox is killed);
    /// the task reads `cancelled` once it has.
    pub fn cancel(&self, client: &str, id: &str) -> Result<(), McpError> {
        let id = self.internal_id(id)?;
        self.owned(client, id)?;
        self.manager.cancel_task(id)
    }

    /// Takes back the task's open question `key` (nobody waits for its answer now):
    /// the task leaves `input_required` unless other questions are open. `id` is
    /// rmcp's (the operation's [`TaskContext::task_id`]).
    pub fn withdraw_question(&self, id: &str, key: &str) {
        let _ = self
            .manager
            .update_task(id, [(key.to_string(), serde_json::Value::Null)]);
    }

    /// The client's tasks, newest first.
    pub fn list(&self, client: &str) -> Vec<DetailedTask> {
        let ids: Vec<(String, Instant)> = {
            let owners = self.owners.lock().expect("task owners lock");
            owners
                .iter()
                .filter(|(_, o)| o.client == client)
                .map(|(id, o)| (id.clone(), o.created))
                .collect()
        };
        let mut tasks: Vec<(Instant, DetailedTask)> = ids
            .into_iter()
            .filter_map(|(id, created)| {
                Some((created, self.published(self.manager.get_task(&id).ok()?)))
            })
            .collect();
        tasks.sort_by_key(|t| std::cmp::Reverse(t.0));
        tasks.into_iter().map(|(_, t)| t).collect()
    }

    /// Tasks whose operation still runs.
    pub fn running(&self) -> usize {
        self.manager.running_task_count()
    }

    /// Ends every task's operation (the server is stopping).
    pub fn shutdown(&self) {
        self.manager.shutdown();
        self.owners.lock().expect("task owners lock").clear();
    }

    /// The id is a task of `client`; anything else is answered as an unknown id is
    /// (`-32602`, rmcp's words), so one client cannot learn another's task ids.
    fn owned(&self, client: &str, id: &str) -> Result<(), McpError> {
        let owners = self.owners.lock().expect("task owners lock");
        match owners.get(id) {
            Some(owner) if owner.client == client => Ok(()),
            Some(_) => {
                tracing::warn!(
                    task = id,
                    "a client asked for another client's task; answered as unknown"
                );
                Err(unknown_task(id))
            }
            None => Err(unknown_task(id)),
        }
    }

    /// Drops the owners of tasks the manager no longer has. It keeps a task at most two
    /// lifetimes (a running task ends at one, a finished one is kept one more), so older
    /// entries go without asking it; younger ones are asked.
    fn forget_gone(&self, owners: &mut HashMap<String, Owner>) {
        let horizon = self.settings.keep_for * 2 + Duration::from_secs(60);
        owners.retain(|id, o| o.created.elapsed() < horizon && self.manager.get_task(id).is_ok());
    }
}

fn unknown_task(id: &str) -> McpError {
    McpError::invalid_params(format!("unknown task: {}", unknown_shown(id)), None)
}

/// A client's task id as errors and logs quote it: at most 80 characters.
fn unknown_shown(id: &str) -> String {
    id.chars().take(80).collect()
}

#[cfg(test)]
mod tests;
