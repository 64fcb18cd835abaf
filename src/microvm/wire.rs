//! The control port between the host and the guest init: framed messages, bounded.
//!
//! The guest is untrusted (an escaped program owns its kernel and can write anything to
//! every port), so the host reads this port as hostile input: a frame is a 4-byte
//! big-endian length and that many bytes of JSON, at most [`MAX_FRAME`]; a larger length,
//! a frame that is not one of the messages below, or a second `Exited` ends the VM as a
//! protocol violation. The reader keeps at most one frame in memory, so a flooding guest
//! costs the host nothing but the time to refuse it.
//!
//! The program's bytes never travel here: stdout, stderr and fd 3 have a virtio-serial
//! port each, so nothing the program writes can be read as a control message, and each
//! stream has its own flow control (a program that floods stdout stalls its own stdout
//! only). A port has no end of file, so the guest announces each stream's end here with
//! the number of bytes it carried ([`GuestMessage::Eof`]); the host ends the stream it
//! hands upward once that many bytes went through.

use serde::{Deserialize, Serialize};

use crate::sandbox::{CgroupStats, LandlockStatus, Limits, NetworkAccess, ProgramStatus};

/// The largest frame body either side accepts.
pub const MAX_FRAME: usize = 64 * 1024;

/// The ports' names (`virtserialport,name=`), as the guest finds them in
/// `/sys/class/virtio-ports/*/name`.
pub const PORT_CONTROL: &str = "codebox.control";
pub const PORT_STDOUT: &str = "codebox.stdout";
pub const PORT_STDERR: &str = "codebox.stderr";
pub const PORT_CHANNEL: &str = "codebox.channel";

/// A stream that has its own port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    Stdout,
    Stderr,
    /// The program's fd 3.
    Channel,
}

/// The sandbox the guest starts: what the host decided, as data. The guest compiles the
/// seccomp filter of `seccomp` itself (the same binary, so the same policy files).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    pub path: String,
    pub argv: Vec<String>,
    pub env: Vec<String>,
    pub cwd: String,
    pub limits: Limits,
    /// A built-in seccomp profile's name.
    pub seccomp: String,
    /// `None`: no landlock (never from a profile); else best effort or required.
    pub landlock: Option<crate::sandbox::LandlockMode>,
    pub network: NetworkAccess,
}

/// A host directory the program sees read-only, as a namespace sandbox binds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tree {
    /// The generated tool wrappers, at `/servers`.
    Servers,
    /// The client's saved skills, at `/skills`.
    Skills,
}

impl Tree {
    pub fn name(self) -> &'static str {
        match self {
            Tree::Servers => "servers",
            Tree::Skills => "skills",
        }
    }
}

/// The most bytes of one tree's stream (`snapshot::archive`) the guest accepts.
pub const MAX_TREE_BYTES: usize = 32 * 1024 * 1024;
/// Stream bytes per `Tree` frame: base64 of it and the JSON around it fit a frame.
pub const TREE_CHUNK: usize = 32 * 1024;

/// Host → guest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostMessage {
    /// A part of `tree`'s stream (`snapshot::archive`, base64); `end`: the last part. The
    /// trees sent before a `Start` are bound read-only in its sandbox; after a deferred
    /// `Start`, those sent before its `Resume` fill the empty mounts it was given.
    Tree { tree: Tree, data: String, end: bool },
    /// Start the sandbox. `time_ns`: the host's `CLOCK_REALTIME`; `seed`: 64 bytes (hex)
    /// mixed into the guest kernel's entropy pool, and the pool reseeded, before the
    /// program starts.
    Start {
        spec: Box<RunSpec>,
        time_ns: u64,
        seed: String,
        /// The program is handed out later (a template's, or a pooled clone's): its
        /// deadline is armed by `Resume`, not now, and the trees not sent before this
        /// `Start` are bound as empty mounts that the `Tree` parts sent before the
        /// `Resume` fill.
        #[serde(default)]
        deferred: bool,
    },
    /// The program of a deferred `Start` (in a clone restored from a template, or a
    /// pooled clone handed out) gets its code next: seal the trees that came after the
    /// `Start` read-only, set the clock, mix in the seed and reseed the kernel's
    /// generator, arm the program's deadline (`timeout_ms`, else its spec's timeout);
    /// answer `Resumed`.
    Resume {
        time_ns: u64,
        seed: String,
        #[serde(default)]
        timeout_ms: Option<u64>,
    },
    /// The host closed its side of fd 3: the program reads end of file after what is
    /// still on the way.
    Eof { stream: Stream, bytes: u64 },
}

/// Guest → host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum GuestMessage {
    /// The guest init is up and waits for `Start`. `build_id`: its own GNU build ID,
    /// which must be the host's (one binary, one protocol).
    Hello { build_id: String },
    /// The program was exec'd.
    Started { landlock: Option<LandlockStatus> },
    /// A clone has its own clock and entropy now.
    Resumed,
    /// A stream ended after `bytes` bytes on its port.
    Eof { stream: Stream, bytes: u64 },
    /// The program ended (or the sandbox was killed: `status` is `None`); the guest's
    /// cgroup figures of the sandbox.
    Exited {
        status: Option<ProgramStatus>,
        cgroup: Option<CgroupStats>,
    },
    /// The guest could not do what it was asked; a short reason.
    Failed { reason: String },
}

/// `tree`'s stream as encoded `Tree` frames, [`TREE_CHUNK`] bytes each (one empty frame
/// for an empty stream), each encoded only when it is taken.
pub fn tree_frames(tree: Tree, stream: &[u8]) -> impl Iterator<Item = Vec<u8>> + '_ {
    use base64::Engine;
    let count = stream.len().div_ceil(TREE_CHUNK).max(1);
    (0..count).map(move |i| {
        let chunk =
            &stream[(i * TREE_CHUNK).min(stream.len())..((i + 1) * TREE_CHUNK).min(stream.len())];
        encode(&HostMessage::Tree {
            tree,
            data: base64::engine::general_purpose::STANDARD.encode(chunk),
            end: i + 1 == count,
        })
    })
}

/// Why a frame was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("a control frame of {0} bytes; the limit is {MAX_FRAME}")]
    TooLarge(usize),
    #[error("a control frame that is not a message: {0}")]
    Invalid(String),
}

/// One frame: length and JSON.
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    let body = serde_json::to_vec(message).expect("control messages serialize");
    assert!(
        body.len() <= MAX_FRAME,
        "a control message over the frame limit"
    );
    let mut out = Vec::with_capacity(4 + body.len());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// Reassembles frames from bytes as they arrive; holds at most one frame.
#[derive(Debug, Default)]
pub struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
    /// How many bytes the reader may take next without holding more than one frame.
    pub fn want(&self) -> usize {
        match self.pending_len() {
            Some(len) => 4 + len - self.buf.len(),
            None => 4 - self.buf.len(),
        }
    }

    fn pending_len(&self) -> Option<usize> {
        (self.buf.len() >= 4).then(|| {
            u32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]) as usize
        })
    }

    /// Feeds bytes (at most [`FrameReader::want`] of them are taken); returns how many were
    /// taken and, when a frame is complete, its message.
    pub fn push<T: for<'de> Deserialize<'de>>(
        &mut self,
        bytes: &[u8],
    ) -> Result<(usize, Option<T>), FrameError> {
        let take = bytes.len().min(self.want());
        self.buf.extend_from_slice(&bytes[..take]);
        if let Some(len) = self.pending_len() {
            if len > MAX_FRAME {
                return Err(FrameError::TooLarge(len));
            }
            if self.buf.len() == 4 + len {
                let parsed = serde_json::from_slice(&self.buf[4..])
                    .map_err(|e| FrameError::Invalid(e.to_string()));
                self.buf.clear();
                return parsed.map(|m| (take, Some(m)));
            }
        }
        Ok((take, None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tree_streams_go_in_frames_that_fit() {
        let stream: Vec<u8> = (0..TREE_CHUNK * 2 + 5).map(|i| (i * 7) as u8).collect();
        let frames: Vec<Vec<u8>> = tree_frames(Tree::Servers, &stream).collect();
        assert_eq!(frames.len(), 3);
        let mut back = Vec::new();
        let mut reader = FrameReader::default();
        for (i, f) in frames.iter().enumerate() {
            assert!(f.len() - 4 <= MAX_FRAME);
            let mut rest = &f[..];
            let mut m = None;
            while !rest.is_empty() {
                let (took, got) = reader.push::<HostMessage>(rest).unwrap();
                rest = &rest[took..];
                m = m.or(got);
            }
            match m.unwrap() {
                HostMessage::Tree { tree, data, end } => {
                    use base64::Engine;
                    assert_eq!(tree, Tree::Servers);
                    assert_eq!(end, i == 2);
                    back.extend(
                        base64::engine::general_purpose::STANDARD
                            .decode(data)
                            .unwrap(),
                    );
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(back, stream);
        // An empty tree is one last frame.
        assert_eq!(tree_frames(Tree::Skills, &[]).count(), 1);
    }

    fn spec() -> RunSpec {
        RunSpec {
            path: "/usr/bin/python3".into(),
            argv: vec!["python3".into()],
            env: vec!["PATH=/usr/bin".into()],
            cwd: "/workspace".into(),
            limits: Limits::default(),
            seccomp: "default".into(),
            landlock: Some(crate::sandbox::LandlockMode::BestEffort),
            network: NetworkAccess::None,
        }
    }

    #[test]
    fn messages_round_trip_byte_by_byte() {
        let msgs = vec![
            HostMessage::Start {
                spec: Box::new(spec()),
                time_ns: 1,
                seed: "00".repeat(64),
                deferred: false,
            },
            HostMessage::Resume {
                time_ns: 2,
                seed: "11".repeat(64),
                timeout_ms: Some(5_000),
            },
            HostMessage::Eof {
                stream: Stream::Channel,
                bytes: 7,
            },
        ];
        let mut bytes = Vec::new();
        for m in &msgs {
            bytes.extend(encode(m));
        }
        let mut r = FrameReader::default();
        let mut got = Vec::new();
        for b in bytes.chunks(1) {
            let (taken, m) = r.push::<HostMessage>(b).unwrap();
            assert_eq!(taken, 1);
            got.extend(m);
        }
        assert_eq!(got, msgs);
    }

    #[test]
    fn the_reader_never_takes_past_one_frame() {
        let mut bytes = encode(&GuestMessage::Hello {
            build_id: "ab".into(),
        });
        let first = bytes.len();
        bytes.extend(encode(&GuestMessage::Failed { reason: "x".into() }));
        let mut r = FrameReader::default();
        let mut at = 0;
        let mut got = Vec::new();
        while at < bytes.len() {
            let (taken, m) = r.push::<GuestMessage>(&bytes[at..]).unwrap();
            at += taken;
            if let Some(m) = m {
                got.push((at, m));
            }
        }
        assert_eq!(got[0].0, first);
        assert_eq!(got.len(), 2);
    }

    /// Feeds all of `bytes` as a reader loop does; the first message or error.
    fn feed(bytes: &[u8]) -> Result<Option<GuestMessage>, FrameError> {
        let mut r = FrameReader::default();
        let mut at = 0;
        while at < bytes.len() {
            let (taken, m) = r.push::<GuestMessage>(&bytes[at..])?;
            if m.is_some() {
                return Ok(m);
            }
            at += taken;
        }
        Ok(None)
    }

    #[test]
    fn oversized_and_garbled_frames_are_refused() {
        assert_eq!(
            feed(&u32::MAX.to_be_bytes()).unwrap_err(),
            FrameError::TooLarge(u32::MAX as usize)
        );
        // Refused at the header: nothing of the body is ever held.
        let mut r = FrameReader::default();
        let mut huge = ((MAX_FRAME + 1) as u32).to_be_bytes().to_vec();
        huge.extend(std::iter::repeat_n(b'x', 4096));
        assert!(r.push::<GuestMessage>(&huge).is_err());
        let mut frame = 5u32.to_be_bytes().to_vec();
        frame.extend_from_slice(b"{oops");
        assert!(matches!(feed(&frame), Err(FrameError::Invalid(_))));
        // Valid JSON, not a message.
        let body = br#"{"type":"reboot"}"#;
        let mut frame = (body.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(body);
        assert!(matches!(feed(&frame), Err(FrameError::Invalid(_))));
        // A frame exactly at the limit is read (and refused as JSON, not as size).
        let mut frame = (MAX_FRAME as u32).to_be_bytes().to_vec();
        frame.extend(std::iter::repeat_n(b' ', MAX_FRAME));
        assert!(matches!(feed(&frame), Err(FrameError::Invalid(_))));
        // A truncated frame is no message yet.
        let mut frame = encode(&GuestMessage::Hello {
            build_id: "x".into(),
        });
        frame.pop();
        assert_eq!(feed(&frame).unwrap(), None);
    }
}
