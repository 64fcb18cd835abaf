//! Host names, targets (`host:port`) and the host patterns of `allow` and `deny`.
//!
//! Every name is normalised the same way, in rules and in requests: ASCII lower case, one
//! trailing dot removed, IDNA (UTS 46) to punycode, each label 1–63 characters of letters,
//! digits, `-` and `_`, 253 at most in all. A name whose last label is a number
//! (`2130706433`, `0x7f.1`) is refused: URL parsers and resolvers read those as IPv4
//! addresses, so they must be written as one (`127.0.0.1`).
//!
//! Patterns: an exact name, `*.example.org` (any name below it, not the apex), `*` (any
//! host), or an IP literal (`1.2.3.4`, `2001:db8::1`, `[2001:db8::1]`); each with an
//! optional `:port` (IPv6 only in brackets). Without a port an allow pattern matches 80
//! and 443, and a deny pattern every port.
//! An IP literal target matches only patterns naming that IP (or `*`); an IPv4-mapped IPv6
//! literal (`[::ffff:a.b.c.d]`), in a rule or a request, is that IPv4 address.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The ports a pattern without one matches.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("{text:?} is not a valid host: {why}")]
    BadHost { text: String, why: String },
    #[error("{text:?} is not a valid host pattern: {why}")]
    BadPattern { text: String, why: String },
}

type Result<T> = std::result::Result<T, Error>;

/// A host as the proxy compares and connects to it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A normalised DNS name (lower case, punycode, no trailing dot).
    Name(String),
    Ip(IpAddr),
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V4(ip)) => write!(f, "{ip}"),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
        }
    }
}

/// Where a program asks to go: a host and a port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Target {
    pub host: Host,
    pub port: u16,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

impl Target {
    /// `host:port` of a CONNECT request (the port is required), or of an absolute URL's
    /// authority when `default_port` is given.
    pub fn parse_authority(text: &str, default_port: Option<u16>) -> Result<Target> {
        let (host, port) = split_port(text).map_err(|why| bad_host(text, why))?;
        let port = match (port, default_port) {
            (Some(p), _) => p,
            (None, Some(p)) => p,
            (None, None) => return Err(bad_host(text, "a port is required (host:port)")),
        };
        Ok(Target {
            host: normalize_host(host)?,
            port,
        })
    }

    /// The host's name as a TLS server name and `Host` header value take it (no brackets).
    pub fn host_for_tls(&self) -> String {
        match &self.host {
            Host::Name(n) => n.clone(),
            Host::Ip(ip) => ip.to_string(),
        }
    }

    /// The `Host` header for this target: the port only when it is not `default_port`.
    pub fn host_header(&self, default_port: u16) -> String {
        if self.port == default_port {
            self.host.to_string()
        } else {
            self.to_string()
        }
    }
}

fn bad_host(text: &str, why: impl Into<String>) -> Error {
    Error::BadHost {
        text: clip(text),
        why: why.into(),
    }
}

/// At most 100 characters of what a client or a rule said, for messages.
pub fn clip(text: &str) -> String {
    if text.chars().count() <= 100 {
        text.to_string()
    } else {
        let mut s: String = text.chars().take(100).collect();
        s.push('…');
        s
    }
}

/// Splits `host[:port]` (IPv6 in brackets when a port follows; a bare IPv6 address has
/// none). The host part keeps its brackets.
fn split_port(text: &str) -> std::result::Result<(&str, Option<u16>), &'static str> {
    if text.starts_with('[') {
        let close = text
            .find(']')
            .ok_or("an IPv6 address lacks its closing ]")?;
        let (host, rest) = text.split_at(close + 1);
        return match rest {
            "" => Ok((host, None)),
            _ => match rest.strip_prefix(':') {
                Some(p) => Ok((host, Some(parse_port(p)?))),
                None => Err("only :port may follow ]"),
            },
        };
    }
    match text.matches(':').count() {
        0 => Ok((text, None)),
        1 => {
            let (host, port) = text.split_once(':').expect("one colon");
            Ok((host, Some(parse_port(port)?)))
        }
        _ => Ok((text, None)), // a bare IPv6 address
    }
}

fn parse_port(text: &str) -> std::result::Result<u16, &'static str> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err("the port must be a number from 1 to 65535");
    }
    match text.parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err("the port must be a number from 1 to 65535"),
    }
}

/// Normalises one host as written by a client or a rule (see the module docs).
pub fn normalize_host(text: &str) -> Result<Host> {
    let bad = |why: &str| bad_host(text, why);
    if text.is_empty() {
        return Err(bad("it is empty"));
    }
    if text.len() > 1024 {
        return Err(bad("it is longer than 1024 bytes"));
    }
    if let Some(inner) = text.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| bad("unbalanced [ ]"))?;
        return inner
            .parse::<Ipv6Addr>()
            .map(v6_host)
            .map_err(|_| bad("not an IPv6 address between [ ] (zone ids are not allowed)"));
    }
    if let Ok(ip) = text.parse::<Ipv6Addr>() {
        return Ok(v6_host(ip));
    }
    let text = text.strip_suffix('.').unwrap_or(text);
    if let Ok(ip) = text.parse::<Ipv4Addr>() {
        return Ok(Host::Ip(IpAddr::V4(ip)));
    }
    if text.is_empty() {
        return Err(bad("it is empty"));
    }
    let ascii = if text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
        && !text.to_ascii_lowercase().contains("xn--")
    {
        text.to_ascii_lowercase()
    } else {
        idna::domain_to_ascii(text).map_err(|_| bad("not a valid internationalised name"))?
    };
    check_name(&ascii).map_err(bad)?;
    Ok(Host::Name(ascii))
}

/// An IPv6 literal as a host: an IPv4-mapped address (`::ffff:a.b.c.d`) is the IPv4
/// address it maps, since that is where the proxy connects (see `address::canonical`); so
/// rules and targets compare it as such, and an IPv4 `deny` rule also stops its mapped form.
fn v6_host(ip: Ipv6Addr) -> Host {
    match ip.to_ipv4_mapped() {
        Some(v4) => Host::Ip(IpAddr::V4(v4)),
        None => Host::Ip(IpAddr::V6(ip)),
    }
}

/// Checks a lower-case ASCII name label by label.
fn check_name(name: &str) -> std::result::Result<(), &'static str> {
    if name.len() > 253 {
        return Err("it is longer than 253 characters");
    }
    let labels: Vec<&str> = name.split('.').collect();
    for label in &labels {
        if label.is_empty() {
            return Err("it has an empty label");
        }
        if label.len() > 63 {
            return Err("a label is longer than 63 characters");
        }
        if !label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return Err("only letters, digits, - and _ may form a name");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a label starts or ends with -");
        }
    }
    let last = labels.last().expect("split yields one");
    let numeric = last.bytes().all(|b| b.is_ascii_digit())
        || last
            .strip_prefix("0x")
            .is_some_and(|h| h.bytes().all(|b| b.is_ascii_hexdigit()));
    if numeric {
        return Err("it ends in a number, which resolvers read as an IPv4 address: write the address as a.b.c.d");
    }
    Ok(())
}

/// Which hosts a pattern covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostMatch {
    /// `*`: every host.
    Any,
    Exact(String),
    /// `*.suffix`: names strictly below `suffix`.
    Below(String),
    Ip(IpAddr),
}

/// One `allow`/`deny` (or request `network`) pattern.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    pub host: HostMatch,
    /// `None`: [`DEFAULT_PORTS`].
    pub port: Option<u16>,
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostMatch::Any => f.write_str("*")?,
            HostMatch::Exact(n) => f.write_str(n)?,
            HostMatch::Below(s) => write!(f, "*.{s}")?,
            HostMatch::Ip(ip) => write!(f, "{}", Host::Ip(*ip))?,
        }
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

impl HostPattern {
    /// Parses and checks one pattern.
    pub fn parse(text: &str) -> Result<HostPattern> {
        let bad = |why: String| Error::BadPattern {
            text: clip(text),
            why,
        };
        let (host, port) = split_port(text).map_err(|w| bad(w.to_string()))?;
        let host = if host == "*" {
            HostMatch::Any
        } else if let Some(rest) = host.strip_prefix("*.") {
            if rest.contains('*') {
                return Err(bad(
                    "* may only stand as the whole first label (*.example.org)".into(),
                ));
            }
            match normalize_host(rest).map_err(|e| bad(why_of(e)))? {
                Host::Name(n) => HostMatch::Below(n),
                Host::Ip(_) => return Err(bad("*. cannot precede an IP address".into())),
            }
        } else if host.contains('*') {
            return Err(bad(
                "* may only stand as the whole first label (*.example.org)".into(),
            ));
        } else {
            match normalize_host(host).map_err(|e| bad(why_of(e)))? {
                Host::Name(n) => HostMatch::Exact(n),
                Host::Ip(ip) => HostMatch::Ip(ip),
            }
        };
        Ok(HostPattern { host, port })
    }

    /// Whether `target` is covered by this pattern.
    pub fn matches(&self, target: &Target) -> bool {
        self.port_matches(target.port) && self.matches_host(&target.host)
    }

    /// Whether this pattern, as a `deny` rule, refuses `target`: without a port it refuses
    /// the host on every port (the default ports are what an allow rule grants).
    pub fn denies(&self, target: &Target) -> bool {
        match self.port {
            None => self.matches_host(&target.host),
            Some(_) => self.matches(target),
        }
    }

    /// Whether the host part covers `host`, whatever the port.
    fn matches_host(&self, host: &Host) -> bool {
        match (&self.host, host) {
            (HostMatch::Any, _) => true,
            (HostMatch::Exact(p), Host::Name(n)) => p == n,
            (HostMatch::Below(s), Host::Name(n)) => is_below(n, s),
            (HostMatch::Ip(p), Host::Ip(ip)) => p == ip,
            _ => false,
        }
    }

    /// Whether this pattern covers `port`.
    pub fn port_matches(&self, port: u16) -> bool {
        match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        }
    }

    /// Whether some target matches both patterns.
    pub fn overlaps(&self, other: &HostPattern) -> bool {
        let ports = match (self.port, other.port) {
            (Some(a), Some(b)) => a == b,
            (Some(p), None) | (None, Some(p)) => DEFAULT_PORTS.contains(&p),
            (None, None) => true,
        };
        ports
            && match (&self.host, &other.host) {
                (HostMatch::Any, _) | (_, HostMatch::Any) => true,
                (HostMatch::Exact(a), HostMatch::Exact(b)) => a == b,
                (HostMatch::Exact(n), HostMatch::Below(s))
                | (HostMatch::Below(s), HostMatch::Exact(n)) => is_below(n, s),
                (HostMatch::Below(a), HostMatch::Below(b)) => {
                    a == b || is_below(a, b) || is_below(b, a)
                }
                (HostMatch::Ip(a), HostMatch::Ip(b)) => a == b,
                _ => false,
            }
    }
}

/// `name` is strictly below `suffix` (`a.b.example` below `example`, not `example` itself
/// nor `badexample`).
fn is_below(name: &str, suffix: &str) -> bool {
    name.len() > suffix.len() + 1
        && name.ends_with(suffix)
        && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
}

/// The reason part of an error, to fold into another message.
fn why_of(e: Error) -> String {
    match e {
        Error::BadHost { why, .. } | Error::BadPattern { why, .. } => why,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Host {
        Host::Name(s.into())
    }

    fn target(s: &str) -> Target {
        Target::parse_authority(s, Some(443)).unwrap()
    }

    fn pat(s: &str) -> HostPattern {
        HostPattern::parse(s).unwrap()
    }

    #[test]
    fn names_are_normalised() {
        assert_eq!(
            normalize_host("API.Example.COM").unwrap(),
            name("api.example.com")
        );
        assert_eq!(normalize_host("example.com.").unwrap(), name("example.com"));
        assert!(
            normalize_host("example.com..").is_err(),
            "one trailing dot only"
        );
        assert_eq!(
            normalize_host("bücher.example").unwrap(),
            name("xn--bcher-kva.example")
        );
        assert_eq!(
            normalize_host("BÜCHER.example.").unwrap(),
            name("xn--bcher-kva.example")
        );
        assert_eq!(
            normalize_host("xn--bcher-kva.example").unwrap(),
            name("xn--bcher-kva.example")
        );
        assert_eq!(
            normalize_host("_dmarc.example").unwrap(),
            name("_dmarc.example")
        );
        for bad in [
            "",
            ".",
            "a..b",
            ".a",
            "-a.example",
            "a-.example",
            "a b",
            "a%2eb",
            "a/b",
            "a\r\nb",
            "xn--zz-.example",
            "2130706433",
            "0x7f.1",
            "127.1",
            "a.0x10",
            "1.2.3.4.5",
            "010.0.0.1",
        ] {
            assert!(normalize_host(bad).is_err(), "{bad:?} must be refused");
        }
        let long = format!("{}.example", "a".repeat(64));
        assert!(normalize_host(&long).is_err());
        let err = normalize_host("a..b").unwrap_err().to_string();
        assert_eq!(err, "\"a..b\" is not a valid host: it has an empty label");
    }

    #[test]
    fn ip_literals() {
        assert_eq!(
            normalize_host("1.2.3.4").unwrap(),
            Host::Ip("1.2.3.4".parse().unwrap())
        );
        assert_eq!(
            normalize_host("1.2.3.4.").unwrap(),
            Host::Ip("1.2.3.4".parse().unwrap())
        );
        assert_eq!(
            normalize_host("[2001:DB8::1]").unwrap(),
            Host::Ip("2001:db8::1".parse().unwrap())
        );
        assert!(normalize_host("[fe80::1%eth0]").is_err());
        // A mapped address is the IPv4 address it maps (where the proxy connects).
        for mapped in ["[::ffff:1.2.3.4]", "::FFFF:102:304", "[::ffff:0102:0304]"] {
            assert_eq!(
                normalize_host(mapped).unwrap(),
                Host::Ip("1.2.3.4".parse().unwrap()),
                "{mapped}"
            );
        }
        assert_eq!(pat("::ffff:1.2.3.4").to_string(), "1.2.3.4");
        assert!(pat("1.2.3.4").matches(&target("[::ffff:1.2.3.4]:443")));
        // Only the mapped form: an IPv4-compatible or NAT64 address stays IPv6.
        assert!(matches!(
            normalize_host("[64:ff9b::102:304]").unwrap(),
            Host::Ip(IpAddr::V6(_))
        ));
        assert!(normalize_host("[1.2.3.4]").is_err());
        let t = target("[2001:db8::1]:8443");
        assert_eq!(t.port, 8443);
        assert_eq!(t.to_string(), "[2001:db8::1]:8443");
        assert_eq!(t.host_for_tls(), "2001:db8::1");
        assert_eq!(t.host_header(443), "[2001:db8::1]:8443");
    }

    #[test]
    fn authorities() {
        let t = Target::parse_authority("Example.COM.:443", None).unwrap();
        assert_eq!(t.to_string(), "example.com:443");
        assert_eq!(t.host_header(443), "example.com");
        assert_eq!(
            Target::parse_authority("a.example", Some(80)).unwrap().port,
            80
        );
        for bad in [
            "a.example",
            "a.example:",
            "a.example:0",
            "a.example:65536",
            "a.example:+1",
            ":443",
            "[::1:443",
            "[::1]x",
        ] {
            assert!(Target::parse_authority(bad, None).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn patterns_parse_and_print() {
        for (text, shown) in [
            ("API.example.com", "api.example.com"),
            ("*.Example.org:443", "*.example.org:443"),
            ("*", "*"),
            ("*:8080", "*:8080"),
            ("1.2.3.4", "1.2.3.4"),
            ("2001:db8::1", "[2001:db8::1]"),
            ("[2001:db8::1]:8443", "[2001:db8::1]:8443"),
            ("bücher.example", "xn--bcher-kva.example"),
        ] {
            assert_eq!(pat(text).to_string(), shown);
        }
        for bad in [
            "",
            "*.",
            "**.a",
            "a.*.b",
            "*a.example",
            "a*",
            "*.1.2.3.4",
            "a.example:0",
            "a.example:x",
            "[::1",
            "ex ample.com",
            "a.example:443:1",
        ] {
            let err = HostPattern::parse(bad);
            assert!(err.is_err(), "{bad:?}");
        }
        let err = HostPattern::parse("a.*.b").unwrap_err().to_string();
        assert!(err.contains("whole first label"), "{err}");
    }

    #[test]
    fn matching() {
        let p = pat("api.example.com");
        assert!(p.matches(&target("API.EXAMPLE.com.:443")));
        assert!(p.matches(&target("api.example.com:80")));
        assert!(
            !p.matches(&target("api.example.com:8443")),
            "default ports only"
        );
        assert!(!p.matches(&target("x.api.example.com:443")));

        let w = pat("*.example.org");
        assert!(w.matches(&target("a.example.org:443")));
        assert!(w.matches(&target("a.b.example.org:80")));
        assert!(!w.matches(&target("example.org:443")), "not the apex");
        assert!(!w.matches(&target("badexample.org:443")));
        let w443 = pat("*.example.org:443");
        assert!(!w443.matches(&target("a.example.org:80")));

        let ip = pat("1.2.3.4");
        assert!(ip.matches(&target("1.2.3.4:443")));
        assert!(!ip.matches(&target("1.2.3.5:443")));
        let v6 = pat("[2001:db8::1]:8443");
        assert!(v6.matches(&target("[2001:db8:0::1]:8443")));
        assert!(!v6.matches(&target("[2001:db8::1]:443")));
        assert!(pat("*").matches(&target("1.2.3.4:443")));
        assert!(!pat("*").matches(&target("1.2.3.4:22")));
        // A name never matches an IP rule, nor an IP a name rule.
        assert!(!pat("localhost").matches(&target("127.0.0.1:443")));
        assert!(!pat("127.0.0.1").matches(&target("localhost:443")));
    }

    #[test]
    fn overlap() {
        assert!(pat("a.example").overlaps(&pat("a.example:443")));
        assert!(!pat("a.example").overlaps(&pat("a.example:8443")));
        assert!(pat("*.example").overlaps(&pat("x.example")));
        assert!(!pat("*.example").overlaps(&pat("example")));
        assert!(pat("*.example").overlaps(&pat("*.a.example")));
        assert!(!pat("*.example").overlaps(&pat("*.other")));
        assert!(pat("*").overlaps(&pat("1.2.3.4")));
        assert!(!pat("1.2.3.4").overlaps(&pat("*.example")));
    }
}
