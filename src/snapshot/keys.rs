//! The operator's snapshot key and what is derived from it.
//!
//! The key is 32 bytes the operator gives as `[sessions] snapshot_key = "env:VAR"`: 64 hex
//! digits, or the standard base64 of 32 bytes. Nothing else of it is ever written
//! anywhere. HKDF-SHA256 (salt `codebox snapshot v1`) derives one subkey per use, so no
//! key serves two purposes:
//!
//! | info       | what it keys                                                        |
//! |------------|---------------------------------------------------------------------|
//! | `key-id`   | 8 bytes written in clear in every manifest: a snapshot sealed with another key is told apart from a tampered one |
//! | `slot`     | HMAC of a session id → its directory's name (ids are capabilities: never a file name) |
//! | `owner`    | HMAC of a client's name → the owner tag in ledger entries (names stay out of the files; limits count per tag) |
//! | `ledger`   | HMAC of every ledger entry, bound to its slot and sequence number    |
//! | `manifest` | XChaCha20-Poly1305 key sealing each snapshot's manifest              |
//!
//! Parts are encrypted with a fresh random key each (in the sealed manifest), never with a
//! derived one: a fork of a paused session reuses a part's ciphertext (a reflink) under a
//! new manifest, which only works if the part's key is the part's own.

use chacha20poly1305::aead::{Aead, Payload};
use chacha20poly1305::{KeyInit, XChaCha20Poly1305, XNonce};
use hmac::{Hmac, Mac};
use sha2::Sha256;
use zeroize::Zeroizing;

use super::Error;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of the operator's key.
pub const KEY_LEN: usize = 32;
/// Bytes of the key id written in clear.
pub const KEY_ID_LEN: usize = 8;
/// Bytes of an XChaCha20-Poly1305 nonce.
pub const XNONCE_LEN: usize = 24;

/// The operator's snapshot key and its subkeys.
pub struct SnapshotKey {
    id: [u8; KEY_ID_LEN],
    slot: Zeroizing<[u8; 32]>,
    owner: Zeroizing<[u8; 32]>,
    ledger: Zeroizing<[u8; 32]>,
    manifest: Zeroizing<[u8; 32]>,
}

impl std::fmt::Debug for SnapshotKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Only the id, which is written in clear anyway.
        f.debug_struct("SnapshotKey")
            .field("id", &self.id_hex())
            .finish_non_exhaustive()
    }
}

impl SnapshotKey {
    /// The key from its text: 64 hex digits or base64 of 32 bytes (surrounding
    /// whitespace ignored). The error never repeats the text.
    pub fn parse(text: &str) -> Result<SnapshotKey, Error> {
        let text = Zeroizing::new(text.trim().to_string());
        let raw = Zeroizing::new(decode(&text).ok_or_else(|| Error::BadKey {
            why: format!(
                "expected 64 hex digits or the base64 of {KEY_LEN} bytes ({} characters given); make one with `openssl rand -hex 32`",
                text.chars().count()
            ),
        })?);
        if raw.iter().all(|b| *b == raw[0]) {
            return Err(Error::BadKey {
                why: "every byte is the same: use random bytes (`openssl rand -hex 32`)".into(),
            });
        }
        Ok(SnapshotKey::from_bytes(&raw))
    }

    /// The key from its 32 bytes.
    pub fn from_bytes(raw: &[u8; KEY_LEN]) -> SnapshotKey {
        let hk = hkdf::Hkdf::<Sha256>::new(Some(b"codebox snapshot v1"), raw);
        let expand = |info: &[u8]| {
            let mut out = Zeroizing::new([0u8; 32]);
            hk.expand(info, out.as_mut())
                .expect("32 bytes is a valid HKDF-SHA256 length");
            out
        };
        let id_full = expand(b"key-id");
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&id_full[..KEY_ID_LEN]);
        SnapshotKey {
            id,
            slot: expand(b"slot"),
            owner: expand(b"owner"),
            ledger: expand(b"ledger"),
            manifest: expand(b"manifest"),
        }
    }

    /// The key id (written in clear in manifests).
    pub fn id(&self) -> [u8; KEY_ID_LEN] {
        self.id
    }

    pub fn id_hex(&self) -> String {
        hex(&self.id)
    }

    /// The directory name of session `id`'s snapshots: 32 hex digits of an HMAC, so the
    /// id (a capability) is never a file name, and a name says nothing without the key.
    pub fn slot_of(&self, session_id: &str) -> String {
        hex(&mac(&self.slot, &[b"slot\0", session_id.as_bytes()])[..16])
    }

    /// A client's tag in ledger entries (32 hex digits of an HMAC of its name).
    pub fn owner_tag(&self, owner: &str) -> String {
        hex(&mac(&self.owner, &[b"owner\0", owner.as_bytes()])[..16])
    }

    /// The MAC of a ledger entry: its slot, its sequence number and its text.
    pub fn ledger_mac(&self, slot: &str, seq: u64, body: &[u8]) -> [u8; 32] {
        mac(
            &self.ledger,
            &[
                b"ledger\0",
                slot.as_bytes(),
                b"\0",
                &seq.to_be_bytes(),
                body,
            ],
        )
    }

    /// Whether `tag` is the MAC of that entry (compared in constant time).
    pub fn ledger_mac_ok(&self, slot: &str, seq: u64, body: &[u8], tag: &[u8]) -> bool {
        let mut m = <HmacSha256 as Mac>::new_from_slice(self.ledger.as_ref())
            .expect("HMAC takes any key length");
        for part in [
            &b"ledger\0"[..],
            slot.as_bytes(),
            b"\0",
            &seq.to_be_bytes(),
            body,
        ] {
            m.update(part);
        }
        m.verify_slice(tag).is_ok()
    }

    /// Seals `plain` (a manifest) with a fresh random nonce; `aad` is authenticated too.
    /// Returns the nonce and the ciphertext with its tag.
    pub fn seal(&self, aad: &[u8], plain: &[u8]) -> Result<([u8; XNONCE_LEN], Vec<u8>), Error> {
        let mut nonce = [0u8; XNONCE_LEN];
        getrandom::fill(&mut nonce).map_err(Error::Random)?;
        let cipher = XChaCha20Poly1305::new((&*self.manifest).into());
        let sealed = cipher
            .encrypt(&XNonce::from(nonce), Payload { msg: plain, aad })
            .map_err(|_| Error::Crypto("sealing a manifest"))?;
        Ok((nonce, sealed))
    }

    /// Opens what [`SnapshotKey::seal`] sealed; `None` when it does not authenticate.
    pub fn open(
        &self,
        aad: &[u8],
        nonce: &[u8; XNONCE_LEN],
        sealed: &[u8],
    ) -> Option<Zeroizing<Vec<u8>>> {
        let cipher = XChaCha20Poly1305::new((&*self.manifest).into());
        cipher
            .decrypt(&XNonce::from(*nonce), Payload { msg: sealed, aad })
            .ok()
            .map(Zeroizing::new)
    }
}

fn mac(key: &[u8; 32], parts: &[&[u8]]) -> [u8; 32] {
    let mut m = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// Lower-case hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes from lower- or upper-case hex of even length.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// 32 bytes from 64 hex digits or base64.
fn decode(text: &str) -> Option<[u8; KEY_LEN]> {
    use base64::Engine;
    let bytes = Zeroizing::new(if text.len() == 2 * KEY_LEN {
        unhex(text)?
    } else {
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .ok()?
    });
    bytes.as_slice().try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    #[test]
    fn keys_are_read_as_hex_or_base64_and_bad_ones_are_refused_without_echo() {
        let a = SnapshotKey::parse(HEX).unwrap();
        let b64 = base64::Engine::encode(
            &base64::engine::general_purpose::STANDARD,
            unhex(HEX).unwrap(),
        );
        let b = SnapshotKey::parse(&format!("  {b64}\n")).unwrap();
        assert_eq!(a.id(), b.id());
        assert_eq!(a.slot_of("s"), b.slot_of("s"));
        for bad in [
            "",
            "short",
            &HEX[..62],
            &format!("{HEX}00"),
            &"zz".repeat(32),
            &"00".repeat(32),
        ] {
            let e = SnapshotKey::parse(bad).unwrap_err().to_string();
            assert!(e.contains("snapshot key"), "{e}");
            if bad.len() > 8 {
                assert!(!e.contains(bad), "the key text is never echoed: {e}");
            }
        }
        // Debug shows the id only.
        let shown = format!("{a:?}");
        assert!(
            shown.contains(&a.id_hex()) && !shown.contains(HEX),
            "{shown}"
        );
    }

    #[test]
    fn subkeys_are_separate_and_depend_on_the_key() {
        let a = SnapshotKey::parse(HEX).unwrap();
        let mut other = unhex(HEX).unwrap();
        other[0] ^= 1;
        let b = SnapshotKey::from_bytes(&other.try_into().unwrap());
        assert_ne!(a.id(), b.id());
        assert_ne!(a.slot_of("x"), b.slot_of("x"));
        assert_ne!(a.slot_of("x"), a.slot_of("y"));
        assert_ne!(a.slot_of("alice"), a.owner_tag("alice"));
        assert_eq!(a.slot_of("x").len(), 32);
        let tag = a.ledger_mac("slot", 3, b"body");
        assert!(a.ledger_mac_ok("slot", 3, b"body", &tag));
        assert!(
            !a.ledger_mac_ok("slot", 4, b"body", &tag),
            "bound to the sequence"
        );
        assert!(
            !a.ledger_mac_ok("slot2", 3, b"body", &tag),
            "bound to the slot"
        );
        assert!(!a.ledger_mac_ok("slot", 3, b"bodz", &tag));
        assert!(!b.ledger_mac_ok("slot", 3, b"body", &tag));
    }

    #[test]
    fn sealing_authenticates_text_and_associated_data() {
        let a = SnapshotKey::parse(HEX).unwrap();
        let (nonce, sealed) = a.seal(b"aad", b"secret manifest").unwrap();
        assert_eq!(
            &**a.open(b"aad", &nonce, &sealed).unwrap(),
            b"secret manifest"
        );
        assert!(a.open(b"aaD", &nonce, &sealed).is_none());
        let mut bad = sealed.clone();
        bad[0] ^= 1;
        assert!(a.open(b"aad", &nonce, &bad).is_none());
        assert!(a
            .open(b"aad", &nonce, &sealed[..sealed.len() - 1])
            .is_none());
        let (nonce2, _) = a.seal(b"aad", b"secret manifest").unwrap();
        assert_ne!(nonce, nonce2, "a fresh nonce each time");
    }
}
