//! POST responses still being written, so shutdown can wait until they are out.
//!
//! An execution's answer travels in the SSE body of the POST that asked for it. When the
//! drain is over, the server stops; if it stopped while such a body was still being
//! written (a loaded machine can take a while to schedule the writer), the client would
//! lose an answer the server had already produced, and the official SDKs then try to
//! resume the stream against a listener that is gone. So the HTTP server counts POST
//! bodies until the last byte (or the connection) is gone, and after the drain waits for
//! none to be left — bounded — before it closes the listener. Standalone GET streams are
//! not counted: they never end by themselves.

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Body as HttpBody, Frame, SizeHint};

/// How many POST response bodies are being written.
#[derive(Debug, Clone, Default)]
pub struct PostsInFlight(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    count: AtomicUsize,
    changed: tokio::sync::Notify,
}

impl PostsInFlight {
    /// The number of POST bodies not yet written in full.
    pub fn count(&self) -> usize {
        self.0.count.load(Ordering::SeqCst)
    }

    /// Waits until no POST body is left, or `bound` passed; true when none is left.
    pub async fn wait_idle(&self, bound: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            let changed = self.0.changed.notified();
            if self.count() == 0 {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.count() == 0;
            }
        }
    }

    fn enter(&self) -> Guard {
        self.0.count.fetch_add(1, Ordering::SeqCst);
        Guard(self.0.clone())
    }
}

/// One POST body in flight; dropped with the body (written in full, or abandoned).
#[derive(Debug)]
struct Guard(Arc<Inner>);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0.count.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// Middleware: every POST's response body holds a [`Guard`] until it is gone.
pub async fn count_posts(State(posts): State<PostsInFlight>, req: Request, next: Next) -> Response {
    if req.method() != axum::http::Method::POST {
        return next.run(req).await;
    }
    let guard = posts.enter();
    next.run(req).await.map(|inner| {
        Body::new(Guarded {
            inner,
            _guard: guard,
        })
    })
}

/// A response body that holds a [`Guard`].
struct Guarded {
    inner: Body,
    _guard: Guard,
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_for_bodies_and_gives_up_at_the_bound() {
        let posts = PostsInFlight::default();
        assert!(posts.wait_idle(Duration::from_millis(10)).await);
        let guard = posts.enter();
        assert!(!posts.wait_idle(Duration::from_millis(50)).await);
        let waiter = {
            let posts = posts.clone();
            tokio::spawn(async move { posts.wait_idle(Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(guard);
        assert!(waiter.await.unwrap());
        assert_eq!(posts.count(), 0);
    }

    #[tokio::test]
    async fn a_post_counts_until_its_body_is_dropped() {
        use axum::routing::post;
        use tower::ServiceExt;
        let posts = PostsInFlight::default();
        let app = axum::Router::new()
            .route("/", post(|| async { "answer" }).get(|| async { "stream" }))
            .layer(axum::middleware::from_fn_with_state(
                posts.clone(),
                count_posts,
            ));
        let req = |m: &str| {
            Request::builder()
                .method(m)
                .uri("/")
                .body(Body::empty())
                .unwrap()
        };
        let got = app.clone().oneshot(req("GET")).await.unwrap();
        assert_eq!(posts.count(), 0, "a GET is not counted");
        drop(got);
        let answer = app.oneshot(req("POST")).await.unwrap();
        assert_eq!(posts.count(), 1, "the POST's body is not written yet");
        let bytes = axum::body::to_bytes(answer.into_body(), 1024)
            .await
            .unwrap();
        assert_eq!(&bytes[..], b"answer");
        assert_eq!(posts.count(), 0);
    }
}
