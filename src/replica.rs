//! A replica's identity, when several `codebox serve --http` processes stand behind one
//! load balancer.
//!
//! Executions without a session hold no state between calls, so any replica may take
//! them. A session (its `/workspace`, its live interpreters) and a 2025-11-25 client's MCP
//! session live in one process. Their ids therefore carry the name of the replica that
//! made them, `<replica>.<id>`, and a balancer routes on that prefix:
//!
//! - The execute tools' and `close_session`'s `session` argument is annotated with
//!   `x-mcp-header: "Session"` (SEP-2243), so a 2026-07-28 client mirrors it into the
//!   `Mcp-Param-Session` request header; a balancer reads the header, never the body.
//! - A 2025-11-25 client sends its `Mcp-Session-Id` with every request.
//! - Every HTTP answer carries `Codebox-Replica: <name>`.
//!
//! The rule a balancer applies: the part of `Mcp-Session-Id` (an MCP session exists on
//! one replica only), else of `Mcp-Param-Session`, before the first `.` names the
//! replica; without either, any ready replica. A replica that gets an id another replica made
//! answers with [`Placement::Elsewhere`]'s clear error instead of "unknown session".
//!
//! Names are DNS labels (`[a-z0-9-]`, at most 63, no leading or trailing `-`): what a
//! Kubernetes StatefulSet's pod names are, and safe for a balancer to put into a DNS
//! query or compare with a server name.

use std::fmt;

/// The header every HTTP answer names its replica in.
pub const RESPONSE_HEADER: &str = "codebox-replica";

/// The SEP-2243 `x-mcp-header` token of the `session` argument: clients send it as
/// `Mcp-Param-Session`.
pub const SESSION_PARAM_TOKEN: &str = "Session";

/// What separates the replica's name from the rest of an id.
const SEPARATOR: char = '.';

/// Longest name: one DNS label.
const MAX_NAME_LEN: usize = 63;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("replica name {name:?} is not a DNS label: 1 to 63 of a-z, 0-9 and '-', not starting or ending with '-'")]
    BadName { name: String },
}

/// This replica's name (validated).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReplicaName(String);

impl ReplicaName {
    pub fn parse(name: &str) -> Result<ReplicaName, Error> {
        let bad = || Error::BadName {
            name: name.to_string(),
        };
        let ok_chars = name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if name.is_empty()
            || name.len() > MAX_NAME_LEN
            || !ok_chars
            || name.starts_with('-')
            || name.ends_with('-')
        {
            return Err(bad());
        }
        Ok(ReplicaName(name.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `id` as this replica hands it out: `<name>.<id>`.
    pub fn qualify(&self, id: &str) -> String {
        format!("{}{SEPARATOR}{id}", self.0)
    }
}

impl fmt::Display for ReplicaName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where an id someone presents was made, seen from this process.
#[derive(Debug, PartialEq, Eq)]
pub enum Placement<'a> {
    /// Here (or this process has no name and the id names none): look it up.
    Here,
    /// By the replica named: not here, and it cannot be here.
    Elsewhere { owner: &'a str },
    /// Not an id any replica of this deployment makes (no name where one is expected,
    /// or one where none is): answered like any unknown id.
    Foreign,
}

/// Where `id` was made, given this process's name (`None`: a single server).
pub fn placement<'a>(here: Option<&ReplicaName>, id: &'a str) -> Placement<'a> {
    let named = id
        .split_once(SEPARATOR)
        .map(|(owner, _)| owner)
        .filter(|owner| ReplicaName::parse(owner).is_ok());
    match (here, named) {
        (Some(here), Some(owner)) if owner == here.as_str() => Placement::Here,
        (Some(_), Some(owner)) => Placement::Elsewhere { owner },
        (None, None) => Placement::Here,
        _ => Placement::Foreign,
    }
}

/// The message a client gets for an id another replica made.
pub fn elsewhere_message(what: &str, id: &str, owner: &str, here: &ReplicaName) -> String {
    let here = here.as_str();
    format!(
        "{what} {id:?} belongs to replica {owner:?}, and this is replica {here:?}: the load \
         balancer must send a request that names a session, task or execution \
         (Mcp-Session-Id, Mcp-Param-Session or Mcp-Name header) to the replica its id \
         starts with. If {owner:?} has stopped, its sessions are gone: start a new one"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> ReplicaName {
        ReplicaName::parse(s).unwrap()
    }

    #[test]
    fn names_are_dns_labels() {
        for good in ["a", "codebox-0", "r1", &"x".repeat(63)] {
            assert!(ReplicaName::parse(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "A",
            "a.b",
            "a_b",
            "a b",
            "é",
            "a\n",
            &"x".repeat(64),
        ] {
            assert_eq!(
                ReplicaName::parse(bad),
                Err(Error::BadName { name: bad.into() })
            );
        }
    }

    #[test]
    fn an_id_is_placed_by_its_prefix() {
        let r1 = name("codebox-1");
        let id = r1.qualify("cbx_00ff");
        assert_eq!(id, "codebox-1.cbx_00ff");
        assert_eq!(placement(Some(&r1), &id), Placement::Here);
        assert_eq!(
            placement(Some(&name("codebox-2")), &id),
            Placement::Elsewhere { owner: "codebox-1" }
        );
        // A single server takes unqualified ids only.
        assert_eq!(placement(None, "cbx_00ff"), Placement::Here);
        assert_eq!(placement(None, &id), Placement::Foreign);
        // A named replica never takes an unqualified id, nor one whose prefix is not a name.
        assert_eq!(placement(Some(&r1), "cbx_00ff"), Placement::Foreign);
        assert_eq!(placement(Some(&r1), "Codebox-1.cbx"), Placement::Foreign);
        assert_eq!(placement(Some(&r1), ".cbx"), Placement::Foreign);
        assert_eq!(placement(Some(&r1), "new"), Placement::Foreign);
        // Only the first separator counts: a trailing dot cannot forge the owner.
        assert_eq!(
            placement(Some(&r1), "codebox-2.codebox-1.x"),
            Placement::Elsewhere { owner: "codebox-2" }
        );
    }

    #[test]
    fn the_message_names_both_replicas_and_what_to_do() {
        let m = elsewhere_message("session", "r2.cbx_1", "r2", &name("r1"));
        assert!(
            m.starts_with(
                r#"session "r2.cbx_1" belongs to replica "r2", and this is replica "r1":"#
            ),
            "{m}"
        );
        assert!(
            m.contains("start a new one") && !m.contains("ReplicaName"),
            "{m}"
        );
    }
}
