//! Which addresses count as public, and the `allow_private` rules that let a named
//! non-public address through.
//!
//! Refused unless a rule names them: "this network" and unspecified, loopback, RFC 1918,
//! CGNAT (100.64/10), link-local (with 169.254.169.254, the cloud metadata service),
//! IETF protocol assignments, documentation and benchmarking ranges, multicast, reserved
//! and broadcast; in IPv6 everything outside global unicast 2000::/3 and, inside it,
//! Teredo/ORCHID and the like (2001::/23), documentation (2001:db8::/32, 3fff::/20) and
//! 6to4/NAT64/mapped addresses whose embedded IPv4 address is not public. An IPv4-mapped
//! address (`::ffff:a.b.c.d`) is judged, matched and connected to as the IPv4 address.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("allow_private entry {text:?} is invalid: {why}")]
    BadRule { text: String, why: &'static str },
}

/// Why an address is not public (`None`: it is public).
pub fn non_public(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => non_public_v4(v4),
        IpAddr::V6(v6) => non_public_v6(v6),
    }
}

fn in_v4(ip: Ipv4Addr, net: [u8; 4], len: u32) -> bool {
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
    u32::from(ip) & mask == u32::from(Ipv4Addr::from(net)) & mask
}

fn non_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    const RANGES: &[([u8; 4], u32, &str)] = &[
        ([0, 0, 0, 0], 8, "this network"),
        ([10, 0, 0, 0], 8, "private"),
        ([100, 64, 0, 0], 10, "shared address space (CGNAT)"),
        ([127, 0, 0, 0], 8, "loopback"),
        ([169, 254, 169, 254], 32, "cloud metadata"),
        ([169, 254, 0, 0], 16, "link-local"),
        ([172, 16, 0, 0], 12, "private"),
        ([192, 0, 0, 0], 24, "IETF protocol assignments"),
        ([192, 0, 2, 0], 24, "documentation"),
        ([192, 88, 99, 0], 24, "6to4 relay anycast"),
        ([192, 168, 0, 0], 16, "private"),
        ([198, 18, 0, 0], 15, "benchmarking"),
        ([198, 51, 100, 0], 24, "documentation"),
        ([203, 0, 113, 0], 24, "documentation"),
        ([224, 0, 0, 0], 4, "multicast"),
        ([255, 255, 255, 255], 32, "broadcast"),
        ([240, 0, 0, 0], 4, "reserved"),
    ];
    RANGES
        .iter()
        .find(|(net, len, _)| in_v4(ip, *net, *len))
        .map(|(_, _, why)| *why)
}

fn in_v6(ip: Ipv6Addr, net: [u16; 8], len: u32) -> bool {
    let mask = if len == 0 {
        0
    } else {
        u128::MAX << (128 - len)
    };
    u128::from(ip) & mask == u128::from(Ipv6Addr::from(net)) & mask
}

/// The IPv4 address in bits `from..from + 32` of `ip`.
fn embedded_v4(ip: Ipv6Addr, from: u32) -> Ipv4Addr {
    Ipv4Addr::from((u128::from(ip) >> (96 - from)) as u32)
}

fn non_public_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return non_public_v4(v4).map(|_| "IPv4-mapped non-public address");
    }
    if in_v6(ip, [0x64, 0xff9b, 0, 0, 0, 0, 0, 0], 96) {
        return non_public_v4(embedded_v4(ip, 96)).map(|_| "NAT64 of a non-public address");
    }
    if in_v6(ip, [0x2002, 0, 0, 0, 0, 0, 0, 0], 16) {
        return non_public_v4(embedded_v4(ip, 16)).map(|_| "6to4 of a non-public address");
    }
    const RANGES: &[([u16; 8], u32, &str)] = &[
        ([0, 0, 0, 0, 0, 0, 0, 0], 128, "unspecified"),
        ([0, 0, 0, 0, 0, 0, 0, 1], 128, "loopback"),
        ([0x64, 0xff9b, 1, 0, 0, 0, 0, 0], 48, "local-use NAT64"),
        ([0x100, 0, 0, 0, 0, 0, 0, 0], 64, "discard-only"),
        ([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0], 32, "documentation"),
        (
            [0x2001, 0, 0, 0, 0, 0, 0, 0],
            23,
            "IETF protocol assignments",
        ),
        ([0x3fff, 0, 0, 0, 0, 0, 0, 0], 20, "documentation"),
        ([0xfc00, 0, 0, 0, 0, 0, 0, 0], 7, "unique-local"),
        ([0xfe80, 0, 0, 0, 0, 0, 0, 0], 10, "link-local"),
        ([0xfec0, 0, 0, 0, 0, 0, 0, 0], 10, "site-local"),
        ([0xff00, 0, 0, 0, 0, 0, 0, 0], 8, "multicast"),
    ];
    if let Some((_, _, why)) = RANGES.iter().find(|(net, len, _)| in_v6(ip, *net, *len)) {
        return Some(why);
    }
    if !in_v6(ip, [0x2000, 0, 0, 0, 0, 0, 0, 0], 3) {
        return Some("reserved");
    }
    None
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is; anything else unchanged.
pub fn canonical(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => addr,
        },
        SocketAddr::V4(_) => addr,
    }
}

/// One `allow_private` entry: an address or network, optionally one port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrivateRule {
    net: IpAddr,
    prefix: u32,
    port: Option<u16>,
}

impl fmt::Display for PrivateRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let full = if self.net.is_ipv4() { 32 } else { 128 };
        let net = if self.prefix == full {
            self.net.to_string()
        } else {
            format!("{}/{}", self.net, self.prefix)
        };
        match (self.net, self.port) {
            (IpAddr::V6(_), Some(p)) => write!(f, "[{net}]:{p}"),
            (IpAddr::V4(_), Some(p)) => write!(f, "{net}:{p}"),
            (_, None) => f.write_str(&net),
        }
    }
}

impl PrivateRule {
    /// `127.0.0.1`, `127.0.0.1:8443`, `10.0.0.0/8`, `10.0.0.0/8:443`, `::1`, `[::1]:443`,
    /// `fd00::/8`, `[fd00::/8]:443`.
    pub fn parse(text: &str) -> Result<PrivateRule, Error> {
        let bad = |why| Error::BadRule {
            text: crate::egress::rules::pattern::clip(text),
            why,
        };
        let (addr, port) = if let Some(rest) = text.strip_prefix('[') {
            let (inner, after) = rest.split_once(']').ok_or(bad("lacks its closing ]"))?;
            let port = match after {
                "" => None,
                _ => Some(
                    after
                        .strip_prefix(':')
                        .and_then(|p| p.parse::<u16>().ok())
                        .filter(|p| *p > 0)
                        .ok_or(bad("only :port (1-65535) may follow ]"))?,
                ),
            };
            (inner, port)
        } else if text.matches(':').count() == 1 {
            let (a, p) = text.split_once(':').expect("one colon");
            let port = p
                .parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or(bad("the port must be a number from 1 to 65535"))?;
            (a, Some(port))
        } else {
            (text, None)
        };
        let (ip, prefix) = match addr.split_once('/') {
            Some((ip, len)) => (ip, Some(len)),
            None => (addr, None),
        };
        let net: IpAddr = ip
            .parse()
            .map_err(|_| bad("not an IP address or network (a.b.c.d[/n], [v6[/n]])"))?;
        let full = if net.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => full,
            Some(len) => match len.parse::<u32>() {
                Ok(n) if n <= full && !len.starts_with('+') => n,
                _ => return Err(bad("the prefix length is out of range")),
            },
        };
        let rule = PrivateRule { net, prefix, port };
        if rule.masked(net) != net {
            return Err(bad(
                "host bits are set below the prefix (write the network address)",
            ));
        }
        Ok(rule)
    }

    fn masked(&self, ip: IpAddr) -> IpAddr {
        match ip {
            IpAddr::V4(v4) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u32::MAX << (32 - self.prefix)
                };
                IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
            }
            IpAddr::V6(v6) => {
                let mask = if self.prefix == 0 {
                    0
                } else {
                    u128::MAX << (128 - self.prefix)
                };
                IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
            }
        }
    }

    /// Whether this rule lets `addr` (already [`canonical`]) through.
    pub fn matches(&self, addr: SocketAddr) -> bool {
        self.port.is_none_or(|p| p == addr.port())
            && self.net.is_ipv4() == addr.ip().is_ipv4()
            && self.masked(addr.ip()) == self.net
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn np(s: &str) -> Option<&'static str> {
        non_public(s.parse().unwrap())
    }

    #[test]
    fn public_addresses_pass() {
        for ip in [
            "1.1.1.1",
            "8.8.8.8",
            "93.184.216.34",
            "100.63.255.255",
            "100.128.0.0",
            "172.15.255.255",
            "172.32.0.0",
            "192.167.1.1",
            "223.255.255.255",
            "2606:4700::1111",
            "2a00:1450:4001::200e",
            "2002:0808:0808::1",
            "64:ff9b::808:808",
            "::ffff:8.8.8.8",
            "2001:4860:4860::8888",
        ] {
            assert_eq!(np(ip), None, "{ip} is public");
        }
    }

    #[test]
    fn every_non_public_class_is_refused() {
        for (ip, why) in [
            ("0.0.0.0", "this network"),
            ("0.1.2.3", "this network"),
            ("10.0.0.5", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "shared address space (CGNAT)"),
            ("100.127.255.255", "shared address space (CGNAT)"),
            ("127.0.0.1", "loopback"),
            ("127.255.255.254", "loopback"),
            ("169.254.169.254", "cloud metadata"),
            ("169.254.1.1", "link-local"),
            ("192.0.0.8", "IETF protocol assignments"),
            ("192.0.2.1", "documentation"),
            ("198.51.100.1", "documentation"),
            ("203.0.113.1", "documentation"),
            ("198.18.0.1", "benchmarking"),
            ("192.88.99.1", "6to4 relay anycast"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.250", "multicast"),
            ("240.0.0.1", "reserved"),
            ("255.255.255.255", "broadcast"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("fc00::1", "unique-local"),
            ("fd12:3456::1", "unique-local"),
            ("fe80::1", "link-local"),
            ("fec0::1", "site-local"),
            ("ff02::1", "multicast"),
            ("2001:db8::1", "documentation"),
            ("3fff::1", "documentation"),
            ("2001::1", "IETF protocol assignments"),
            ("100::1", "discard-only"),
            ("64:ff9b:1::1", "local-use NAT64"),
            ("::ffff:127.0.0.1", "IPv4-mapped non-public address"),
            ("::ffff:169.254.169.254", "IPv4-mapped non-public address"),
            ("::ffff:10.0.0.1", "IPv4-mapped non-public address"),
            ("64:ff9b::7f00:1", "NAT64 of a non-public address"),
            ("64:ff9b::a9fe:a9fe", "NAT64 of a non-public address"),
            ("2002:7f00:0001::1", "6to4 of a non-public address"),
            ("2002:0a00:0001::", "6to4 of a non-public address"),
            ("::127.0.0.1", "reserved"),
            ("4000::1", "reserved"),
        ] {
            assert_eq!(np(ip), Some(why), "{ip}");
        }
    }

    #[test]
    fn mapped_addresses_become_ipv4() {
        let a: SocketAddr = "[::ffff:127.0.0.1]:80".parse().unwrap();
        assert_eq!(canonical(a), "127.0.0.1:80".parse().unwrap());
        let b: SocketAddr = "[::1]:80".parse().unwrap();
        assert_eq!(canonical(b), b);
    }

    #[test]
    fn private_rules() {
        let r = PrivateRule::parse("127.0.0.1:8443").unwrap();
        assert!(r.matches("127.0.0.1:8443".parse().unwrap()));
        assert!(!r.matches("127.0.0.1:8444".parse().unwrap()));
        assert!(!r.matches("127.0.0.2:8443".parse().unwrap()));
        assert_eq!(r.to_string(), "127.0.0.1:8443");

        let n = PrivateRule::parse("10.0.0.0/8").unwrap();
        assert!(n.matches("10.1.2.3:1".parse().unwrap()));
        assert!(!n.matches("11.0.0.1:1".parse().unwrap()));
        assert_eq!(n.to_string(), "10.0.0.0/8");

        let v6 = PrivateRule::parse("[::1]:443").unwrap();
        assert!(v6.matches("[::1]:443".parse().unwrap()));
        assert!(!v6.matches("127.0.0.1:443".parse().unwrap()));
        assert_eq!(v6.to_string(), "[::1]:443");

        let ula = PrivateRule::parse("fd00::/8").unwrap();
        assert!(ula.matches("[fd12::1]:1".parse().unwrap()));
        assert!(!ula.matches("[fc00::1]:1".parse().unwrap()));
        assert!(PrivateRule::parse("[fd00::/8]:443")
            .unwrap()
            .matches("[fd00::5]:443".parse().unwrap()));
        assert!(PrivateRule::parse("::1")
            .unwrap()
            .matches("[::1]:9".parse().unwrap()));

        for bad in [
            "",
            "localhost",
            "10.0.0.1/8",
            "10.0.0.0/33",
            "10.0.0.0/-1",
            "1.2.3.4:0",
            "1.2.3.4:x",
            "[::1",
            "[::1]:",
            "::1/129",
            "*",
        ] {
            assert!(PrivateRule::parse(bad).is_err(), "{bad:?}");
        }
    }
}
