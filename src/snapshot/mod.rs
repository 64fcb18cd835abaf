//! Paused sessions on disk: snapshots in `[sessions] dir` (default `<state_dir>/sessions`),
//! encrypted at rest with the operator's key, bound to their session and owner, written
//! atomically, and resumable by any server (or replica) that shares the directory and the
//! key.
//!
//! # What a snapshot is
//!
//! A directory `snap.<generation>/` holding a sealed [`manifest`] and one file per part.
//! The parts are typed ([`PartKind`]): `workspace` (the session's `/workspace` as an
//! [`archive`] stream), `pii-vault` (its PII token map, when it has one), and on the
//! microVM backend `vm-memory` and `vm-devices`. Each part is encrypted as it streams
//! ([`stream`]) with a random key of its own, which only the sealed manifest holds.
//! Nothing is buffered whole: a 256 MiB workspace passes through 64 KiB buffers.
//!
//! # Layout
//!
//! ```text
//! <dir>/<slot>/              slot = HMAC(key, session id): the id is never a file name
//!     log.<seq>              the ledger: one MAC'd entry per state change, never rewritten
//!     snap.<gen>/            a whole snapshot: manifest + parts
//!     .tmp.<random>/         one being written (never read)
//! ```
//!
//! The ledger ([`ledger`]) is the commit point and the only mutable state: its highest
//! entry says whether the session is `paused` (at which generation), `live` (claimed by a
//! server, with the generation it resumed from kept as the fallback), or `ended` (closed or
//! expired: its snapshots are removed). A new entry `log.<seq+1>` is published with
//! `link(2)` from a fully written temporary file, which fails if the name exists: a
//! compare-and-swap that works on local filesystems and NFS alike, so two servers racing
//! to resume one session cannot both win.
//!
//! # What is authenticated, and what an attacker with write access to the directory can do
//!
//! The manifest is sealed (XChaCha20-Poly1305) with a subkey of the operator's key; its
//! associated data is the format's magic and version and the key's id, and its content
//! names the session id, the owner, the generation and each part's key and length.
//! Ledger entries carry an HMAC over their slot, sequence number and text. So, without the
//! key, someone who can write the directory:
//!
//! - cannot read a workspace, learn a session id or a client's name from file names, or
//!   make any change a resume would accept: a flipped bit, a truncation, a part taken from
//!   another snapshot, a snapshot sealed with another key, one of another session id or of
//!   another owner — each is refused, named ([`Error`]), before anything becomes visible to
//!   the session (a restore fills a fresh filesystem that is thrown away unless every part
//!   authenticated to its end);
//! - cannot replay an older snapshot of a session under its current ledger: the manifest's
//!   generation must be the one the ledger's head names ([`Error::Replayed`]), and a ledger
//!   entry cannot be renumbered (its MAC binds its sequence number);
//! - cannot roll one slot back unnoticed by a server that saw a later state: each server
//!   remembers the highest ledger entry it saw per slot ([`Error::RolledBack`]);
//! - **can** roll a whole slot back to an earlier consistent state (its old ledger entries
//!   and the snapshot they named, copied earlier) for a server that has not seen the later
//!   one (e.g. after a restart): nothing in a directory the attacker controls can prove
//!   freshness. That puts back files the owner had at an earlier pause; it cannot move
//!   data to another session or owner, forge content, or read anything. An operator who
//!   needs more keeps the directory where only codebox writes it;
//! - can delete snapshots (denial of service), which no format prevents.
//!
//! # Crash safety (what a `kill -9` leaves, step by step)
//!
//! A pause writes `.tmp.<random>/` (each part fsynced, the manifest last, the directory
//! fsynced), renames it to `snap.<gen>/`, fsyncs the slot, then links the ledger entry
//! `paused <gen>`, fsyncs, and only then removes the previous snapshot. Killed before the
//! rename: a `.tmp` directory nobody reads (removed later). Killed between rename and
//! ledger: an unreferenced `snap.<gen>` (removed later); the ledger still names the last
//! whole snapshot. Killed after the ledger: the old snapshot is unreferenced (removed
//! later). In every case the ledger names a whole snapshot, and the live session was never
//! touched: a failed pause leaves it running as it was.
//!
//! # The seam for the microVM backend
//!
//! The store is backend-blind: a pause hands it parts through [`SnapshotWriter::part`] (an
//! `io::Write` that encrypts), a resume reads them through [`SnapshotReader::part`]. The
//! session code ([`crate::session::persist`]) asks its backend what of the live state a
//! pause keeps ([`crate::session::persist::backend_state`]): the namespace backend keeps
//! nothing of the interpreter ([`StateKind::Files`]); the microVM backend will write
//! `vm-memory` and `vm-devices` next to `workspace` and report [`StateKind::Vm`].

pub mod archive;
pub mod config;
pub mod keys;
pub mod ledger;
pub mod manifest;
pub mod store;
pub mod stream;

pub use config::{OnIdle, PersistSettings, SessionsSection};
pub use keys::SnapshotKey;
pub use manifest::{Manifest, PartKind, StateKind, WorkspaceFacts};
pub use store::{Claimed, Holder, PausedInfo, SnapshotReader, SnapshotWriter, Store};

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the snapshot key is not usable: {why}")]
    BadKey { why: String },
    #[error("cannot draw random bytes")]
    Random(#[source] getrandom::Error),
    #[error("encryption failed ({0})")]
    Crypto(&'static str),
    #[error("cannot {doing} {path}")]
    Io {
        doing: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the snapshot's {what} was altered or is not this session's: {why}")]
    Forged { what: String, why: String },
    #[error("the snapshot's {what} is truncated")]
    Truncated { what: String },
    #[error("the snapshot was sealed with another key (key id {found}; this server's is {ours}): another server's, or a key since replaced")]
    OtherKey { found: String, ours: String },
    #[error("{path} is empty (a crash while it was first written?): it cannot say which key this directory's snapshots are sealed with; remove it once every server given this directory has the same key")]
    EmptyKeyMarker { path: std::path::PathBuf },
    #[error("the snapshot is of format {found}, which this version cannot read")]
    Version { found: u16 },
    #[error("the snapshot holds a part this server cannot restore ({kind:?}): it was made by another backend or a newer version")]
    UnknownPart { kind: String },
    #[error("the snapshot is malformed: {why}")]
    Format { why: String },
    #[error("the snapshot belongs to another session (it names {found:?})")]
    OtherSession { found: String },
    #[error("the snapshot is of pause {found}, but the session's ledger names pause {expected}: an older snapshot was put back in place of the newer one")]
    Replayed { found: u64, expected: u64 },
    #[error("the session's ledger went back from entry {seen} to {found} since this server last read it: it was rolled back")]
    RolledBack { seen: u64, found: u64 },
    #[error("the session's ledger entry {seq} does not authenticate: {why}")]
    Ledger { seq: u64, why: String },
    #[error("no paused session")]
    NotFound,
    #[error("the session is live on {by} (since {since_s} s ago)")]
    LiveElsewhere { by: String, since_s: u64 },
    #[error("the session was {how} {ago_s} s ago")]
    Ended { how: String, ago_s: u64 },
    #[error("another server changed the session meanwhile ({what})")]
    Raced { what: String },
    #[error("the workspace cannot be saved or restored")]
    Archive(#[from] archive::ArchiveError),
    #[error("{0}")]
    Limit(String),
}

pub type Result<T> = std::result::Result<T, Error>;
