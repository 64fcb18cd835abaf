//! The host's side of the streams: bytes from a port's socket to the pipe or socket handed
//! upward, through one fixed buffer each, so the supervisor's memory does not grow with
//! what the guest sends, and a reader upstream that stops reading stalls this stream (and
//! through virtio-serial's flow control, the guest's writer) and nothing else.
//!
//! A port has no end of file: a stream ends upward once the number of bytes the guest
//! announced (`GuestMessage::Eof`) went through. Bytes past that count are dropped (a
//! guest that lies about it gets nothing for it); a guest that never announces the end
//! holds the stream open until the VM ends.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;

const BUF: usize = 64 * 1024;

/// How a pump ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PumpEnd {
    /// The announced count went through.
    Complete { bytes: u64 },
    /// The source closed (QEMU is gone) before the count was reached.
    SourceClosed { bytes: u64 },
    /// Nobody reads upstream any more.
    SinkClosed { bytes: u64 },
}

impl PumpEnd {
    pub fn bytes(self) -> u64 {
        match self {
            PumpEnd::Complete { bytes }
            | PumpEnd::SourceClosed { bytes }
            | PumpEnd::SinkClosed { bytes } => bytes,
        }
    }
}

/// Copies `from` to `to` until `limit` (once known) bytes went through, or either side
/// closes. `to` is shut down (end of file upward) before returning.
pub async fn pump<R, W>(mut from: R, mut to: W, mut limit: watch::Receiver<Option<u64>>) -> PumpEnd
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; BUF];
    let mut total: u64 = 0;
    let end = loop {
        let known = *limit.borrow_and_update();
        if let Some(l) = known {
            if total >= l {
                break PumpEnd::Complete { bytes: total };
            }
        }
        let room = match known {
            Some(l) => buf.len().min((l - total) as usize),
            None => buf.len(),
        };
        let n = tokio::select! {
            r = from.read(&mut buf[..room]) => match r {
                Ok(0) | Err(_) => break PumpEnd::SourceClosed { bytes: total },
                Ok(n) => n,
            },
            changed = limit.changed(), if known.is_none() => {
                if changed.is_err() {
                    // The driver is gone: nothing will announce the end.
                    break PumpEnd::SourceClosed { bytes: total };
                }
                continue;
            }
        };
        if to.write_all(&buf[..n]).await.is_err() {
            break PumpEnd::SinkClosed { bytes: total };
        }
        total += n as u64;
    };
    let _ = to.shutdown().await;
    end
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::duplex;

    #[tokio::test]
    async fn stops_at_the_announced_count_and_drops_the_rest() {
        let (mut guest, port) = duplex(1024);
        let (up, mut reader) = duplex(1 << 20);
        let (tx, rx) = watch::channel(None);
        let task = tokio::spawn(pump(port, up, rx));
        guest.write_all(b"hello world").await.unwrap();
        tx.send(Some(5)).unwrap();
        let end = task.await.unwrap();
        assert_eq!(end, PumpEnd::Complete { bytes: 5 });
        let mut got = Vec::new();
        reader.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"hello", "bytes past the count are not passed on");
    }

    #[tokio::test]
    async fn a_count_of_zero_ends_at_once() {
        let (_guest, port) = duplex(16);
        let (up, mut reader) = duplex(16);
        let (_tx, rx) = watch::channel(Some(0));
        assert_eq!(pump(port, up, rx).await, PumpEnd::Complete { bytes: 0 });
        let mut got = Vec::new();
        reader.read_to_end(&mut got).await.unwrap();
        assert!(got.is_empty());
    }

    #[tokio::test]
    async fn a_closed_source_ends_the_stream_upward() {
        let (guest, port) = duplex(16);
        let (up, mut reader) = duplex(16);
        let (_tx, rx) = watch::channel(None);
        let task = tokio::spawn(pump(port, up, rx));
        drop(guest);
        assert_eq!(task.await.unwrap(), PumpEnd::SourceClosed { bytes: 0 });
        let mut got = Vec::new();
        reader.read_to_end(&mut got).await.unwrap();
    }

    #[tokio::test]
    async fn a_flood_into_a_slow_reader_is_bounded_by_the_buffers() {
        // The guest writes 8 MiB; upstream reads nothing: the pump blocks with at most
        // its buffer and the pipe's in flight, and the writer blocks too.
        let (mut guest, port) = duplex(64 * 1024);
        let (up, reader) = duplex(64 * 1024);
        let (_tx, rx) = watch::channel(None);
        let task = tokio::spawn(pump(port, up, rx));
        let writer = tokio::spawn(async move {
            let chunk = vec![b'x'; 64 * 1024];
            let mut sent = 0usize;
            for _ in 0..128 {
                if guest.write_all(&chunk).await.is_err() {
                    break;
                }
                sent += chunk.len();
            }
            sent
        });
        // Let everything run until it can go no further.
        for _ in 0..1000 {
            tokio::task::yield_now().await;
        }
        assert!(!writer.is_finished(), "the guest's writes are held back");
        drop(reader);
        let end = task.await.unwrap();
        assert!(matches!(end, PumpEnd::SinkClosed { .. }), "{end:?}");
        assert!(end.bytes() <= 3 * 64 * 1024, "{end:?}");
    }
}
