//! A small QMP client: JSON lines over the VMM's fd 3, one command at a time, events on
//! the side, descriptors passed with `getfd` (`SCM_RIGHTS`).
//!
//! Why not a crate: the QMP peer is a QEMU the guest may have taken over, so everything
//! it sends is hostile input — every line is capped ([`MAX_LINE`]) and at most
//! [`MAX_EVENTS`] events wait unread (older ones are dropped and counted) — and commands
//! must carry descriptors (`getfd`, for migration streams). `qapi` (the maintained QMP
//! crate, with types generated from QEMU's schema) reads lines without a bound and has no
//! descriptor passing; what codebox sends is a handful of commands, so typed bindings buy
//! little.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{oneshot, Notify};

/// The longest line QEMU may send (a `query-*` answer of codebox's few devices is a few
/// KiB).
pub const MAX_LINE: usize = 1024 * 1024;
/// Events kept until read.
pub const MAX_EVENTS: usize = 256;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("QMP connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("QMP: the VMM closed the connection")]
    Closed,
    #[error("QMP: a line over {MAX_LINE} bytes")]
    LineTooLong,
    #[error("QMP: not JSON or not a QMP message: {0}")]
    Protocol(String),
    #[error("QMP command {command} failed: {class}: {desc}")]
    Command {
        command: String,
        class: String,
        desc: String,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// An asynchronous event (`SHUTDOWN`, `STOP`, `RESUME`, `MIGRATION`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub name: String,
    pub data: Value,
}

#[derive(Default)]
struct Shared {
    events: VecDeque<Event>,
    dropped: u64,
    pending: Option<oneshot::Sender<Result<Value>>>,
    /// Why the reader stopped.
    closed: Option<String>,
}

/// A negotiated QMP connection.
pub struct Qmp {
    /// The write half; holding its lock is a command's turn (one at a time).
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    shared: Arc<Mutex<Shared>>,
    notify: Arc<Notify>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Qmp {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Splits `buf` at the first `\n`: the line (without `\r\n`) and the rest.
fn take_line(buf: &mut Vec<u8>) -> Option<Vec<u8>> {
    let at = buf.iter().position(|&b| b == b'\n')?;
    let mut line: Vec<u8> = buf.drain(..=at).collect();
    line.pop();
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    Some(line)
}

/// What one line from QEMU is.
#[derive(Debug, PartialEq)]
pub enum Message {
    Greeting(Value),
    Return(Value),
    Error { class: String, desc: String },
    Event(Event),
}

/// Parses one line.
pub fn parse(line: &[u8]) -> Result<Message> {
    let v: Value = serde_json::from_slice(line).map_err(|e| Error::Protocol(e.to_string()))?;
    let obj = v
        .as_object()
        .ok_or_else(|| Error::Protocol("not an object".into()))?;
    if let Some(g) = obj.get("QMP") {
        return Ok(Message::Greeting(g.clone()));
    }
    if let Some(r) = obj.get("return") {
        return Ok(Message::Return(r.clone()));
    }
    if let Some(e) = obj.get("error") {
        let s = |k: &str| {
            e.get(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .chars()
                .take(512)
                .collect::<String>()
        };
        return Ok(Message::Error {
            class: s("class"),
            desc: s("desc"),
        });
    }
    if let Some(name) = obj.get("event").and_then(Value::as_str) {
        return Ok(Message::Event(Event {
            name: name.chars().take(64).collect(),
            data: obj.get("data").cloned().unwrap_or(Value::Null),
        }));
    }
    Err(Error::Protocol(
        "neither a return, an error nor an event".into(),
    ))
}

impl Qmp {
    /// Reads the greeting and negotiates capabilities.
    pub async fn connect(fd: OwnedFd) -> Result<Qmp> {
        let std = std::os::unix::net::UnixStream::from(fd);
        std.set_nonblocking(true)?;
        let (mut read_half, writer) = UnixStream::from_std(std)?.into_split();
        let mut buf = Vec::new();
        // The greeting, read here (before the reader task exists).
        let greeting = loop {
            if let Some(line) = take_line(&mut buf) {
                break parse(&line)?;
            }
            if buf.len() > MAX_LINE {
                return Err(Error::LineTooLong);
            }
            let mut chunk = [0u8; 4096];
            let n = read_half.read(&mut chunk).await?;
            if n == 0 {
                return Err(Error::Closed);
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        if !matches!(greeting, Message::Greeting(_)) {
            return Err(Error::Protocol("no greeting".into()));
        }
        let shared = Arc::new(Mutex::new(Shared::default()));
        let notify = Arc::new(Notify::new());
        let reader = tokio::spawn(read_loop(read_half, buf, shared.clone(), notify.clone()));
        let qmp = Qmp {
            writer: tokio::sync::Mutex::new(writer),
            shared,
            notify,
            reader,
        };
        qmp.execute("qmp_capabilities", None).await?;
        Ok(qmp)
    }

    /// Runs one command; its `return` value.
    pub async fn execute(&self, command: &str, arguments: Option<Value>) -> Result<Value> {
        self.execute_with_fd(command, arguments, None).await
    }

    /// Runs one command, passing `fd` with it (for `getfd`).
    pub async fn execute_with_fd(
        &self,
        command: &str,
        arguments: Option<Value>,
        fd: Option<BorrowedFd<'_>>,
    ) -> Result<Value> {
        let mut writer = self.writer.lock().await;
        let (tx, rx) = oneshot::channel();
        {
            let mut s = self.shared.lock().expect("qmp state");
            if let Some(why) = &s.closed {
                return Err(Error::Protocol(why.clone()));
            }
            s.pending = Some(tx);
        }
        let mut msg = match arguments {
            Some(a) => json!({"execute": command, "arguments": a}),
            None => json!({"execute": command}),
        }
        .to_string()
        .into_bytes();
        msg.push(b'\n');
        match fd {
            None => writer.write_all(&msg).await?,
            Some(fd) => send_with_fd(&mut writer, &msg, fd).await?,
        }
        match rx.await {
            Ok(r) => r.map_err(|e| match e {
                Error::Command { class, desc, .. } => Error::Command {
                    command: command.to_string(),
                    class,
                    desc,
                },
                other => other,
            }),
            Err(_) => Err(Error::Closed),
        }
    }

    /// The next event, waiting for one; `None` once the connection is gone and no event
    /// is left.
    pub async fn next_event(&self) -> Option<Event> {
        loop {
            let notified = self.notify.notified();
            {
                let mut s = self.shared.lock().expect("qmp state");
                if let Some(e) = s.events.pop_front() {
                    return Some(e);
                }
                if s.closed.is_some() {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Waits until the connection is gone (QEMU exited, closed it, or broke the protocol);
    /// returns why.
    pub async fn closed(&self) -> String {
        loop {
            let notified = self.notify.notified();
            if let Some(why) = &self.shared.lock().expect("qmp state").closed {
                return why.clone();
            }
            notified.await;
        }
    }

    /// Events dropped because nobody read them in time.
    pub fn dropped_events(&self) -> u64 {
        self.shared.lock().expect("qmp state").dropped
    }

    /// `query-status`'s `status` (`running`, `paused`, `internal-error`, ...).
    pub async fn status(&self) -> Result<String> {
        let v = self.execute("query-status", None).await?;
        Ok(v.get("status")
            .and_then(Value::as_str)
            .unwrap_or("unknown")
            .to_string())
    }
}

/// Writes `msg` with `fd` attached to its first byte.
async fn send_with_fd(writer: &mut OwnedWriteHalf, msg: &[u8], fd: BorrowedFd<'_>) -> Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let fds = [fd.as_raw_fd()];
    let mut sent = 0;
    let stream: &UnixStream = writer.as_ref();
    while sent == 0 {
        stream.writable().await?;
        let r = stream.try_io(tokio::io::Interest::WRITABLE, || {
            let iov = [std::io::IoSlice::new(msg)];
            let cmsg = [ControlMessage::ScmRights(&fds)];
            sendmsg::<()>(
                stream.as_raw_fd(),
                &iov,
                &cmsg,
                MsgFlags::MSG_NOSIGNAL,
                None,
            )
            .map_err(std::io::Error::from)
        });
        match r {
            Ok(n) => sent = n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e.into()),
        }
    }
    if sent < msg.len() {
        writer.write_all(&msg[sent..]).await?;
    }
    Ok(())
}

async fn read_loop(
    mut stream: OwnedReadHalf,
    mut buf: Vec<u8>,
    shared: Arc<Mutex<Shared>>,
    notify: Arc<Notify>,
) {
    let why = loop {
        while let Some(line) = take_line(&mut buf) {
            if line.is_empty() {
                continue;
            }
            let parsed = parse(&line);
            let mut s = shared.lock().expect("qmp state");
            match parsed {
                Ok(Message::Event(e)) => {
                    if s.events.len() >= MAX_EVENTS {
                        s.events.pop_front();
                        s.dropped += 1;
                    }
                    s.events.push_back(e);
                    notify.notify_waiters();
                }
                Ok(Message::Return(v)) => {
                    if let Some(tx) = s.pending.take() {
                        let _ = tx.send(Ok(v));
                    }
                }
                Ok(Message::Error { class, desc }) => {
                    if let Some(tx) = s.pending.take() {
                        let _ = tx.send(Err(Error::Command {
                            command: String::new(),
                            class,
                            desc,
                        }));
                    }
                }
                Ok(Message::Greeting(_)) => {}
                Err(e) => {
                    drop(s);
                    break_with(&shared, &notify, format!("{e}"));
                    return;
                }
            }
        }
        if buf.len() > MAX_LINE {
            break Error::LineTooLong.to_string();
        }
        let mut chunk = [0u8; 16 * 1024];
        match stream.read(&mut chunk).await {
            Ok(0) => break Error::Closed.to_string(),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => break e.to_string(),
        }
    };
    break_with(&shared, &notify, why);
}

fn break_with(shared: &Mutex<Shared>, notify: &Notify, why: String) {
    let mut s = shared.lock().expect("qmp state");
    if let Some(tx) = s.pending.take() {
        let _ = tx.send(Err(Error::Protocol(why.clone())));
    }
    s.closed = Some(why);
    drop(s);
    notify.notify_waiters();
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncBufReadExt;

    #[test]
    fn lines_are_parsed_by_kind() {
        assert!(matches!(
            parse(br#"{"QMP": {"version": {}}}"#).unwrap(),
            Message::Greeting(_)
        ));
        assert_eq!(
            parse(br#"{"return": {"status": "running"}}"#).unwrap(),
            Message::Return(json!({"status": "running"}))
        );
        assert_eq!(
            parse(br#"{"error": {"class": "GenericError", "desc": "no"}}"#).unwrap(),
            Message::Error {
                class: "GenericError".into(),
                desc: "no".into()
            }
        );
        assert_eq!(
            parse(br#"{"event": "STOP", "timestamp": {}}"#).unwrap(),
            Message::Event(Event {
                name: "STOP".into(),
                data: Value::Null
            })
        );
        for bad in [&b"[]"[..], b"{}", b"{\"return\"", b"\xff"] {
            assert!(parse(bad).is_err());
        }
    }

    #[test]
    fn take_line_strips_crlf() {
        let mut b = b"a\r\nb\nc".to_vec();
        assert_eq!(take_line(&mut b).unwrap(), b"a");
        assert_eq!(take_line(&mut b).unwrap(), b"b");
        assert_eq!(take_line(&mut b), None);
        assert_eq!(b, b"c");
    }

    /// A fake QEMU on the other end of a socketpair.
    async fn fake_qemu(
        script: impl FnOnce(
                tokio::io::BufReader<tokio::net::unix::OwnedReadHalf>,
                tokio::net::unix::OwnedWriteHalf,
            ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>
            + Send
            + 'static,
    ) -> OwnedFd {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        let b = UnixStream::from_std(b).unwrap();
        tokio::spawn(async move {
            let (r, w) = b.into_split();
            script(tokio::io::BufReader::new(r), w).await
        });
        OwnedFd::from(a)
    }

    #[tokio::test]
    async fn negotiates_runs_commands_and_queues_events() {
        let fd = fake_qemu(|mut r, mut w| {
            Box::pin(async move {
                w.write_all(b"{\"QMP\": {\"version\": {}}}\r\n")
                    .await
                    .unwrap();
                let mut line = String::new();
                r.read_line(&mut line).await.unwrap();
                assert!(line.contains("qmp_capabilities"));
                w.write_all(b"{\"return\": {}}\r\n").await.unwrap();
                line.clear();
                r.read_line(&mut line).await.unwrap();
                assert!(line.contains("query-status"));
                // An event before the answer.
                w.write_all(
                    b"{\"event\": \"STOP\"}\r\n{\"return\": {\"status\": \"internal-error\"}}\r\n",
                )
                .await
                .unwrap();
                line.clear();
                r.read_line(&mut line).await.unwrap();
                w.write_all(b"{\"error\": {\"class\": \"GenericError\", \"desc\": \"nope\"}}\r\n")
                    .await
                    .unwrap();
                // Then hang up.
            })
        })
        .await;
        let qmp = Qmp::connect(fd).await.unwrap();
        assert_eq!(qmp.status().await.unwrap(), "internal-error");
        let err = qmp.execute("cont", None).await.unwrap_err().to_string();
        assert!(err.contains("cont") && err.contains("nope"), "{err}");
        assert_eq!(qmp.next_event().await.unwrap().name, "STOP");
        assert_eq!(qmp.next_event().await, None);
        assert!(qmp.execute("cont", None).await.is_err());
    }

    #[tokio::test]
    async fn an_endless_line_is_refused_not_buffered() {
        let fd = fake_qemu(|mut r, mut w| {
            Box::pin(async move {
                w.write_all(b"{\"QMP\": {}}\n").await.unwrap();
                let mut line = String::new();
                r.read_line(&mut line).await.unwrap();
                w.write_all(b"{\"return\": {}}\n").await.unwrap();
                let chunk = vec![b'x'; 64 * 1024];
                // Far more than MAX_LINE, never a newline.
                for _ in 0..(4 * MAX_LINE / chunk.len()) {
                    if w.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
            })
        })
        .await;
        let qmp = Qmp::connect(fd).await.unwrap();
        assert_eq!(qmp.next_event().await, None, "the reader gave up");
        let err = qmp.execute("query-status", None).await.unwrap_err();
        assert!(err.to_string().contains(&MAX_LINE.to_string()), "{err}");
    }

    #[tokio::test]
    async fn an_event_flood_keeps_only_the_newest() {
        let fd = fake_qemu(|mut r, mut w| {
            Box::pin(async move {
                w.write_all(b"{\"QMP\": {}}\n").await.unwrap();
                let mut line = String::new();
                r.read_line(&mut line).await.unwrap();
                w.write_all(b"{\"return\": {}}\n").await.unwrap();
                for i in 0..(MAX_EVENTS + 100) {
                    w.write_all(format!("{{\"event\": \"E{i}\"}}\n").as_bytes())
                        .await
                        .unwrap();
                }
            })
        })
        .await;
        let qmp = Qmp::connect(fd).await.unwrap();
        qmp.closed().await;
        let mut names = Vec::new();
        while let Some(e) = qmp.next_event().await {
            names.push(e.name);
        }
        assert_eq!(names.len(), MAX_EVENTS);
        assert_eq!(names.last().unwrap(), &format!("E{}", MAX_EVENTS + 99));
        assert_eq!(qmp.dropped_events(), 100);
    }
}
