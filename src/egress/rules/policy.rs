//! The egress policy: which hosts a program may reach, which non-public addresses, which
//! credentials the proxy adds, and the per-execution limits; and a request's narrowing.
//!
//! Order of a decision: `deny` (first match wins; without a port a deny rule covers every
//! port), then `allow`, then every narrowing list of the request; after resolution every
//! address must be public or named by an `allow_private` rule.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use serde_json::json;

use crate::egress::config::NetworkSection;
use crate::egress::rules::address::{self, PrivateRule};
use crate::egress::rules::pattern::{Host, HostPattern, Target};
use crate::egress::secrets::credentials::credential;
pub(crate) use crate::egress::secrets::credentials::{Credential, Inject};
use crate::units::{parse_duration, parse_size};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("network.{field}: {reason}")]
    Invalid { field: String, reason: String },
    #[error("network: {pattern} is outside the server's allowlist")]
    OutsideAllowlist { pattern: String },
    #[error("network: {reason}")]
    BadRequestPattern { reason: String },
}

type Result<T> = std::result::Result<T, Error>;

/// Default [`Limits`]; see `NetworkSection` for what each bounds.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 64;
pub const DEFAULT_MAX_CONCURRENT: u32 = 16;
pub const DEFAULT_MAX_BYTES_UP: u64 = 64 << 20;
pub const DEFAULT_MAX_BYTES_DOWN: u64 = 256 << 20;
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// A request head must be complete this long after the proxy starts waiting for it.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head the proxy reads.
pub const MAX_HEAD_BYTES: usize = 64 << 10;

/// Per-execution bounds of the egress proxy.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub max_connections: u32,
    pub max_concurrent_connections: u32,
    pub max_bytes_up: u64,
    pub max_bytes_down: u64,
    pub connect_timeout: Duration,
    pub idle_timeout: Duration,
    pub head_timeout: Duration,
    pub max_head_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_concurrent_connections: DEFAULT_MAX_CONCURRENT,
            max_bytes_up: DEFAULT_MAX_BYTES_UP,
            max_bytes_down: DEFAULT_MAX_BYTES_DOWN,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            head_timeout: HEAD_TIMEOUT,
            max_head_bytes: MAX_HEAD_BYTES,
        }
    }
}

/// The server's egress policy, checked and with its secrets resolved.
#[derive(Debug, Clone)]
pub struct EgressPolicy {
    allow: Vec<HostPattern>,
    deny: Vec<HostPattern>,
    /// Allowed hosts reached only after the user's approval.
    approve: Vec<HostPattern>,
    allow_private: Vec<PrivateRule>,
    credentials: Vec<Credential>,
    limits: Limits,
    extra_roots: Vec<PathBuf>,
}

/// A request's `network` argument, checked against the policy: every list must also match.
#[derive(Debug, Clone, Default)]
pub struct Narrowing {
    lists: Vec<Vec<HostPattern>>,
}

impl Narrowing {
    /// No narrowing: the policy alone decides.
    pub fn none() -> Narrowing {
        Narrowing::default()
    }

    fn allows(&self, target: &Target) -> bool {
        self.lists
            .iter()
            .all(|l| l.iter().any(|p| p.matches(target)))
    }
}

/// The policy's answer for a host, before resolution.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed {
        rule: String,
    },
    Denied {
        reason: String,
        rule: Option<String>,
    },
}

impl EgressPolicy {
    /// Validates every pattern (a clear error naming the bad entry and why) and resolves
    /// secrets (`env:VAR`) through `env`.
    pub fn from_section(
        section: &NetworkSection,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<EgressPolicy> {
        let patterns = |field: &str, list: &[String]| -> Result<Vec<HostPattern>> {
            list.iter()
                .map(|p| {
                    HostPattern::parse(p).map_err(|e| Error::Invalid {
                        field: field.to_string(),
                        reason: e.to_string(),
                    })
                })
                .collect()
        };
        let allow = patterns("allow", &section.allow)?;
        let deny = patterns("deny", &section.deny)?;
        let approve = patterns("approve", &section.approve)?;
        // An approve rule without a port gates the host on every port (as a deny rule
        // refuses it on every port): it must meet an allow rule on some port.
        let meets = |a: &HostPattern, p: &HostPattern| match p.port {
            Some(_) => a.overlaps(p),
            None => a.overlaps(&HostPattern {
                host: p.host.clone(),
                port: a.port,
            }),
        };
        if let Some(p) = approve.iter().find(|p| !allow.iter().any(|a| meets(a, p))) {
            return Err(Error::Invalid {
                field: "approve".into(),
                reason: format!("{p} is not in the allowlist"),
            });
        }
        let allow_private = section
            .allow_private
            .iter()
            .map(|r| {
                PrivateRule::parse(r).map_err(|e| Error::Invalid {
                    field: "allow_private".into(),
                    reason: e.to_string(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let limits = limits(section)?;
        let mut credentials = Vec::new();
        for (i, c) in section.credentials.iter().enumerate() {
            let cred = credential(c, i, env)?;
            let as_pattern = HostPattern {
                host: match &cred.host {
                    Host::Name(n) => crate::egress::rules::pattern::HostMatch::Exact(n.clone()),
                    Host::Ip(ip) => crate::egress::rules::pattern::HostMatch::Ip(*ip),
                },
                port: cred.port,
            };
            if !allow.iter().any(|a| a.overlaps(&as_pattern)) {
                return Err(Error::Invalid {
                    field: format!("credentials[{i}]"),
                    reason: format!("host {} is not in the allowlist", c.host),
                });
            }
            credentials.push(cred);
        }
        let secret_bytes: usize = credentials
            .iter()
            .flat_map(|c| c.secrets.iter().map(String::len))
            .sum();
        if secret_bytes > crate::egress::secrets::encodings::MAX_ALL_SECRETS_BYTES {
            return Err(Error::Invalid {
                field: "credentials".into(),
                reason: format!(
                    "the secrets are {secret_bytes} bytes in all (with the Bearer header values and query wire forms), more than {} (responses are searched for each in every encoding)",
                    crate::egress::secrets::encodings::MAX_ALL_SECRETS_BYTES
                ),
            });
        }
        Ok(EgressPolicy {
            allow,
            deny,
            approve,
            allow_private,
            credentials,
            limits,
            extra_roots: section.extra_roots.clone(),
        })
    }

    /// A request's `network` argument: host patterns that can only narrow the policy (a
    /// host must match the server's allow and the request's list; `[]` allows nothing). A
    /// pattern no allow rule can ever overlap is an error naming it.
    pub fn narrowed(&self, request: &[String]) -> Result<Narrowing> {
        let mut list = Vec::with_capacity(request.len());
        for text in request {
            let p = HostPattern::parse(text).map_err(|e| Error::BadRequestPattern {
                reason: e.to_string(),
            })?;
            if !self.allow.iter().any(|a| a.overlaps(&p)) {
                return Err(Error::OutsideAllowlist {
                    pattern: crate::egress::rules::pattern::clip(text),
                });
            }
            list.push(p);
        }
        Ok(Narrowing { lists: vec![list] })
    }

    /// The decision for `target` by name (addresses are checked after resolution).
    pub(crate) fn decide(&self, target: &Target, narrowing: &Narrowing) -> Verdict {
        if let Some(d) = self.deny.iter().find(|d| d.denies(target)) {
            return Verdict::Denied {
                reason: format!("denied by rule {d}"),
                rule: Some(d.to_string()),
            };
        }
        let Some(rule) = self.allow.iter().find(|a| a.matches(target)) else {
            return Verdict::Denied {
                reason: "not in allowlist".into(),
                rule: None,
            };
        };
        if !narrowing.allows(target) {
            return Verdict::Denied {
                reason: "not in this request's network list".into(),
                rule: None,
            };
        }
        Verdict::Allowed {
            rule: rule.to_string(),
        }
    }

    /// Whether any allowed host waits for the user's approval.
    pub fn gates_hosts(&self) -> bool {
        !self.approve.is_empty()
    }

    /// The `approve` rule that makes a connection to `target` (allowed already) wait for
    /// the user's approval, if one matches. Like a deny rule, one without a port covers
    /// the host on every port: `pay.example.org` gates `pay.example.org:8443` too when an
    /// allow rule lets that port through.
    pub(crate) fn approval_rule(&self, target: &Target) -> Option<String> {
        self.approve
            .iter()
            .find(|p| p.denies(target))
            .map(|p| p.to_string())
    }

    /// Whether the proxy may connect to `addr` (already canonical): `Ok(rule)` with the
    /// `allow_private` rule that let a non-public address through, `Err(reason)` if none.
    /// An address of the supervisor's own host (`host`: every interface's) is not public,
    /// whatever its range: it reaches the host's own services.
    pub fn check_address(
        &self,
        addr: SocketAddr,
        host: &[IpAddr],
    ) -> std::result::Result<Option<String>, String> {
        let class = address::non_public(addr.ip()).or_else(|| {
            host.contains(&addr.ip())
                .then_some("an address of this host")
        });
        match class {
            None => Ok(None),
            Some(class) => match self.allow_private.iter().find(|r| r.matches(addr)) {
                Some(rule) => Ok(Some(rule.to_string())),
                None => Err(format!("private address {}: {class}", addr.ip())),
            },
        }
    }

    /// The credentials for `target` over TLS (`tls`) or plain HTTP.
    pub(crate) fn credentials_for(&self, target: &Target, tls: bool) -> Vec<&Credential> {
        self.credentials
            .iter()
            .filter(|c| c.applies_to(target, tls))
            .collect()
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The same policy with other limits (tests; a caller that sets the head bounds).
    pub fn with_limits(mut self, limits: Limits) -> EgressPolicy {
        self.limits = limits;
        self
    }

    pub fn extra_roots(&self) -> &[PathBuf] {
        &self.extra_roots
    }

    /// For `health`: the rules, the credential hosts (never their values) and the limits.
    pub fn summary(&self) -> serde_json::Value {
        let strings = |v: &[HostPattern]| v.iter().map(|p| p.to_string()).collect::<Vec<_>>();
        let l = &self.limits;
        json!({
            "allow": strings(&self.allow),
            "deny": strings(&self.deny),
            "approve": strings(&self.approve),
            "allow_private": self.allow_private.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
            "credentials": self.credentials.iter().map(|c| json!({
                "host": match c.port {
                    Some(p) => format!("{}:{p}", c.host),
                    None => c.host.to_string(),
                },
                "adds": c.adds(),
                "allow_plain_http": c.allow_plain_http,
            })).collect::<Vec<_>>(),
            "limits": {
                "max_connections": l.max_connections,
                "max_concurrent_connections": l.max_concurrent_connections,
                "max_bytes_up": l.max_bytes_up,
                "max_bytes_down": l.max_bytes_down,
                "connect_timeout_ms": l.connect_timeout.as_millis() as u64,
                "idle_timeout_ms": l.idle_timeout.as_millis() as u64,
                "head_timeout_ms": l.head_timeout.as_millis() as u64,
                "max_head_bytes": l.max_head_bytes,
            },
        })
    }

    /// Every configured secret value (and whole header values), for redaction of results.
    pub fn secret_values(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .credentials
            .iter()
            .flat_map(|c| c.secrets.iter().cloned())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    pub fn has_credentials(&self) -> bool {
        !self.credentials.is_empty()
    }
}

fn limits(s: &NetworkSection) -> Result<Limits> {
    let invalid = |field: &str, reason: String| Error::Invalid {
        field: field.into(),
        reason,
    };
    let size = |field: &str, v: &Option<String>, default: u64| -> Result<u64> {
        match v {
            None => Ok(default),
            Some(t) => match parse_size(t) {
                Ok(0) => Err(invalid(field, "must be more than 0".into())),
                Ok(n) => Ok(n),
                Err(e) => Err(invalid(field, e)),
            },
        }
    };
    let duration = |field: &str, v: &Option<String>, default: Duration| -> Result<Duration> {
        match v {
            None => Ok(default),
            Some(t) => parse_duration(t).map_err(|e| invalid(field, e)),
        }
    };
    let count = |field: &str, v: Option<u32>, default: u32| -> Result<u32> {
        match v {
            Some(0) => Err(invalid(field, "must be at least 1".into())),
            Some(n) => Ok(n),
            None => Ok(default),
        }
    };
    Ok(Limits {
        max_connections: count(
            "max_connections",
            s.max_connections,
            DEFAULT_MAX_CONNECTIONS,
        )?,
        max_concurrent_connections: count(
            "max_concurrent_connections",
            s.max_concurrent_connections,
            DEFAULT_MAX_CONCURRENT,
        )?,
        max_bytes_up: size("max_bytes_up", &s.max_bytes_up, DEFAULT_MAX_BYTES_UP)?,
        max_bytes_down: size("max_bytes_down", &s.max_bytes_down, DEFAULT_MAX_BYTES_DOWN)?,
        connect_timeout: duration(
            "connect_timeout",
            &s.connect_timeout,
            DEFAULT_CONNECT_TIMEOUT,
        )?,
        idle_timeout: duration("idle_timeout", &s.idle_timeout, DEFAULT_IDLE_TIMEOUT)?,
        head_timeout: HEAD_TIMEOUT,
        max_head_bytes: MAX_HEAD_BYTES,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(allow: &[&str], deny: &[&str]) -> NetworkSection {
        NetworkSection {
            allow: allow.iter().map(|s| s.to_string()).collect(),
            deny: deny.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn target(s: &str) -> Target {
        Target::parse_authority(s, None).unwrap()
    }

    fn policy(allow: &[&str], deny: &[&str]) -> EgressPolicy {
        EgressPolicy::from_section(&section(allow, deny), &no_env).unwrap()
    }

    #[test]
    fn deny_wins_over_allow() {
        let p = policy(&["*.example.org", "api.example.com"], &["evil.example.org"]);
        let n = Narrowing::none();
        assert_eq!(
            p.decide(&target("a.example.org:443"), &n),
            Verdict::Allowed {
                rule: "*.example.org".into()
            }
        );
        assert_eq!(
            p.decide(&target("EVIL.example.org.:443"), &n),
            Verdict::Denied {
                reason: "denied by rule evil.example.org".into(),
                rule: Some("evil.example.org".into())
            }
        );
        assert_eq!(
            p.decide(&target("other.example:443"), &n),
            Verdict::Denied {
                reason: "not in allowlist".into(),
                rule: None
            }
        );
    }

    #[test]
    fn approve_rules_name_allowed_hosts_that_wait_for_the_user() {
        let mut s = section(&["*.example.org", "api.example.com"], &[]);
        s.approve = vec!["pay.example.org".into()];
        let p = EgressPolicy::from_section(&s, &no_env).unwrap();
        assert_eq!(
            p.approval_rule(&target("PAY.example.org:443")),
            Some("pay.example.org".into())
        );
        assert_eq!(p.approval_rule(&target("a.example.org:443")), None);
        assert_eq!(
            p.summary()["approve"],
            serde_json::json!(["pay.example.org"])
        );
        s.approve = vec!["elsewhere.example".into()];
        let e = EgressPolicy::from_section(&s, &no_env).unwrap_err();
        assert_eq!(
            e.to_string(),
            "network.approve: elsewhere.example is not in the allowlist"
        );
    }

    /// An approve rule without a port gates the host on every port an allow rule opens:
    /// `pay.example.org` was asked about on 443 but not on 8443 (`*.example.org:8443`).
    #[test]
    fn an_approve_rule_without_a_port_covers_every_allowed_port() {
        let mut s = section(&["*.example.org", "*.example.org:8443"], &[]);
        s.approve = vec!["pay.example.org".into()];
        let p = EgressPolicy::from_section(&s, &no_env).unwrap();
        for t in [
            "pay.example.org:443",
            "pay.example.org:8443",
            "PAY.example.org.:8443",
        ] {
            assert_eq!(
                p.approval_rule(&target(t)),
                Some("pay.example.org".into()),
                "{t}"
            );
        }
        assert_eq!(p.approval_rule(&target("a.example.org:8443")), None);
        // Allowed only on another port: still a host of the allowlist.
        let mut s = section(&["pay.example.org:8443"], &[]);
        s.approve = vec!["pay.example.org".into()];
        let p = EgressPolicy::from_section(&s, &no_env).unwrap();
        assert!(p.approval_rule(&target("pay.example.org:8443")).is_some());
        // A port on the approve rule keeps it to that port.
        let mut s = section(&["*.example.org", "*.example.org:8443"], &[]);
        s.approve = vec!["pay.example.org:8443".into()];
        let p = EgressPolicy::from_section(&s, &no_env).unwrap();
        assert_eq!(p.approval_rule(&target("pay.example.org:443")), None);
    }

    /// A deny rule without a port denies the host on every port: "default ports" is what
    /// an allow rule grants, not the reach of a refusal. `evil.example.org` was denied on
    /// 443 but allowed on 8443 by `*.example.org:8443`.
    #[test]
    fn a_deny_rule_without_a_port_covers_every_port() {
        let p = policy(
            &["*.example.org", "*.example.org:8443", "*:22"],
            &["evil.example.org", "*.bad.example.org", "1.2.3.4"],
        );
        let n = Narrowing::none();
        for t in [
            "evil.example.org:443",
            "evil.example.org:8443",
            "x.bad.example.org:8443",
            "1.2.3.4:22",
        ] {
            assert!(
                matches!(
                    p.decide(&target(t), &n),
                    Verdict::Denied { rule: Some(_), .. }
                ),
                "{t}: {:?}",
                p.decide(&target(t), &n)
            );
        }
        assert!(matches!(
            p.decide(&target("good.example.org:8443"), &n),
            Verdict::Allowed { .. }
        ));
        // With a port, a deny rule is for that port only.
        let q = policy(
            &["*.example.org:8443", "*.example.org"],
            &["a.example.org:8443"],
        );
        assert!(matches!(
            q.decide(&target("a.example.org:443"), &n),
            Verdict::Allowed { .. }
        ));
        assert!(matches!(
            q.decide(&target("a.example.org:8443"), &n),
            Verdict::Denied { .. }
        ));
    }

    #[test]
    fn bad_entries_are_named() {
        let err = EgressPolicy::from_section(&section(&["ok.example", "a..b"], &[]), &no_env)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "network.allow: \"a..b\" is not a valid host pattern: it has an empty label"
        );
        let mut s = section(&["a.example"], &[]);
        s.allow_private = vec!["localhost".into()];
        let err = EgressPolicy::from_section(&s, &no_env)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("network.allow_private: allow_private entry \"localhost\""),
            "{err}"
        );
        let mut s = section(&["a.example"], &[]);
        s.max_bytes_down = Some("lots".into());
        assert!(EgressPolicy::from_section(&s, &no_env)
            .unwrap_err()
            .to_string()
            .contains("max_bytes_down"));
        s.max_bytes_down = None;
        s.connect_timeout = Some("0".into());
        assert!(EgressPolicy::from_section(&s, &no_env).is_err());
        s.connect_timeout = Some("250ms".into());
        let p = EgressPolicy::from_section(&s, &no_env).unwrap();
        assert_eq!(p.limits().connect_timeout, Duration::from_millis(250));
    }

    #[test]
    fn narrowing_never_widens() {
        let p = policy(&["*.example.org", "api.example.com:443"], &[]);
        let n = p.narrowed(&["a.example.org".into()]).unwrap();
        assert!(matches!(
            p.decide(&target("a.example.org:443"), &n),
            Verdict::Allowed { .. }
        ));
        assert_eq!(
            p.decide(&target("b.example.org:443"), &n),
            Verdict::Denied {
                reason: "not in this request's network list".into(),
                rule: None
            }
        );
        assert!(matches!(
            p.decide(&target("api.example.com:443"), &n),
            Verdict::Denied { .. }
        ));

        // [] allows nothing.
        let none = p.narrowed(&[]).unwrap();
        assert!(matches!(
            p.decide(&target("a.example.org:443"), &none),
            Verdict::Denied { .. }
        ));

        // A wider pattern does not widen: `*` narrows to what the server allows anyway.
        let wide = p.narrowed(&["*".into()]).unwrap();
        assert!(matches!(
            p.decide(&target("other.example:443"), &wide),
            Verdict::Denied { .. }
        ));
        assert!(matches!(
            p.decide(&target("api.example.com:443"), &wide),
            Verdict::Allowed { .. }
        ));

        // Outside the allowlist: an error naming it.
        let err = p.narrowed(&["x.com".into()]).unwrap_err().to_string();
        assert_eq!(err, "network: x.com is outside the server's allowlist");
        assert!(
            p.narrowed(&["example.org".into()]).is_err(),
            "the apex is not below *.example.org"
        );
        assert!(
            p.narrowed(&["api.example.com:80".into()]).is_err(),
            "another port"
        );
        let err = p.narrowed(&["a..b".into()]).unwrap_err().to_string();
        assert!(
            err.starts_with("network: \"a..b\" is not a valid host pattern"),
            "{err}"
        );
    }

    #[test]
    fn addresses_need_allow_private() {
        let mut s = section(&["*"], &[]);
        s.allow_private = vec!["127.0.0.1:8443".into(), "10.0.0.0/8".into()];
        let p = EgressPolicy::from_section(&s, &no_env).unwrap();
        assert_eq!(
            p.check_address("93.184.216.34:443".parse().unwrap(), &[]),
            Ok(None)
        );
        assert_eq!(
            p.check_address("127.0.0.1:8443".parse().unwrap(), &[]),
            Ok(Some("127.0.0.1:8443".into()))
        );
        assert_eq!(
            p.check_address("127.0.0.1:443".parse().unwrap(), &[]),
            Err("private address 127.0.0.1: loopback".into())
        );
        assert_eq!(
            p.check_address("10.9.9.9:1".parse().unwrap(), &[]),
            Ok(Some("10.0.0.0/8".into()))
        );
        assert_eq!(
            p.check_address("169.254.169.254:80".parse().unwrap(), &[]),
            Err("private address 169.254.169.254: cloud metadata".into())
        );
    }

    #[test]
    fn an_address_of_this_host_is_not_public() {
        let mut s = section(&["*"], &[]);
        s.allow_private = vec!["11.0.0.2:8443".into()];
        let p = EgressPolicy::from_section(&s, &no_env).unwrap();
        let host: Vec<IpAddr> = vec![
            "11.0.0.1".parse().unwrap(),
            "11.0.0.2".parse().unwrap(),
            "2a00:1450::5".parse().unwrap(),
        ];
        assert_eq!(
            p.check_address("11.0.0.1:443".parse().unwrap(), &host),
            Err("private address 11.0.0.1: an address of this host".into())
        );
        assert_eq!(
            p.check_address("[2a00:1450::5]:443".parse().unwrap(), &host),
            Err("private address 2a00:1450::5: an address of this host".into())
        );
        assert_eq!(
            p.check_address("11.0.0.3:443".parse().unwrap(), &host),
            Ok(None),
            "a neighbour is not this host"
        );
        assert_eq!(
            p.check_address("11.0.0.2:8443".parse().unwrap(), &host),
            Ok(Some("11.0.0.2:8443".into())),
            "allow_private can name one"
        );
    }
}
