//! One part of a snapshot, encrypted as it streams: the STREAM construction
//! (Hoang, Reyhanitabar, Rogaway, Vizár 2015) over ChaCha20-Poly1305, as `aead-stream`'s
//! `StreamBE32` implements it.
//!
//! - Each part has a random 256-bit key and a random 7-byte nonce prefix of its own (both
//!   in the sealed manifest); the remaining 5 nonce bytes are a 32-bit chunk counter and a
//!   last-chunk flag, so chunks cannot be reordered, dropped, repeated or taken from
//!   another part, and a stream cut at a chunk boundary fails as surely as one cut inside
//!   a chunk: only the last chunk authenticates with the flag set.
//! - Chunks carry [`CHUNK`] bytes of plaintext, except the last, which carries fewer
//!   (possibly none): the reader knows a chunk is the last by its length, and the file's
//!   length follows from the plaintext length in the manifest, which is checked first so
//!   that a truncated file is named as such rather than as a forgery.
//! - Every chunk's associated data names the format and the part's kind.
//! - Memory: one chunk of buffer each way, whatever the part's size.
//!
//! A reader hands out plaintext only after its chunk authenticated; but a part's end is
//! known only at its last chunk, so a consumer must treat what it read as unconfirmed
//! until [`PartReader::finish`] (restores write into a fresh filesystem that is thrown
//! away unless everything, the end included, checked out).

use std::io::{self, Read, Write};

use aead_stream::{DecryptorBE32, EncryptorBE32};
use chacha20poly1305::{ChaCha20Poly1305, KeyInit};
use zeroize::Zeroizing;

use super::Error;

/// Plaintext bytes per chunk (all but the last).
pub const CHUNK: usize = 64 * 1024;
/// Bytes of a Poly1305 tag.
pub const TAG: usize = 16;
/// Bytes of the per-part nonce prefix (12 − 5 for the counter and flag).
pub const NONCE_PREFIX: usize = 7;

/// A part's own key and nonce prefix.
#[derive(Clone)]
pub struct PartKey {
    pub key: Zeroizing<[u8; 32]>,
    pub nonce: [u8; NONCE_PREFIX],
}

impl std::fmt::Debug for PartKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PartKey(..)")
    }
}

impl PartKey {
    /// A fresh random key and nonce prefix.
    pub fn random() -> Result<PartKey, Error> {
        let mut key = Zeroizing::new([0u8; 32]);
        let mut nonce = [0u8; NONCE_PREFIX];
        getrandom::fill(key.as_mut()).map_err(Error::Random)?;
        getrandom::fill(&mut nonce).map_err(Error::Random)?;
        Ok(PartKey { key, nonce })
    }
}

/// The associated data of every chunk of a part of `kind`.
fn aad(kind: &str) -> Vec<u8> {
    let mut a = b"codebox snapshot part v1\0".to_vec();
    a.extend_from_slice(kind.as_bytes());
    a
}

/// Ciphertext bytes of a part of `plain` bytes.
pub fn cipher_len(plain: u64) -> u64 {
    let chunks = plain / CHUNK as u64 + 1;
    plain + chunks * TAG as u64
}

/// Encrypts a part into `out` as it is written.
pub struct PartWriter<W: Write> {
    enc: Option<EncryptorBE32<ChaCha20Poly1305>>,
    out: W,
    buf: Zeroizing<Vec<u8>>,
    aad: Vec<u8>,
    plain: u64,
}

impl<W: Write> PartWriter<W> {
    pub fn new(key: &PartKey, kind: &str, out: W) -> PartWriter<W> {
        let aead = ChaCha20Poly1305::new((&*key.key).into());
        let enc = EncryptorBE32::from_aead(aead, &key.nonce.into());
        PartWriter {
            enc: Some(enc),
            out,
            buf: Zeroizing::new(Vec::with_capacity(CHUNK + TAG)),
            aad: aad(kind),
            plain: 0,
        }
    }

    /// Plaintext bytes written so far.
    pub fn written(&self) -> u64 {
        self.plain
    }

    /// Encrypts and writes the full buffer as a chunk that is not the last.
    fn flush_chunk(&mut self) -> io::Result<()> {
        let enc = self.enc.as_mut().expect("not finished");
        enc.encrypt_next_in_place(&self.aad, &mut *self.buf)
            .map_err(|_| io::Error::other("the part is too long to encrypt (2^32 chunks)"))?;
        self.out.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }

    /// Writes the last chunk; returns the output and the plaintext length.
    pub fn finish(mut self) -> io::Result<(W, u64)> {
        if self.buf.len() == CHUNK {
            // The last chunk is always shorter than a whole one.
            self.flush_chunk()?;
        }
        let enc = self.enc.take().expect("not finished");
        enc.encrypt_last_in_place(&self.aad, &mut *self.buf)
            .map_err(|_| io::Error::other("cannot encrypt the last chunk"))?;
        self.out.write_all(&self.buf)?;
        self.out.flush()?;
        Ok((self.out, self.plain))
    }
}

impl<W: Write> Write for PartWriter<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        if self.buf.len() == CHUNK {
            // More is coming: the buffered chunk is not the last.
            self.flush_chunk()?;
        }
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        self.plain += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        // Whole chunks only: the buffer goes out when it is known not to be the last.
        Ok(())
    }
}

/// Why reading a part failed, carried inside the `io::Error` a reader returns.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error(
        "a chunk does not authenticate (the part was altered, or belongs to another snapshot)"
    )]
    Forged,
    #[error("the part ends early")]
    Truncated,
    #[error("the part goes on past its end")]
    TooLong,
}

impl StreamError {
    /// The stream error inside `e`, if it is one.
    pub fn of(e: &io::Error) -> Option<&StreamError> {
        e.get_ref().and_then(|inner| inner.downcast_ref())
    }
}

fn fail(e: StreamError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

/// Decrypts a part from `inp`, chunk by chunk.
pub struct PartReader<R: Read> {
    dec: Option<DecryptorBE32<ChaCha20Poly1305>>,
    inp: R,
    buf: Zeroizing<Vec<u8>>,
    pos: usize,
    aad: Vec<u8>,
    /// The last chunk has been read and authenticated.
    done: bool,
    expected: u64,
    got: u64,
}

impl<R: Read> PartReader<R> {
    /// `plain` is the plaintext length the manifest gives.
    pub fn new(key: &PartKey, kind: &str, plain: u64, inp: R) -> PartReader<R> {
        let aead = ChaCha20Poly1305::new((&*key.key).into());
        PartReader {
            dec: Some(DecryptorBE32::from_aead(aead, &key.nonce.into())),
            inp,
            buf: Zeroizing::new(Vec::with_capacity(CHUNK + TAG)),
            pos: 0,
            aad: aad(kind),
            done: false,
            expected: plain,
            got: 0,
        }
    }

    /// Reads the next chunk into the buffer.
    fn next_chunk(&mut self) -> io::Result<()> {
        self.buf.clear();
        self.buf.resize(CHUNK + TAG, 0);
        let mut n = 0;
        while n < self.buf.len() {
            match self.inp.read(&mut self.buf[n..]) {
                Ok(0) => break,
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.buf.truncate(n);
        self.pos = 0;
        if n < TAG {
            return Err(fail(StreamError::Truncated));
        }
        if n == CHUNK + TAG {
            let dec = self.dec.as_mut().expect("not done");
            dec.decrypt_next_in_place(&self.aad, &mut *self.buf)
                .map_err(|_| fail(StreamError::Forged))?;
        } else {
            let dec = self.dec.take().expect("not done");
            dec.decrypt_last_in_place(&self.aad, &mut *self.buf)
                .map_err(|_| fail(StreamError::Forged))?;
            self.done = true;
        }
        self.got += self.buf.len() as u64;
        if self.got > self.expected {
            return Err(fail(StreamError::TooLong));
        }
        Ok(())
    }

    /// After the last byte: checks the part ended where the manifest says and nothing
    /// follows it. Only then is what was read confirmed.
    pub fn finish(mut self) -> io::Result<R> {
        let mut sink = [0u8; 512];
        while self.read(&mut sink)? > 0 {}
        if self.got != self.expected {
            return Err(fail(StreamError::Truncated));
        }
        let mut extra = [0u8; 1];
        if self.inp.read(&mut extra)? != 0 {
            return Err(fail(StreamError::TooLong));
        }
        Ok(self.inp)
    }
}

impl<R: Read> Read for PartReader<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.pos < self.buf.len() {
                let n = out.len().min(self.buf.len() - self.pos);
                out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
                self.pos += n;
                return Ok(n);
            }
            if self.done || out.is_empty() {
                return Ok(0);
            }
            self.next_chunk()?;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seal(key: &PartKey, kind: &str, data: &[u8], piece: usize) -> Vec<u8> {
        let mut w = PartWriter::new(key, kind, Vec::new());
        for c in data.chunks(piece.max(1)) {
            w.write_all(c).unwrap();
        }
        let (out, n) = w.finish().unwrap();
        assert_eq!(n, data.len() as u64);
        assert_eq!(out.len() as u64, cipher_len(n));
        out
    }

    fn open(key: &PartKey, kind: &str, plain: u64, sealed: &[u8]) -> io::Result<Vec<u8>> {
        let mut r = PartReader::new(key, kind, plain, sealed);
        let mut out = Vec::new();
        r.read_to_end(&mut out)?;
        r.finish()?;
        Ok(out)
    }

    fn kind_of(e: io::Error) -> String {
        StreamError::of(&e)
            .map(|s| format!("{s:?}"))
            .unwrap_or(format!("{e}"))
    }

    #[test]
    fn parts_of_every_length_round_trip() {
        let key = PartKey::random().unwrap();
        for len in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK, 3 * CHUNK + 7] {
            let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            for piece in [1000, CHUNK, 7 * CHUNK] {
                let sealed = seal(&key, "workspace", &data, piece);
                assert_eq!(open(&key, "workspace", len as u64, &sealed).unwrap(), data);
            }
        }
    }

    #[test]
    fn tampered_truncated_extended_or_foreign_parts_are_refused() {
        let key = PartKey::random().unwrap();
        let data = vec![7u8; 2 * CHUNK + 100];
        let sealed = seal(&key, "workspace", &data, 4096);
        let n = data.len() as u64;
        // A flipped bit anywhere.
        for at in [0, CHUNK + 3, sealed.len() - 1] {
            let mut bad = sealed.clone();
            bad[at] ^= 0x40;
            assert_eq!(
                kind_of(open(&key, "workspace", n, &bad).unwrap_err()),
                "Forged"
            );
        }
        // Cut at a chunk boundary: no chunk sealed as the last follows.
        let cut = &sealed[..2 * (CHUNK + TAG)];
        assert_eq!(
            kind_of(open(&key, "workspace", n, cut).unwrap_err()),
            "Truncated"
        );
        // Cut inside a chunk: it does not authenticate as a last chunk.
        let cut = &sealed[..CHUNK + TAG + 5000];
        assert_eq!(
            kind_of(open(&key, "workspace", n, cut).unwrap_err()),
            "Forged"
        );
        // The whole parts but the last chunk, with the length the manifest would give:
        // the last full chunk was not sealed as the last.
        let whole = vec![7u8; 2 * CHUNK];
        let sealed_whole = seal(&key, "workspace", &whole, CHUNK);
        let no_last = &sealed_whole[..2 * (CHUNK + TAG)];
        assert!(open(&key, "workspace", 2 * CHUNK as u64, no_last).is_err());
        assert_eq!(
            kind_of(open(&key, "workspace", n, &[]).unwrap_err()),
            "Truncated"
        );
        // Bytes after the end.
        let mut long = sealed.clone();
        long.push(0);
        assert!(open(&key, "workspace", n, &long).is_err());
        // Chunks swapped.
        let mut swapped = sealed.clone();
        let (a, b) = swapped.split_at_mut(CHUNK + TAG);
        a.swap_with_slice(&mut b[..CHUNK + TAG]);
        assert_eq!(
            kind_of(open(&key, "workspace", n, &swapped).unwrap_err()),
            "Forged"
        );
        // Another part's key, or another kind.
        let other = PartKey::random().unwrap();
        assert!(open(&other, "workspace", n, &sealed).is_err());
        assert!(open(&key, "vm-memory", n, &sealed).is_err());
        // A manifest lying about the length.
        assert_eq!(
            kind_of(open(&key, "workspace", n - 1, &sealed).unwrap_err()),
            "TooLong"
        );
        assert_eq!(
            kind_of(open(&key, "workspace", n + 1, &sealed).unwrap_err()),
            "Truncated"
        );
    }
}
