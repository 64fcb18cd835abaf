use std::time::Duration;

use rmcp::model::{CallToolResult, ContentBlock, TaskStatus};
use rmcp::task_manager::{TaskContext, TaskExit, TaskFuture};

use super::*;

fn settings(max_per_client: usize) -> TaskSettings {
    TaskSettings {
        max_per_client,
        ..TaskSettings::default()
    }
}

fn quick(text: &'static str) -> impl FnOnce(TaskContext) -> TaskFuture {
    move |_| Box::pin(async move { Ok(CallToolResult::success(vec![ContentBlock::text(text)])) })
}

/// Runs until cancelled, then settles as cancelled.
fn until_cancelled() -> impl FnOnce(TaskContext) -> TaskFuture {
    |ctx| {
        Box::pin(async move {
            ctx.cancelled().await;
            Err(TaskExit::Cancelled)
        })
    }
}

async fn settled(tasks: &ExecutionTasks, client: &str, id: &str) -> DetailedTask {
    for _ in 0..200 {
        let t = tasks.get(client, id).unwrap();
        if t.status().is_terminal() {
            return t;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("task {id} did not settle");
}

#[tokio::test]
async fn a_task_belongs_to_its_client() {
    let tasks = ExecutionTasks::new(settings(8));
    let task = tasks
        .start("token:alice", "queued".into(), quick("hi"))
        .unwrap();
    let done = settled(&tasks, "token:alice", &task.task_id).await;
    assert_eq!(done.status(), TaskStatus::Completed);

    // Another client gets exactly what an unknown id gets, for every method.
    let unknown = tasks.get("token:bob", "no-such-task").unwrap_err();
    let theirs = tasks.get("token:bob", &task.task_id).unwrap_err();
    assert_eq!(unknown.code, theirs.code);
    assert!(theirs.message.starts_with("unknown task"));
    assert!(tasks.cancel("token:bob", &task.task_id).is_err());
    assert!(tasks
        .update(
            "token:bob",
            &task.task_id,
            [("k".to_string(), serde_json::json!({}))]
        )
        .is_err());
    assert!(tasks.list("token:bob").is_empty());
    assert_eq!(tasks.list("token:alice").len(), 1);
}

#[tokio::test]
async fn cancel_reaches_the_operation() {
    let tasks = ExecutionTasks::new(settings(8));
    let task = tasks
        .start("stdio", "queued".into(), until_cancelled())
        .unwrap();
    assert_eq!(
        tasks.get("stdio", &task.task_id).unwrap().status(),
        TaskStatus::Working
    );
    tasks.cancel("stdio", &task.task_id).unwrap();
    let done = settled(&tasks, "stdio", &task.task_id).await;
    assert_eq!(done.status(), TaskStatus::Cancelled);
    // Cancelling a finished task again is acknowledged, and changes nothing.
    tasks.cancel("stdio", &task.task_id).unwrap();
    assert_eq!(
        tasks.get("stdio", &task.task_id).unwrap().status(),
        TaskStatus::Cancelled
    );
}

#[tokio::test]
async fn one_client_cannot_hold_more_than_its_bound() {
    let tasks = ExecutionTasks::new(settings(2));
    let a = tasks.start("c1", "q".into(), until_cancelled()).unwrap();
    tasks.start("c1", "q".into(), until_cancelled()).unwrap();
    let refused = tasks
        .start("c1", "q".into(), until_cancelled())
        .unwrap_err();
    assert_eq!(refused, Error::TooMany { held: 2 });
    // Other clients are not affected.
    tasks.start("c2", "q".into(), quick("x")).unwrap();
    // Kept results count too: the bound is on what the server holds for the client.
    tasks.cancel("c1", &a.task_id).unwrap();
    settled(&tasks, "c1", &a.task_id).await;
    assert!(tasks.start("c1", "q".into(), quick("x")).is_err());
    tasks.shutdown();
}

#[tokio::test]
async fn the_output_tail_is_the_status_message() {
    let tasks = ExecutionTasks::new(settings(8));
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tasks
        .start("stdio", "queued".into(), move |ctx| {
            Box::pin(async move {
                let tail = OutputTail::new(ctx);
                tail.push("step 1\n");
                tail.push("step 2\n");
                let _ = rx.await;
                Ok(CallToolResult::success(vec![ContentBlock::text("done")]))
            })
        })
        .unwrap();
    let mut seen = String::new();
    for _ in 0..200 {
        let t = tasks.get("stdio", &task.task_id).unwrap();
        seen = t.task.status_message.clone().unwrap_or_default();
        if seen.contains("step 2") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(seen.contains("output so far:\nstep 1\nstep 2\n"), "{seen}");
    tx.send(()).unwrap();
    let done = settled(&tasks, "stdio", &task.task_id).await;
    assert_eq!(done.status(), TaskStatus::Completed);
}

/// A replica's task ids carry its name, so a balancer can route `tasks/get` on its
/// `Mcp-Name`; every method takes the qualified id, another replica's id is answered
/// with both names, and a forged prefix reaches nobody's task.
#[tokio::test]
async fn a_replicas_task_ids_name_it_and_route_back() {
    use crate::replica::ReplicaName;
    let r1 = ReplicaName::parse("codebox-1").unwrap();
    let tasks = ExecutionTasks::new(settings(8)).with_replica(Some(r1));
    let task = tasks
        .start("token:alice", "queued".into(), until_cancelled())
        .unwrap();
    let id = task.task_id.clone();
    let bare = id
        .strip_prefix("codebox-1.")
        .unwrap_or_else(|| panic!("{id} does not name its replica"))
        .to_string();
    assert_eq!(tasks.get("token:alice", &id).unwrap().task.task_id, id);
    assert_eq!(tasks.list("token:alice")[0].task.task_id, id);
    // The bare id, another replica's prefix, or a forged one are not this task.
    let unknown = tasks.get("token:alice", &bare).unwrap_err();
    assert!(unknown.message.starts_with("unknown task"), "{unknown:?}");
    let elsewhere = tasks
        .get("token:alice", &format!("codebox-2.{bare}"))
        .unwrap_err();
    assert!(
        elsewhere.message.contains("\"codebox-2\"") && elsewhere.message.contains("\"codebox-1\""),
        "{elsewhere:?}"
    );
    for forged in [
        format!("Codebox-1.{bare}"),
        format!("codebox-1.codebox-1.{bare}"),
        format!("codebox-1..{bare}"),
    ] {
        assert!(tasks.get("token:alice", &forged).is_err(), "{forged}");
    }
    // Another client: unknown, as on a single server.
    assert!(tasks
        .get("token:bob", &id)
        .unwrap_err()
        .message
        .starts_with("unknown task"));
    tasks.cancel("token:alice", &id).unwrap();
    let done = settled(&tasks, "token:alice", &id).await;
    assert_eq!(done.status(), TaskStatus::Cancelled);
    assert_eq!(done.task.task_id, id);

    // A single server takes no qualified id.
    let single = ExecutionTasks::new(settings(8));
    let t = single.start("c", "q".into(), quick("x")).unwrap();
    assert!(!t.task_id.contains('.'), "{}", t.task_id);
    assert!(single
        .get("c", &format!("codebox-1.{}", t.task_id))
        .is_err());
}
