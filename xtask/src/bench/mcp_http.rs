//! An MCP session over streamable HTTP (`POST /mcp`): the `Mcp-Session-Id` from the
//! initialize response on every later request, answers as JSON or as SSE `data:` events,
//! `DELETE /mcp` to end it.

use std::net::SocketAddr;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::http::{Connection, Response};
use super::mcp::{self, Rpc};

pub struct HttpSession {
    conn: Connection,
    session_id: String,
    next_id: u64,
}

impl HttpSession {
    /// A new session on its own connection: initialize, then `notifications/initialized`.
    pub fn open(addr: SocketAddr) -> Result<HttpSession> {
        let mut s = HttpSession {
            conn: Connection::new(addr),
            session_id: String::new(),
            next_id: 1,
        };
        let init = mcp::request(0, "initialize", mcp::initialize_params());
        let response = s.post(&init)?;
        s.session_id = response
            .header("mcp-session-id")
            .context("the initialize response has no Mcp-Session-Id")?
            .to_string();
        answer(&response, 0).context("initialize")?;
        let ack = s.post(&mcp::initialized_notification())?;
        if ack.status != 202 {
            bail!("notifications/initialized got HTTP {}", ack.status);
        }
        Ok(s)
    }

    /// Ends the session on the server (`DELETE /mcp`).
    pub fn close(mut self) -> Result<()> {
        let id = self.session_id.clone();
        let r = self.conn.send(
            "DELETE",
            "/mcp",
            &[
                ("Mcp-Session-Id", &id),
                ("MCP-Protocol-Version", mcp::PROTOCOL_VERSION),
            ],
            b"",
        )?;
        if !(200..300).contains(&r.status) {
            bail!("DELETE /mcp got HTTP {}", r.status);
        }
        Ok(())
    }

    fn post(&mut self, msg: &Value) -> Result<Response> {
        let body = serde_json::to_vec(msg)?;
        let mut headers = vec![
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
        ];
        let id = self.session_id.clone();
        if !id.is_empty() {
            headers.push(("Mcp-Session-Id", &id));
            headers.push(("MCP-Protocol-Version", mcp::PROTOCOL_VERSION));
        }
        let r = self.conn.send("POST", "/mcp", &headers, &body)?;
        if !(200..300).contains(&r.status) {
            bail!(
                "HTTP {}: {}",
                r.status,
                String::from_utf8_lossy(&r.body).trim()
            );
        }
        Ok(r)
    }
}

impl Rpc for HttpSession {
    fn rpc(&mut self, method: &str, params: Value) -> Result<Value> {
        let id = self.next_id;
        self.next_id += 1;
        let response = self.post(&mcp::request(id, method, params))?;
        answer(&response, id).with_context(|| format!("{method} failed"))
    }
}

/// The result of request `id` in a response body: plain JSON, or the SSE event carrying it
/// (other events, such as the empty priming event or notifications, are skipped).
fn answer(r: &Response, id: u64) -> Result<Value> {
    let body = std::str::from_utf8(&r.body).context("a response body that is not UTF-8")?;
    let sse = r
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/event-stream"));
    let messages: Vec<Value> = if sse {
        sse_data(body)
            .iter()
            .filter(|d| !d.trim().is_empty())
            .map(|d| {
                serde_json::from_str(d)
                    .with_context(|| format!("an SSE event that is not JSON: {d:?}"))
            })
            .collect::<Result<_>>()?
    } else {
        vec![serde_json::from_str(body).context("a response body that is not JSON")?]
    };
    messages
        .iter()
        .find_map(|m| mcp::response_to(m, id))
        .with_context(|| format!("no response to request {id} in: {body:?}"))?
}

/// The `data` of each event of an SSE stream (multi-line data joined by newlines).
fn sse_data(stream: &str) -> Vec<String> {
    let mut events = Vec::new();
    let mut data: Option<String> = None;
    for line in stream.lines().chain([""]) {
        if line.is_empty() {
            events.extend(data.take());
        } else if let Some(d) = line.strip_prefix("data:") {
            let d = d.strip_prefix(' ').unwrap_or(d);
            match &mut data {
                Some(acc) => {
                    acc.push('\n');
                    acc.push_str(d);
                }
                None => data = Some(d.to_string()),
            }
        }
    }
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_events_are_split() {
        let s = "data: \nid: 0\nretry: 3000\n\ndata: {\"a\":\ndata: 1}\nid: 1/0\n\n";
        assert_eq!(sse_data(s), vec!["".to_string(), "{\"a\":\n1}".to_string()]);
    }
}
