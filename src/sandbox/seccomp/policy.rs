//! The policy schema: seccompiler's JSON format, narrowed to what codebox's deny-lists need,
//! plus the checks seccompiler does not make.
//!
//! A policy file maps filter names to seccompiler filters. The names are fixed, and each
//! says what its rules do:
//!
//! | name           | `match_action`      | evaluated |
//! |----------------|---------------------|-----------|
//! | `kill_process` | `"kill_process"`    | first     |
//! | `enosys`       | `{"errno": 38}`     | second    |
//! | `eperm`        | `{"errno": 1}`      | third     |
//!
//! Every filter's `mismatch_action` is `"allow"` (a deny-list). Checked here, on top of
//! seccompiler's own parsing (which already rejects unknown keys inside a filter):
//! - the file is at most [`MAX_POLICY_BYTES`];
//! - no filter name outside the table, none twice;
//! - every rule and every argument condition carries a non-empty `comment`, and a rule's
//!   comment starts with its action (`KILL:`, `ENOSYS:`, `EPERM:`), so the file reads true;
//! - a `dword` condition's value and mask fit in 32 bits (seccompiler would compare only
//!   their low half);
//! - no syscall is listed both with and without `args` in one filter (seccompiler would
//!   silently keep only the conditional rules), nor unconditionally twice in a profile.

use std::collections::{BTreeMap, BTreeSet};

use seccompiler::{SeccompAction, SeccompCmpArgLen, SeccompCmpOp};
use serde::Deserialize;

/// Largest policy file accepted, in bytes. The shipped profiles are ~14 KiB; anything near
/// the cap would also be near the kernel's 4096-instruction limit.
pub const MAX_POLICY_BYTES: usize = 64 * 1024;

/// What a filter's rules do, in evaluation order: the first filter whose rule matches a
/// syscall decides, so the harshest action comes first, as the kernel's own precedence
/// between stacked filters would have it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Action {
    /// `SECCOMP_RET_KILL_PROCESS`: the whole process dies with `SIGSYS`.
    KillProcess,
    /// `SECCOMP_RET_ERRNO | ENOSYS`: "this kernel does not have it".
    Enosys,
    /// `SECCOMP_RET_ERRNO | EPERM`: "not allowed".
    Eperm,
}

impl Action {
    pub const ALL: [Action; 3] = [Action::KillProcess, Action::Enosys, Action::Eperm];

    /// The filter's name in a policy file.
    pub fn filter_name(self) -> &'static str {
        match self {
            Action::KillProcess => "kill_process",
            Action::Enosys => "enosys",
            Action::Eperm => "eperm",
        }
    }

    /// The seccompiler action the filter must declare.
    pub fn seccomp_action(self) -> SeccompAction {
        match self {
            Action::KillProcess => SeccompAction::KillProcess,
            Action::Enosys => SeccompAction::Errno(libc::ENOSYS as u32),
            Action::Eperm => SeccompAction::Errno(libc::EPERM as u32),
        }
    }

    /// How each rule's comment in the filter must start.
    pub fn comment_tag(self) -> &'static str {
        match self {
            Action::KillProcess => "KILL:",
            Action::Enosys => "ENOSYS:",
            Action::Eperm => "EPERM:",
        }
    }
}

/// A policy file as codebox reads it. Serde rejects any other top-level key and any key
/// given twice.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyDoc {
    pub kill_process: Option<FilterDoc>,
    pub enosys: Option<FilterDoc>,
    pub eperm: Option<FilterDoc>,
}

/// One seccompiler filter (only the canonical key names, not seccompiler's aliases).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilterDoc {
    pub mismatch_action: SeccompAction,
    pub match_action: SeccompAction,
    pub filter: Vec<RuleDoc>,
}

/// One rule: a syscall name and optional and-bound conditions.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleDoc {
    pub syscall: String,
    pub comment: Option<String>,
    pub args: Option<Vec<ConditionDoc>>,
}

/// One argument condition.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConditionDoc {
    pub index: u8,
    #[serde(rename = "type")]
    pub arg_len: SeccompCmpArgLen,
    pub op: SeccompCmpOp,
    pub val: u64,
    pub comment: Option<String>,
}

impl PolicyDoc {
    /// The filters present, in evaluation order.
    pub fn filters(&self) -> Vec<(Action, &FilterDoc)> {
        Action::ALL
            .into_iter()
            .filter_map(|a| self.filter(a).map(|f| (a, f)))
            .collect()
    }

    pub fn filter(&self, action: Action) -> Option<&FilterDoc> {
        match action {
            Action::KillProcess => self.kill_process.as_ref(),
            Action::Enosys => self.enosys.as_ref(),
            Action::Eperm => self.eperm.as_ref(),
        }
    }
}

/// A broken policy: either the JSON does not fit the schema, or it breaks a rule of it.
#[derive(Debug)]
pub enum Problem {
    Json(serde_json::Error),
    Rule(String),
}

/// Parses and checks a policy; `Ok` means seccompiler may compile it.
pub fn check(json: &[u8]) -> Result<PolicyDoc, Problem> {
    let doc: PolicyDoc = serde_json::from_slice(json).map_err(Problem::Json)?;
    let filters = doc.filters();
    if filters.is_empty() {
        return Err(Problem::Rule(
            "no filter: expected at least one of kill_process, enosys, eperm".into(),
        ));
    }
    // Syscalls refused whatever their arguments, and by which filter.
    let mut unconditional: BTreeMap<&str, Action> = BTreeMap::new();
    for (action, filter) in filters {
        let name = action.filter_name();
        if filter.mismatch_action != SeccompAction::Allow {
            return Err(Problem::Rule(format!(
                "filter {name}: mismatch_action must be \"allow\" (policies are deny-lists)"
            )));
        }
        if filter.match_action != action.seccomp_action() {
            return Err(Problem::Rule(format!(
                "filter {name}: match_action must be {:?}, found {:?}",
                action.seccomp_action(),
                filter.match_action
            )));
        }
        if filter.filter.is_empty() {
            return Err(Problem::Rule(format!(
                "filter {name} has no rules; leave it out instead"
            )));
        }
        let mut conditional: BTreeSet<&str> = BTreeSet::new();
        let mut plain: BTreeSet<&str> = BTreeSet::new();
        for rule in &filter.filter {
            let sc = rule.syscall.as_str();
            match rule.comment.as_deref().map(str::trim) {
                Some(c) if c.starts_with(action.comment_tag()) => {}
                Some(c) if !c.is_empty() => {
                    return Err(Problem::Rule(format!(
                        "filter {name}, rule {sc}: the comment must start with {:?} (the \
                         action the rule takes), found {c:?}",
                        action.comment_tag()
                    )))
                }
                _ => {
                    return Err(Problem::Rule(format!(
                        "filter {name}, rule {sc}: missing comment (say why the rule is there)"
                    )))
                }
            }
            match &rule.args {
                Some(args) => {
                    if args.is_empty() {
                        return Err(Problem::Rule(format!(
                            "filter {name}, rule {sc}: empty args (leave args out to match \
                             every call)"
                        )));
                    }
                    for (i, a) in args.iter().enumerate() {
                        check_condition(a).map_err(|p| {
                            Problem::Rule(format!("filter {name}, rule {sc}: condition {i} {p}"))
                        })?;
                    }
                    conditional.insert(sc);
                }
                None => {
                    if !plain.insert(sc) {
                        return Err(Problem::Rule(format!(
                            "filter {name}: {sc} is listed twice"
                        )));
                    }
                    if let Some(other) = unconditional.insert(sc, action) {
                        return Err(Problem::Rule(format!(
                            "{sc} is refused unconditionally by both {} and {name}",
                            other.filter_name()
                        )));
                    }
                }
            }
        }
        if let Some(sc) = conditional.intersection(&plain).next() {
            return Err(Problem::Rule(format!(
                "filter {name}: {sc} has rules with and without args; seccompiler would keep \
                 only the ones with args"
            )));
        }
    }
    Ok(doc)
}

fn check_condition(c: &ConditionDoc) -> Result<(), String> {
    if c.comment.as_deref().map(str::trim).unwrap_or("").is_empty() {
        return Err("has no comment (say what the number means)".into());
    }
    if c.index > 5 {
        return Err(format!(
            "has index {}; syscalls take arguments 0 to 5",
            c.index
        ));
    }
    // A dword condition compares the low 32 bits of the argument with the low 32 bits of
    // the value and the mask; anything above them would be dropped without a word.
    if c.arg_len == SeccompCmpArgLen::Dword {
        let mask = match c.op {
            SeccompCmpOp::MaskedEq(m) => m,
            _ => 0,
        };
        if c.val > u64::from(u32::MAX) || mask > u64::from(u32::MAX) {
            return Err("is a dword compare with a value or mask over 32 bits".into());
        }
    }
    Ok(())
}
