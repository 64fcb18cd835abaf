//! `[[network.credentials]]`: what the proxy adds to requests to one exact host, resolved
//! from the section (secrets from `env:VAR`) and checked: exactly one shape (`bearer`,
//! `header` + `value`, or `query` + `value`), a header the proxy does not manage itself,
//! a value that is a valid header value, a host without wildcards.

use http::{HeaderName, HeaderValue};

use crate::egress::config::CredentialSection;
use crate::egress::rules::pattern::{Host, Target};
use crate::egress::rules::policy::Error;
use crate::egress::secrets::encodings::MAX_SECRET_BYTES;

type Result<T> = std::result::Result<T, Error>;

/// What a credential adds to a request.
#[derive(Clone)]
pub enum Inject {
    /// Set this header (replacing any the program sent).
    Header {
        name: HeaderName,
        value: HeaderValue,
    },
    /// Set this query parameter (replacing any the program sent).
    Query { name: String, value: String },
}

/// One resolved `[[network.credentials]]` entry.
#[derive(Clone)]
pub struct Credential {
    pub host: Host,
    /// `None`: 443, and 80 for plain HTTP.
    pub port: Option<u16>,
    pub inject: Inject,
    pub allow_plain_http: bool,
    /// What must never reach the sandbox (the secret, the whole header value, the
    /// percent-encoded query value).
    pub(crate) secrets: Vec<String>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("adds", &self.adds())
            .finish_non_exhaustive()
    }
}

impl Credential {
    /// Whether this credential is for `target`, reached over TLS (a CONNECT) or as plain
    /// HTTP; without a port in its host it is for 443 over TLS and 80 in plain HTTP.
    pub fn applies_to(&self, target: &Target, tls: bool) -> bool {
        self.host == target.host
            && match self.port {
                Some(p) => p == target.port,
                None => target.port == if tls { 443 } else { 80 },
            }
    }

    /// What it adds, in words without the value: `header Authorization`, `query key`.
    pub fn adds(&self) -> String {
        match &self.inject {
            Inject::Header { name, .. } => format!("header {name}"),
            Inject::Query { name, .. } => format!("query {name}"),
        }
    }
}

/// Headers a credential may not set: framing, routing and hop-by-hop headers.
const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    "proxy-connection",
    "expect",
    "accept-encoding",
    "content-encoding",
];

pub(crate) fn credential(
    c: &CredentialSection,
    index: usize,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Credential> {
    let field = format!("credentials[{index}]");
    let invalid = |reason: String| Error::Invalid {
        field: field.clone(),
        reason,
    };
    if c.host.contains('*') {
        return Err(invalid(format!(
            "host {:?}: credentials name one exact host (a wildcard would also send the secret to subdomains that serve other people's content)",
            crate::egress::rules::pattern::clip(&c.host)
        )));
    }
    let target = Target::parse_authority(&c.host, Some(0)).map_err(|e| invalid(e.to_string()))?;
    let port = (target.port != 0).then_some(target.port);
    let secret = |key: &str, v: Option<&str>| -> Result<Option<String>> {
        let v = crate::config::resolve_secret(&format!("network.{field}.{key}"), v, env)
            .map_err(|e| invalid(e.to_string()))?;
        match v {
            Some(s) if s.is_empty() => Err(invalid(format!("{key}: the secret is empty"))),
            Some(s) if s.len() > MAX_SECRET_BYTES => Err(invalid(format!(
                "{key}: the secret is {} bytes, more than {MAX_SECRET_BYTES} (responses are searched for it in every encoding)",
                s.len()
            ))),
            other => Ok(other),
        }
    };
    let value = secret("value", c.value.as_deref())?;
    let bearer = secret("bearer", c.bearer.as_deref())?;
    let header_value = |text: &str| {
        HeaderValue::from_str(text).map_err(|_| {
            invalid("the value is not a valid header value (visible ASCII, no line breaks)".into())
        })
    };
    let (inject, secrets) = match (&c.header, &c.query, value, bearer) {
        (None, None, None, Some(token)) => {
            let full = format!("Bearer {token}");
            let mut v = header_value(&full)?;
            v.set_sensitive(true);
            (
                Inject::Header {
                    name: http::header::AUTHORIZATION,
                    value: v,
                },
                vec![token, full],
            )
        }
        (Some(name), None, Some(value), None) => {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| invalid(format!("header {name:?} is not a valid header name")))?;
            if RESERVED_HEADERS.contains(&name.as_str()) {
                return Err(invalid(format!(
                    "header {name} is managed by the proxy and cannot carry a credential"
                )));
            }
            let mut v = header_value(&value)?;
            v.set_sensitive(true);
            (Inject::Header { name, value: v }, vec![value])
        }
        (None, Some(name), Some(value), None) => {
            if name.is_empty() || name.len() > 100 {
                return Err(invalid(
                    "query: the parameter name must be 1-100 characters".into(),
                ));
            }
            let encoded: String = form_urlencoded::byte_serialize(value.as_bytes()).collect();
            let mut secrets = vec![value.clone()];
            if encoded != value {
                secrets.push(encoded);
            }
            (
                Inject::Query {
                    name: name.clone(),
                    value,
                },
                secrets,
            )
        }
        _ => {
            return Err(invalid(
                "give `bearer`, or `header` and `value`, or `query` and `value`".into(),
            ))
        }
    };
    Ok(Credential {
        host: target.host,
        port,
        inject,
        allow_plain_http: c.allow_plain_http,
        secrets,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::egress::config::NetworkSection;
    use crate::egress::rules::policy::EgressPolicy;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn target(s: &str) -> Target {
        Target::parse_authority(s, None).unwrap()
    }

    fn with_credential(
        c: CredentialSection,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<EgressPolicy> {
        let mut s = NetworkSection {
            allow: vec!["api.example.com".into(), "*.example.org".into()],
            ..Default::default()
        };
        s.credentials = vec![c];
        EgressPolicy::from_section(&s, env)
    }

    #[test]
    fn credentials_resolve_env_secrets() {
        let env = crate::config::env_of(&[("API_TOKEN", "s3cr3t-token")]);
        let p = with_credential(
            CredentialSection {
                host: "API.example.com".into(),
                bearer: Some("env:API_TOKEN".into()),
                ..Default::default()
            },
            &env,
        )
        .unwrap();
        assert!(p.has_credentials());
        assert_eq!(
            p.secret_values(),
            vec![
                "Bearer s3cr3t-token".to_string(),
                "s3cr3t-token".to_string()
            ]
        );
        let creds = p.credentials_for(&target("api.example.com:443"), true);
        assert_eq!(creds.len(), 1);
        assert!(p
            .credentials_for(&target("api.example.com:8443"), true)
            .is_empty());
        assert!(p
            .credentials_for(&target("api.example.com:80"), true)
            .is_empty());
        assert_eq!(
            p.credentials_for(&target("api.example.com:80"), false)
                .len(),
            1
        );
        let summary = p.summary().to_string();
        assert!(summary.contains("api.example.com"), "{summary}");
        assert!(!summary.contains("s3cr3t"), "{summary}");
        assert!(
            !format!("{p:?}").contains("s3cr3t"),
            "Debug shows no secret"
        );

        let err = with_credential(
            CredentialSection {
                host: "api.example.com".into(),
                bearer: Some("env:MISSING".into()),
                ..Default::default()
            },
            &env,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("MISSING") && err.contains("not set"), "{err}");
    }

    #[test]
    fn credential_shapes_are_checked() {
        let env = no_env;
        let bad = |c: CredentialSection| with_credential(c, &env).unwrap_err().to_string();
        let ok = |c: CredentialSection| with_credential(c, &env).unwrap();
        ok(CredentialSection {
            host: "api.example.com".into(),
            header: Some("X-Api-Key".into()),
            value: Some("k-123456".into()),
            ..Default::default()
        });
        let q = ok(CredentialSection {
            host: "a.example.org:443".into(),
            query: Some("key".into()),
            value: Some("a b&c".into()),
            ..Default::default()
        });
        assert_eq!(
            q.secret_values(),
            vec!["a b&c".to_string(), "a+b%26c".to_string()]
        );
        assert!(bad(CredentialSection {
            host: "*.example.org".into(),
            bearer: Some("x".into()),
            ..Default::default()
        })
        .contains("one exact host"));
        assert!(bad(CredentialSection {
            host: "other.example".into(),
            bearer: Some("x".into()),
            ..Default::default()
        })
        .contains("not in the allowlist"));
        assert!(bad(CredentialSection {
            host: "api.example.com".into(),
            header: Some("X".into()),
            bearer: Some("x".into()),
            ..Default::default()
        })
        .contains("give `bearer`"));
        assert!(bad(CredentialSection {
            host: "api.example.com".into(),
            header: Some("Host".into()),
            value: Some("x".into()),
            ..Default::default()
        })
        .contains("managed by the proxy"));
        assert!(bad(CredentialSection {
            host: "api.example.com".into(),
            header: Some("X-Key".into()),
            value: Some("a\r\nb".into()),
            ..Default::default()
        })
        .contains("not a valid header value"));
        assert!(bad(CredentialSection {
            host: "api.example.com".into(),
            bearer: Some("".into()),
            ..Default::default()
        })
        .contains("empty"));
        assert!(bad(CredentialSection {
            host: "api.example.com".into(),
            bearer: Some("x".repeat(MAX_SECRET_BYTES + 1)),
            ..Default::default()
        })
        .contains("more than 4096"));
        ok(CredentialSection {
            host: "api.example.com".into(),
            bearer: Some("x".repeat(MAX_SECRET_BYTES)),
            ..Default::default()
        });
    }

    #[test]
    fn all_secrets_together_are_bounded() {
        let mut s = NetworkSection {
            allow: vec!["*.example.org".into()],
            ..Default::default()
        };
        // Four bearer tokens of 2,100 bytes: 4 x (2,100 + "Bearer " 2,107) > 16 KiB.
        for i in 0..4 {
            s.credentials.push(CredentialSection {
                host: format!("h{i}.example.org"),
                bearer: Some(format!("{i}{}", "t".repeat(2099))),
                ..Default::default()
            });
        }
        let e = EgressPolicy::from_section(&s, &no_env)
            .unwrap_err()
            .to_string();
        assert!(e.contains("16384"), "{e}");
        s.credentials.pop();
        let p = EgressPolicy::from_section(&s, &no_env).unwrap();
        // What the bound allows builds.
        crate::egress::Secrets::new(&p.secret_values()).unwrap();
    }
}
