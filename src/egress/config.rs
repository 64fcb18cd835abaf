//! The `[network]` TOML section, as written in sandbox profiles and in `codebox.toml`.
//!
//! This is the text as written; [`crate::egress::EgressPolicy::from_section`] checks every
//! pattern and resolves the secrets. Unknown keys are refused, as everywhere in codebox.

use std::fmt;
use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("network: give either `mode` or the older `enabled`, not both")]
    ModeAndEnabled,
}

/// What a sandbox's network namespace offers the program.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// No TCP/IP at all (landlock and seccomp): today's default.
    None,
    /// TCP/IP sockets inside the sandbox's own, empty network namespace (`lo` only).
    Loopback,
    /// `lo` only, and one way out: the supervisor's egress proxy on 127.0.0.1:3128.
    Proxy,
}

impl fmt::Display for NetworkMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NetworkMode::None => "no network",
            NetworkMode::Loopback => "loopback only",
            NetworkMode::Proxy => "through the egress proxy",
        })
    }
}

/// `[network]`: the mode, the host rules of the egress proxy, credentials and limits.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkSection {
    /// `"none"`, `"loopback"` or `"proxy"`.
    pub mode: Option<NetworkMode>,
    /// The key of older profiles: `true` = loopback, `false` = none. Both this and `mode`
    /// given is an error.
    pub enabled: Option<bool>,
    /// Host patterns the program may reach: `api.example.com`, `*.example.org:443`,
    /// `1.2.3.4`, `[2001:db8::1]:8443`; without a port, 80 and 443.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Same syntax; a host that matches a deny rule is refused whatever allows it.
    #[serde(default)]
    pub deny: Vec<String>,
    /// Same syntax; a host the allowlist lets through that matches one of these is
    /// reached only once the user approved it (`[approval]`; the CONNECT or request waits
    /// for the answer, a refusal is a 403 naming why). Each must overlap an allow rule.
    #[serde(default)]
    pub approve: Vec<String>,
    /// Non-public addresses that may be reached (`127.0.0.1:8443`, `10.0.0.0/8`,
    /// `[::1]:443`, `fd00::/8`): the only way past the private-address check.
    #[serde(default)]
    pub allow_private: Vec<String>,
    /// `[[network.credentials]]`: headers the proxy adds at the boundary.
    #[serde(default)]
    pub credentials: Vec<CredentialSection>,
    /// Connections one execution may open (default 64).
    pub max_connections: Option<u32>,
    /// Connections one execution may hold open at once (default 16).
    pub max_concurrent_connections: Option<u32>,
    /// Bytes one execution may send upstream, all connections together (default 64M).
    pub max_bytes_up: Option<String>,
    /// Bytes one execution may receive, all connections together (default 256M).
    pub max_bytes_down: Option<String>,
    /// Resolving and connecting to a host, together (default 10s).
    pub connect_timeout: Option<String>,
    /// A connection on which no byte moves either way this long is closed (default 60s).
    pub idle_timeout: Option<String>,
    /// PEM files of further CA roots trusted upstream (and by the sandbox's bundle).
    #[serde(default)]
    pub extra_roots: Vec<PathBuf>,
}

impl NetworkSection {
    /// The mode this section asks for: `mode`, else the legacy `enabled`, else `none`.
    pub fn effective_mode(&self) -> Result<NetworkMode, Error> {
        match (self.mode, self.enabled) {
            (Some(_), Some(_)) => Err(Error::ModeAndEnabled),
            (Some(mode), None) => Ok(mode),
            (None, Some(true)) => Ok(NetworkMode::Loopback),
            (None, Some(false)) | (None, None) => Ok(NetworkMode::None),
        }
    }
}

/// `[[network.credentials]]`: one header (or query parameter) the proxy adds to requests to
/// one exact host. The program never sees the value.
///
/// `host` is one exact host name or IP literal, with an optional `:port` (without one: 443,
/// and 80 when `allow_plain_http`). Wildcards are refused: a secret sent to every subdomain
/// of a name also reaches subdomains that serve other people's content.
#[derive(Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialSection {
    /// The one host (and port, default 443) the credential is added for: an exact name,
    /// no pattern.
    pub host: String,
    /// The header to set, e.g. `Authorization`, `X-Api-Key` (with `value`).
    pub header: Option<String>,
    /// The header's (or query parameter's) value, or `env:VAR`.
    pub value: Option<String>,
    /// Shorthand for `header = "Authorization"`, `value = "Bearer <this>"`; may be `env:VAR`.
    pub bearer: Option<String>,
    /// A query parameter to set to `value` instead of a header (APIs that take `?key=`).
    pub query: Option<String>,
    /// Credentials go only over TLS unless this is set: a program could otherwise ask for
    /// `http://` and have the secret sent in clear.
    #[serde(default)]
    pub allow_plain_http: bool,
}

/// A secret as it may be shown: `env:VAR` references as written, literal values never.
fn shown(secret: &Option<String>) -> Option<&str> {
    secret.as_deref().map(|v| {
        if v.starts_with("env:") {
            v
        } else {
            "<literal, not shown>"
        }
    })
}

impl fmt::Debug for CredentialSection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialSection")
            .field("host", &self.host)
            .field("header", &self.header)
            .field("value", &shown(&self.value))
            .field("bearer", &shown(&self.bearer))
            .field("query", &self.query)
            .field("allow_plain_http", &self.allow_plain_http)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<NetworkSection, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn modes_and_the_legacy_key() {
        let s = parse("mode = \"proxy\"\nallow = [\"a.example\"]").unwrap();
        assert_eq!(s.effective_mode().unwrap(), NetworkMode::Proxy);
        assert_eq!(
            parse("enabled = true").unwrap().effective_mode().unwrap(),
            NetworkMode::Loopback
        );
        assert_eq!(
            parse("enabled = false").unwrap().effective_mode().unwrap(),
            NetworkMode::None
        );
        assert_eq!(
            parse("").unwrap().effective_mode().unwrap(),
            NetworkMode::None
        );
        let both = parse("mode = \"none\"\nenabled = false").unwrap();
        assert_eq!(both.effective_mode(), Err(Error::ModeAndEnabled));
        assert!(parse("mode = \"internet\"").is_err());
        assert_eq!(NetworkMode::Proxy.to_string(), "through the egress proxy");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = parse("mode = \"proxy\"\nallowed = [\"x\"]").unwrap_err();
        assert!(err.to_string().contains("allowed"), "{err}");
        let err = parse("[[credentials]]\nhost = \"a\"\nsecret = \"x\"").unwrap_err();
        assert!(err.to_string().contains("secret"), "{err}");
    }

    #[test]
    fn a_full_section() {
        let s = parse(
            r#"
            mode = "proxy"
            allow = ["api.example.com", "*.example.org:443"]
            deny = ["bad.example.org"]
            allow_private = ["127.0.0.1:8443"]
            max_connections = 8
            max_bytes_down = "1M"
            connect_timeout = "2s"
            extra_roots = ["/tmp/ca.pem"]
            [[credentials]]
            host = "api.example.com"
            bearer = "env:API_TOKEN"
            "#,
        )
        .unwrap();
        assert_eq!(s.allow.len(), 2);
        assert_eq!(s.credentials[0].bearer.as_deref(), Some("env:API_TOKEN"));
        assert!(!s.credentials[0].allow_plain_http);
        assert_eq!(s.max_connections, Some(8));
        let shown = format!("{s:?}");
        assert!(shown.contains("env:API_TOKEN"), "{shown}");
    }

    #[test]
    fn debug_never_shows_a_literal_secret() {
        let s = parse(
            "[[credentials]]\nhost = \"a.example\"\nheader = \"X-Key\"\nvalue = \"literal-s3cret\"",
        )
        .unwrap();
        let shown = format!("{s:?}");
        assert!(!shown.contains("literal-s3cret"), "{shown}");
        assert!(shown.contains("<literal, not shown>"), "{shown}");
    }
}
