use rmcp::model::{ClientRequest, NumberOrString, PingRequest};
use tokio::io::{AsyncWriteExt, DuplexStream};

use super::*;

const LIMIT: usize = 1000;

struct Rig {
    t: StdioTransport<DuplexStream, DuplexStream>,
    /// The server's stdout.
    out: DuplexStream,
    /// The server's stdin (kept open).
    _in: DuplexStream,
}

fn rig() -> Rig {
    let (out, read) = tokio::io::duplex(64 << 10);
    let (write, input) = tokio::io::duplex(64 << 10);
    Rig {
        t: StdioTransport::new("test", read, write, LIMIT),
        out,
        _in: input,
    }
}

impl Rig {
    /// Sends a ping with `id`, so that `id` is in flight.
    async fn request(&mut self, id: i64) {
        let msg = JsonRpcMessage::request(
            ClientRequest::PingRequest(PingRequest::default()),
            NumberOrString::Number(id),
        );
        self.t.send(msg).await.unwrap();
    }

    async fn server_writes(&mut self, bytes: &[u8]) {
        self.out.write_all(bytes).await.unwrap();
    }

    async fn next(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        tokio::time::timeout(std::time::Duration::from_secs(5), self.t.receive())
            .await
            .expect("receive did not block")
    }

    async fn next_error(&mut self) -> (Option<RequestId>, String) {
        match self.next().await {
            Some(JsonRpcMessage::Error(e)) => {
                let reason = transport_failure(&e.error)
                    .expect("a transport failure")
                    .to_string();
                (e.id, reason)
            }
            other => panic!("expected an error, got {other:?}"),
        }
    }

    async fn expect_pong(&mut self, id: i64) {
        match self.next().await {
            Some(JsonRpcMessage::Response(r)) => assert_eq!(r.id, NumberOrString::Number(id)),
            other => panic!("expected the response to {id}, got {other:?}"),
        }
    }
}

fn pong(id: i64) -> Vec<u8> {
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{}}}}\n").into_bytes()
}

fn big(id: i64, text_bytes: usize, id_first: bool) -> Vec<u8> {
    let text = "x".repeat(text_bytes);
    let line = if id_first {
        format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"{text}\"}}]}}}}\n")
    } else {
        format!("{{\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"{text}\"}}]}},\"jsonrpc\":\"2.0\",\"id\":{id}}}\n")
    };
    line.into_bytes()
}

#[tokio::test]
async fn a_line_at_the_limit_passes_and_one_byte_more_fails_its_request() {
    let mut r = rig();
    r.request(1).await;
    r.request(2).await;
    let mut at_limit = big(1, 0, true);
    let pad = LIMIT - (at_limit.len() - 1);
    at_limit = big(1, pad, true);
    assert_eq!(at_limit.len() - 1, LIMIT);
    r.server_writes(&at_limit).await;
    r.expect_pong(1).await;
    r.server_writes(&big(2, pad + 1, false)).await;
    let (id, reason) = r.next_error().await;
    assert_eq!(id, Some(NumberOrString::Number(2)));
    assert!(reason.contains("over the limit of 1000 bytes"), "{reason}");
    assert!(reason.contains(&format!("{} bytes", LIMIT + 1)), "{reason}");
    // The connection goes on.
    r.request(3).await;
    r.server_writes(&pong(3)).await;
    r.expect_pong(3).await;
}

#[tokio::test]
async fn an_oversized_line_fails_as_soon_as_its_id_is_seen_and_is_never_buffered() {
    let mut r = rig();
    r.request(7).await;
    // Only the start of a huge line: the id is known, the end is not here yet.
    let line = big(7, 200_000, true);
    r.server_writes(&line[..50_000]).await;
    let (id, reason) = r.next_error().await;
    assert_eq!(id, Some(NumberOrString::Number(7)));
    assert!(reason.contains("over the limit"), "{reason}");
    r.request(8).await;
    let (out, t) = (&mut r.out, &mut r.t);
    let writer = async {
        out.write_all(&line[50_000..]).await.unwrap();
        out.write_all(&pong(8)).await.unwrap();
    };
    let ((), message) = tokio::join!(writer, t.receive());
    match message {
        Some(JsonRpcMessage::Response(m)) => assert_eq!(m.id, NumberOrString::Number(8)),
        other => panic!("expected the response to 8, got {other:?}"),
    }
    assert!(
        r.t.line.capacity() <= KEEP_BUFFER,
        "{}",
        r.t.line.capacity()
    );
}

#[tokio::test]
async fn invalid_utf8_fails_its_request() {
    let mut r = rig();
    r.request(4).await;
    r.server_writes(b"{\"jsonrpc\":\"2.0\",\"result\":{\"content\":[{\"type\":\"text\",\"text\":\"a\xff\xfeb\"}]},\"id\":4}\n")
        .await;
    let (id, reason) = r.next_error().await;
    assert_eq!(id, Some(NumberOrString::Number(4)));
    assert!(reason.contains("not valid UTF-8 (at byte"), "{reason}");
    r.request(5).await;
    r.server_writes(&pong(5)).await;
    r.expect_pong(5).await;
}

#[tokio::test]
async fn json_that_is_not_json_rpc_fails_its_request() {
    let mut r = rig();
    r.request(6).await;
    r.server_writes(b"{\"jsonrpc\":\"1.0\",\"id\":6,\"result\":{}}\n")
        .await;
    let (id, reason) = r.next_error().await;
    assert_eq!(id, Some(NumberOrString::Number(6)));
    assert!(reason.contains("not a valid JSON-RPC message"), "{reason}");
    // Broken JSON with a readable id.
    r.request(9).await;
    r.server_writes(b"{\"jsonrpc\":\"2.0\",\"id\":9,\"result\":{\"a\":\n")
        .await;
    let (id, reason) = r.next_error().await;
    assert_eq!(id, Some(NumberOrString::Number(9)));
    assert!(reason.contains("not JSON"), "{reason}");
}

#[tokio::test]
async fn banners_and_unknown_ids_are_skipped() {
    let mut r = rig();
    r.request(1).await;
    r.server_writes(b"server listening on stdio\n\n   \n").await;
    r.server_writes(&pong(12345)).await;
    r.server_writes(b"{\"jsonrpc\":\"2.0\",\"id\":777,\"error\":{\"code\":1,\"message\":\"x\"}}\n")
        .await;
    r.server_writes(&pong(1)).await;
    r.expect_pong(1).await;
    // Answered once: a second answer is to no request in flight.
    r.request(2).await;
    r.server_writes(&pong(1)).await;
    r.server_writes(&pong(2)).await;
    r.expect_pong(2).await;
}

#[tokio::test]
async fn an_oversized_line_without_an_id_fails_everything_and_ends() {
    let mut r = rig();
    r.request(1).await;
    r.request(2).await;
    let line = format!(
        "{{\"jsonrpc\":\"2.0\",\"result\":\"{}\"}}\n",
        "y".repeat(5000)
    );
    r.server_writes(line.as_bytes()).await;
    let mut failed = vec![];
    for _ in 0..2 {
        let (id, reason) = r.next_error().await;
        assert!(reason.contains("over the limit of 1000 bytes"), "{reason}");
        failed.push(id.unwrap());
    }
    failed.sort_by_key(|id| id.to_string());
    assert_eq!(
        failed,
        [NumberOrString::Number(1), NumberOrString::Number(2)]
    );
    assert!(r.next().await.is_none(), "the connection ends");
}

#[tokio::test]
async fn output_that_is_not_a_message_is_skipped_even_oversized_or_not_utf8() {
    let mut r = rig();
    r.request(1).await;
    r.server_writes(b"caf\xe9 latin-1 banner\n").await;
    r.server_writes(format!("{}\n", "z".repeat(3 * LIMIT)).as_bytes())
        .await;
    r.server_writes(&pong(1)).await;
    r.expect_pong(1).await;
}

#[tokio::test]
async fn invalid_utf8_without_an_id_ends_the_connection() {
    let mut r = rig();
    r.request(1).await;
    r.server_writes(b"{\"jsonrpc\":\"2.0\",\"result\":\"\xff\xfe\"}\n")
        .await;
    let (id, reason) = r.next_error().await;
    assert_eq!(id, Some(NumberOrString::Number(1)));
    assert!(reason.contains("UTF-8"), "{reason}");
    assert!(r.next().await.is_none());
}

#[tokio::test]
async fn cancelled_requests_are_no_longer_in_flight() {
    let mut r = rig();
    r.request(1).await;
    let cancel = JsonRpcMessage::notification(ClientNotification::CancelledNotification(
        rmcp::model::CancelledNotification::new(rmcp::model::CancelledNotificationParam::new(
            Some(NumberOrString::Number(1)),
            None,
        )),
    ));
    r.t.send(cancel).await.unwrap();
    r.request(2).await;
    r.server_writes(&pong(1)).await;
    r.server_writes(&pong(2)).await;
    r.expect_pong(2).await;
}

#[test]
fn sizes_read_well() {
    assert_eq!(size(64 << 20), "64 MiB (67108864 bytes)");
    assert_eq!(size(1000), "1000 bytes");
    assert_eq!(size(4096), "4 KiB (4096 bytes)");
}

/// An answer that would parse into far more memory than its size (a value per two
/// bytes) fails its call unparsed, naming the limit; the next answer is taken.
#[tokio::test]
async fn answers_that_parse_into_much_more_than_their_size_fail_unparsed() {
    let mut r = rig();
    r.t.cost_limit = 8000;
    r.request(7).await;
    let zeros = vec!["0"; 400].join(",");
    let line = format!("{{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{{\"z\":[{zeros}]}}}}\n");
    assert!(line.len() < LIMIT);
    r.server_writes(line.as_bytes()).await;
    let (id, reason) = r.next_error().await;
    assert_eq!(id, Some(NumberOrString::Number(7)));
    assert!(reason.contains("of memory to parse"), "{reason}");
    r.request(8).await;
    r.server_writes(&pong(8)).await;
    r.expect_pong(8).await;
    // Text costs its size: the production limit is never below 64 MiB.
    assert_eq!(parse_limit(1000), 64 << 20);
    assert_eq!(parse_limit(64 << 20), 256 << 20);
}
