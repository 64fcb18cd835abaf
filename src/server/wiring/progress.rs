//! An execution's output while it runs: progress notifications when the request carries
//! a progress token, and the task's output so far when it runs as a task.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::ProgressNotificationParam;
use rmcp::service::RequestContext;
use rmcp::RoleServer;

use crate::spawner::Stream;

type Chunk = (Stream, Vec<u8>);

/// Largest output text in one progress notification (escaped JSON bytes).
const PROGRESS_PIECE_BYTES: usize = 256 * 1024;

/// Sends output as progress notifications, at most every 100 ms, when the request carries
/// a progress token, and to the task's `tail` when it runs as a task. With PII handling
/// on, or egress secrets configured, only whole lines go out, tokenized and redacted (a
/// value cut in two by a chunk boundary must not slip through).
pub(in crate::server) fn progress_forwarder(
    ctx: &RequestContext<RoleServer>,
    redact: Option<Arc<crate::pii::Vault>>,
    secrets: Option<crate::egress::Secrets>,
    tail: Option<Arc<crate::tasks::OutputTail>>,
) -> (
    Option<tokio::task::JoinHandle<()>>,
    Option<tokio::sync::mpsc::UnboundedSender<Chunk>>,
) {
    let token = ctx.meta.get_progress_token();
    if token.is_none() && tail.is_none() {
        return (None, None);
    }
    let peer = ctx.peer.clone();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Chunk>();
    let task = tokio::spawn(async move {
        let mut n = 0u64;
        let mut pending = String::new();
        let mut last = Instant::now() - Duration::from_secs(1);
        loop {
            let item = tokio::time::timeout(Duration::from_millis(100), rx.recv()).await;
            let done = matches!(item, Ok(None));
            if let Ok(Some((stream, chunk))) = item {
                if stream == Stream::Stderr {
                    pending.push_str("[stderr] ");
                }
                pending.push_str(&String::from_utf8_lossy(&chunk));
            }
            if pending.is_empty() || !(done || last.elapsed() >= Duration::from_millis(100)) {
                if done {
                    break;
                }
                continue;
            }
            let text = if redact.is_none() && secrets.is_none() {
                std::mem::take(&mut pending)
            } else {
                let cut = if done {
                    pending.len()
                } else {
                    pending.rfind('\n').map_or(0, |i| i + 1)
                };
                let rest = pending.split_off(cut);
                let mut text = std::mem::replace(&mut pending, rest);
                if let Some(v) = &redact {
                    text = v.tokenize(&text);
                }
                if let Some(x) = &secrets {
                    text = String::from_utf8_lossy(&x.redact_all(text.as_bytes())).into_owned();
                }
                text
            };
            // Output that came in a burst goes out in several notifications, each
            // well within what a client accepts in one message.
            if let Some(tail) = &tail {
                tail.push(&text);
                last = Instant::now();
            }
            for piece in crate::output::json_text::pieces(&text, PROGRESS_PIECE_BYTES) {
                let Some(token) = &token else { break };
                n += 1;
                let param = ProgressNotificationParam::new(token.clone(), n as f64)
                    .with_message(piece.to_string());
                let _ = peer.notify_progress(param).await;
                last = Instant::now();
            }
            if done {
                break;
            }
        }
    });
    (Some(task), Some(tx))
}
