//! A snapshot's manifest: what it is of (session, owner, generation), what it holds
//! (its typed parts, each with its own key) and when it was made; sealed with the
//! manifest subkey.
//!
//! On disk: `CBXSNAP\0`, the format version (u16 LE), the key id (8 bytes), a 24-byte
//! nonce, then the XChaCha20-Poly1305 ciphertext of the manifest's JSON. The magic,
//! version and key id are the associated data, so none of them can be changed either; the
//! key id is in clear so that a snapshot sealed with another key (another server's, an
//! old one) is told apart from a forged one.

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::keys::{hex, unhex, SnapshotKey, KEY_ID_LEN, XNONCE_LEN};
use super::stream::PartKey;
use super::Error;

const MAGIC: &[u8; 8] = b"CBXSNAP\0";
/// The manifest format this code writes and reads.
pub const VERSION: u16 = 1;
/// The most a manifest file may hold (it lists a handful of parts).
pub const MAX_BYTES: usize = 64 * 1024;
const HEADER: usize = 8 + 2 + KEY_ID_LEN + XNONCE_LEN;

/// What one part of a snapshot holds. The namespace backend writes `workspace` (and
/// `pii-vault` when the session has PII tokens); the microVM backend adds its VM state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PartKind {
    /// The session's `/workspace`, as a [`super::archive`] stream.
    Workspace,
    /// The session's PII token map (JSON), so tokens shown before the pause still restore.
    PiiVault,
    /// The microVM's guest memory (written by the microVM backend).
    VmMemory,
    /// The microVM's device state (written by the microVM backend).
    VmDevices,
}

impl PartKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PartKind::Workspace => "workspace",
            PartKind::PiiVault => "pii-vault",
            PartKind::VmMemory => "vm-memory",
            PartKind::VmDevices => "vm-devices",
        }
    }
}

/// What of a session a snapshot keeps, as the first run after a resume reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateKind {
    /// The workspace only: interpreters start afresh (the namespace backend).
    Files,
    /// The whole VM: memory, devices and workspace (the microVM backend).
    Vm,
}

impl StateKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StateKind::Files => "files",
            StateKind::Vm => "vm",
        }
    }
}

/// One part as the manifest lists it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PartEntry {
    /// The kind as written (a kind this version does not know is refused by name).
    pub kind: String,
    /// The file in the snapshot's directory.
    pub file: String,
    /// The part's own key and nonce prefix (hex).
    pub key: String,
    pub nonce: String,
    /// Plaintext bytes.
    pub plain: u64,
}

impl PartEntry {
    /// The kind, when this version knows it.
    pub fn kind(&self) -> Option<PartKind> {
        serde_json::from_value(serde_json::Value::String(self.kind.clone())).ok()
    }

    /// The part's key.
    pub fn part_key(&self) -> Option<PartKey> {
        let key = Zeroizing::new(unhex(&self.key)?);
        let nonce = unhex(&self.nonce)?;
        let mut k = Zeroizing::new([0u8; 32]);
        k.copy_from_slice(key.get(..32).filter(|_| key.len() == 32)?);
        Some(PartKey {
            key: k,
            nonce: nonce.as_slice().try_into().ok()?,
        })
    }

    pub fn new(kind: PartKind, key: &PartKey, plain: u64) -> PartEntry {
        PartEntry {
            kind: kind.as_str().to_string(),
            file: kind.as_str().to_string(),
            key: hex(key.key.as_ref()),
            nonce: hex(&key.nonce),
            plain,
        }
    }
}

/// What the workspace held when it was saved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkspaceFacts {
    /// Bytes of file data (holes not counted).
    pub data_bytes: u64,
    /// Bytes of allocated blocks, by the filesystem's count.
    pub allocated_bytes: u64,
    /// Entries (files, directories, links), `out/` included.
    pub entries: u64,
    /// Special files (FIFOs, sockets, devices) left out.
    pub skipped: u64,
}

/// The sealed content.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The session's id (the whole id, replica prefix included).
    pub session: String,
    /// The client that owns it.
    pub owner: String,
    /// Counts the session's pauses: the ledger names the generation it expects, so an
    /// older snapshot put back in place of a newer one is refused.
    pub generation: u64,
    pub created_unix: u64,
    pub paused_unix: u64,
    /// Who paused it: `<replica or ->/<instance>`.
    pub paused_by: String,
    /// The backend that made it (`namespace`, `microvm`).
    pub backend: String,
    pub state: StateKind,
    /// Languages the session ran, and those it kept an interpreter for.
    pub languages: Vec<String>,
    pub keep_alive: Vec<String>,
    pub workspace: WorkspaceFacts,
    /// The workspace limits in force when it was paused.
    pub quota_bytes: u64,
    pub max_entries: u64,
    pub parts: Vec<PartEntry>,
}

impl Manifest {
    /// The entry of `kind`, if the snapshot has that part.
    pub fn part(&self, kind: PartKind) -> Option<&PartEntry> {
        self.parts.iter().find(|p| p.kind() == Some(kind))
    }

    /// The manifest file's bytes.
    pub fn seal(&self, key: &SnapshotKey) -> Result<Vec<u8>, Error> {
        let json = Zeroizing::new(serde_json::to_vec(self).expect("a manifest serialises"));
        let mut out = Vec::with_capacity(HEADER + json.len() + 16);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&key.id());
        let (nonce, sealed) = key.seal(&out.clone(), &json)?;
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        if out.len() > MAX_BYTES {
            return Err(Error::Format {
                why: format!("the manifest would be {} bytes", out.len()),
            });
        }
        Ok(out)
    }

    /// Reads a manifest file's bytes: refused with the reason when it is not one, is of
    /// a newer format, was sealed with another key or does not authenticate.
    pub fn open(key: &SnapshotKey, bytes: &[u8]) -> Result<Manifest, Error> {
        if bytes.len() > MAX_BYTES {
            return Err(Error::Forged {
                what: "manifest".into(),
                why: format!("{} bytes, more than a manifest holds", bytes.len()),
            });
        }
        if bytes.len() < HEADER + 16 || &bytes[..8] != MAGIC {
            return Err(Error::Forged {
                what: "manifest".into(),
                why: "not a codebox snapshot manifest (truncated or overwritten)".into(),
            });
        }
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != VERSION {
            return Err(Error::Version { found: version });
        }
        let id: [u8; KEY_ID_LEN] = bytes[10..10 + KEY_ID_LEN].try_into().expect("length");
        if id != key.id() {
            return Err(Error::OtherKey {
                found: hex(&id),
                ours: key.id_hex(),
            });
        }
        let aad = &bytes[..10 + KEY_ID_LEN];
        let nonce: [u8; XNONCE_LEN] = bytes[10 + KEY_ID_LEN..HEADER].try_into().expect("length");
        let json = key
            .open(aad, &nonce, &bytes[HEADER..])
            .ok_or_else(|| Error::Forged {
                what: "manifest".into(),
                why: "it does not authenticate with this server's key".into(),
            })?;
        let m: Manifest = serde_json::from_slice(&json).map_err(|e| Error::Format {
            why: format!("the manifest authenticates but cannot be read: {e}"),
        })?;
        for p in &m.parts {
            if p.kind().is_none() {
                return Err(Error::UnknownPart {
                    kind: p.kind.clone(),
                });
            }
            if p.part_key().is_none() || !valid_file_name(&p.file) {
                return Err(Error::Format {
                    why: format!("part {:?} has a malformed entry", p.kind),
                });
            }
        }
        Ok(m)
    }
}

/// A part's file name: a plain name of `[a-z-]`, never a path.
fn valid_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name.bytes().all(|b| b.is_ascii_lowercase() || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Manifest {
        let key = PartKey::random().unwrap();
        Manifest {
            session: "cbx_0a0b0c0d_00112233445566778899aabbccddeeff".into(),
            owner: "alice".into(),
            generation: 3,
            created_unix: 1,
            paused_unix: 2,
            paused_by: "-/0a0b0c0d".into(),
            backend: "namespace".into(),
            state: StateKind::Files,
            languages: vec!["python".into()],
            keep_alive: vec![],
            workspace: WorkspaceFacts::default(),
            quota_bytes: 1 << 20,
            max_entries: 10,
            parts: vec![PartEntry::new(PartKind::Workspace, &key, 5)],
        }
    }

    fn key(b: u8) -> SnapshotKey {
        let mut raw = [b; 32];
        raw[0] = 0;
        SnapshotKey::from_bytes(&raw)
    }

    #[test]
    fn a_manifest_round_trips_and_every_alteration_is_named() {
        let k = key(1);
        let m = sample();
        let bytes = m.seal(&k).unwrap();
        let back = Manifest::open(&k, &bytes).unwrap();
        assert_eq!(back.session, m.session);
        assert_eq!(back.generation, 3);
        assert!(back.part(PartKind::Workspace).unwrap().part_key().is_some());
        assert!(back.part(PartKind::VmMemory).is_none());
        // Another key: named as such, with both ids.
        let e = Manifest::open(&key(2), &bytes).unwrap_err();
        assert!(matches!(e, Error::OtherKey { .. }), "{e}");
        // The key id in clear changed to ours: still refused (it is authenticated).
        let mut relabelled = m.seal(&key(2)).unwrap();
        relabelled[10..18].copy_from_slice(&k.id());
        assert!(matches!(
            Manifest::open(&k, &relabelled),
            Err(Error::Forged { .. })
        ));
        // A flipped bit in the ciphertext, a truncation, garbage, a newer version.
        let mut bad = bytes.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert!(matches!(
            Manifest::open(&k, &bad),
            Err(Error::Forged { .. })
        ));
        assert!(matches!(
            Manifest::open(&k, &bytes[..bytes.len() - 3]),
            Err(Error::Forged { .. })
        ));
        assert!(matches!(
            Manifest::open(&k, b"hello"),
            Err(Error::Forged { .. })
        ));
        let mut newer = bytes.clone();
        newer[8] = 9;
        assert!(matches!(
            Manifest::open(&k, &newer),
            Err(Error::Version { found: 9 })
        ));
        assert!(matches!(
            Manifest::open(&k, &vec![0u8; MAX_BYTES + 1]),
            Err(Error::Forged { .. })
        ));
    }

    #[test]
    fn unknown_parts_and_path_like_file_names_are_refused() {
        let k = key(1);
        let mut m = sample();
        m.parts[0].kind = "vm-gpu".into();
        let e = Manifest::open(&k, &m.seal(&k).unwrap()).unwrap_err();
        assert!(e.to_string().contains("vm-gpu"), "{e}");
        let mut m = sample();
        m.parts[0].file = "../../etc/passwd".into();
        assert!(matches!(
            Manifest::open(&k, &m.seal(&k).unwrap()),
            Err(Error::Format { .. })
        ));
    }
}
