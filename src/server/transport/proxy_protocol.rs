//! The PROXY protocol (version 2) from trusted balancers: whom a connection is for.
//!
//! Behind a balancer every connection comes from the balancer's address, so the
//! per-peer connection cap (`max_connections_per_peer`) would count all its clients as
//! one. A balancer that speaks the PROXY protocol (HAProxy's `send-proxy-v2`) writes, before
//! the first HTTP byte, a binary header naming the client it relays. codebox reads it
//! only from the addresses `[http] trusted_proxies` lists:
//!
//! - from a trusted address the header is required: a connection without a valid v2
//!   header is refused (400, closed). Otherwise a client that can reach codebox from
//!   such an address, or a balancer relaying raw TCP, would be counted as whatever its
//!   first bytes say, or the balancer's misconfiguration would go unnoticed;
//! - from any other address a PROXY header (v2, or v1's `PROXY ` line) is refused the
//!   same way, with a warning naming the address: nobody else may say whom they relay;
//! - `LOCAL` (a balancer's own health check), an `UNSPEC` or `AF_UNIX` source, and a
//!   source that is not a stream (TCP) count as the balancer itself; `PROXY` over TCP4
//!   or TCP6 is the client's address (an IPv4-mapped IPv6 one as IPv4);
//! - the header is read byte-exact (nothing of the HTTP request after it is consumed),
//!   at most [`MAX_HEADER_BYTES`], within the caller's deadline (`header_timeout`); its
//!   TLVs are ignored. v1 (text) is not accepted: HAProxy sends v2 with `send-proxy-v2`.
//!
//! What the declared address is used for: the per-peer cap and the logs, nothing else.
//! It never grants anything: bearer tokens, the Host check and the loopback-only
//! tokenless mode depend on the request and the listening address, not on the peer, and
//! `serve` refuses `trusted_proxies` without tokens (clients behind a balancer are not
//! the local user), so a header declaring `127.0.0.1` is just another client.

use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use ipnet::IpNet;
use tokio::io::{AsyncRead, AsyncReadExt};

/// The v2 signature: the first 12 bytes of every v2 header.
pub const V2_SIGNATURE: &[u8; 12] = b"\r\n\r\n\0\r\nQUIT\n";
/// The start of a v1 (text) header.
const V1_START: &[u8] = b"PROXY ";
/// The longest v2 header accepted: the 16 fixed bytes, addresses (at most 216 for
/// AF_UNIX) and TLVs (HAProxy's `proxy-v2-options` add a few hundred bytes at most).
pub const MAX_HEADER_BYTES: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{entry}` in http.trusted_proxies is not an address or network (10.0.0.0/8, 192.0.2.7, fd00::/8)")]
    BadEntry { entry: String },
    #[error("`{entry}` in http.trusted_proxies has host bits set below its prefix (write the network address, {network})")]
    HostBits { entry: String, network: IpNet },
    #[error("a PROXY protocol v2 header is required from {peer} (it is in http.trusted_proxies)")]
    Missing { peer: SocketAddr },
    #[error(
        "a PROXY protocol v1 header from {peer}: only v2 is accepted (HAProxy: send-proxy-v2)"
    )]
    V1 { peer: SocketAddr },
    #[error("a PROXY protocol header from {peer}, which http.trusted_proxies does not list")]
    Untrusted { peer: SocketAddr },
    #[error("the PROXY protocol header from {peer} declares {declared} bytes (at most {MAX_HEADER_BYTES})")]
    TooLong { peer: SocketAddr, declared: usize },
    #[error("a malformed PROXY protocol v2 header from {peer}: {why}")]
    Malformed { peer: SocketAddr, why: String },
    #[error("the connection from {peer} ended within its PROXY protocol header")]
    Truncated { peer: SocketAddr },
    #[error("reading the PROXY protocol header from {peer}")]
    Read {
        peer: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// `[http] trusted_proxies`: the balancers whose PROXY headers are read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Addresses (`192.0.2.7`, `::1`) and networks (`10.0.0.0/8`, `fd00::/8`); a network
    /// with host bits set is refused (`10.1.2.3/8` is most likely a typo).
    pub fn parse(entries: &[String]) -> Result<TrustedProxies> {
        let mut nets = Vec::with_capacity(entries.len());
        for entry in entries.iter().map(|e| e.trim()) {
            let bad = || Error::BadEntry {
                entry: crate::egress::rules::pattern::clip(entry),
            };
            let net = match entry.contains('/') {
                true => IpNet::from_str(entry).map_err(|_| bad())?,
                false => IpNet::from(IpAddr::from_str(entry).map_err(|_| bad())?),
            };
            if net.trunc() != net {
                return Err(Error::HostBits {
                    entry: entry.to_string(),
                    network: net.trunc(),
                });
            }
            nets.push(net);
        }
        Ok(TrustedProxies(nets))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `ip` (plain, or IPv4-mapped on a dual-stack listener) is listed.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|net| net.contains(&ip))
    }
}

impl std::fmt::Display for TrustedProxies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list: Vec<String> = self.0.iter().map(|n| n.to_string()).collect();
        f.write_str(&list.join(", "))
    }
}

/// Whom a connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// The client: the address a trusted balancer declared, else the TCP peer.
    pub client: SocketAddr,
    /// The balancer that relayed it (a trusted peer's `PROXY` command).
    pub via: Option<SocketAddr>,
}

/// What came before the HTTP request: whom the connection is for, and the bytes read
/// that belong to the request (from an untrusted peer: its first bytes, read to tell a
/// PROXY header from HTTP).
#[derive(Debug)]
pub struct Preamble {
    pub peer: Peer,
    pub rest: Vec<u8>,
}

/// Reads what comes before the HTTP request on a connection from `tcp_peer`: from a
/// `trusted` peer its v2 header (exactly), from anyone else just enough to be sure it
/// does not start with a PROXY header. The caller bounds the time.
pub async fn read_preamble<S: AsyncRead + Unpin>(
    s: &mut S,
    tcp_peer: SocketAddr,
    trusted: bool,
) -> Result<Preamble> {
    let read_err = |source| Error::Read {
        peer: tcp_peer,
        source,
    };
    let mut buf = Vec::with_capacity(16);
    if !trusted {
        // Read until the bytes cannot start a PROXY header (one read, for any HTTP
        // request) or are one: at most 6 bytes, so a refusal reads the rest of the
        // request itself.
        loop {
            let mut chunk = [0u8; V1_START.len()];
            let n = s
                .read(&mut chunk[..V1_START.len() - buf.len()])
                .await
                .map_err(read_err)?;
            buf.extend_from_slice(&chunk[..n]);
            let could_be = |sig: &[u8]| {
                let k = buf.len().min(sig.len());
                buf[..k] == sig[..k]
            };
            if n == 0 || !(could_be(V2_SIGNATURE) || could_be(V1_START)) {
                return Ok(Preamble {
                    peer: Peer {
                        client: tcp_peer,
                        via: None,
                    },
                    rest: buf,
                });
            }
            if buf.len() >= V1_START.len() {
                return Err(Error::Untrusted { peer: tcp_peer });
            }
        }
    }
    // The 16 fixed bytes, checked as they come: a peer that sends anything else is told
    // so at once, not after a timeout.
    buf.resize(16, 0);
    let mut have = 0;
    while have < 16 {
        let n = s.read(&mut buf[have..16]).await.map_err(read_err)?;
        if n == 0 {
            return Err(Error::Truncated { peer: tcp_peer });
        }
        have += n;
        let k = have.min(V2_SIGNATURE.len());
        if buf[..k] != V2_SIGNATURE[..k] {
            let v1 = buf[..have.min(V1_START.len())] == V1_START[..have.min(V1_START.len())];
            return Err(match v1 {
                true => Error::V1 { peer: tcp_peer },
                false => Error::Missing { peer: tcp_peer },
            });
        }
    }
    let declared = usize::from(u16::from_be_bytes([buf[14], buf[15]]));
    if 16 + declared > MAX_HEADER_BYTES {
        return Err(Error::TooLong {
            peer: tcp_peer,
            declared: 16 + declared,
        });
    }
    buf.resize(16 + declared, 0);
    s.read_exact(&mut buf[16..])
        .await
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Error::Truncated { peer: tcp_peer },
            _ => read_err(e),
        })?;
    let client = client_of(&buf, tcp_peer)?;
    Ok(Preamble {
        peer: Peer {
            client: client.unwrap_or(tcp_peer),
            via: client.map(|_| tcp_peer),
        },
        rest: Vec::new(),
    })
}

/// The client a complete v2 header declares; `None`: the connection counts as the
/// balancer's own (LOCAL, or a source that is no TCP address).
fn client_of(header: &[u8], tcp_peer: SocketAddr) -> Result<Option<SocketAddr>> {
    use ppp::v2::{Addresses, Command, Header, Protocol};
    let malformed = |why: String| Error::Malformed {
        peer: tcp_peer,
        why,
    };
    let h = Header::try_from(header).map_err(|e| malformed(e.to_string()))?;
    if h.len() != header.len() {
        return Err(malformed("its length is not what it declares".into()));
    }
    if h.command == Command::Local || h.protocol != Protocol::Stream {
        return Ok(None);
    }
    Ok(match h.addresses {
        Addresses::IPv4(a) => Some(SocketAddr::new(IpAddr::V4(a.source_address), a.source_port)),
        Addresses::IPv6(a) => Some(SocketAddr::new(
            IpAddr::V6(a.source_address).to_canonical(),
            a.source_port,
        )),
        Addresses::Unspecified | Addresses::Unix(_) => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BALANCER: &str = "10.1.0.5:40000";

    /// A v2 header written by hand (independently of the parser): command, family and
    /// protocol byte, address block, TLV bytes.
    fn v2(command: u8, fam: u8, addrs: &[u8], tlvs: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(0x20 | command);
        h.push(fam);
        h.extend_from_slice(&((addrs.len() + tlvs.len()) as u16).to_be_bytes());
        h.extend_from_slice(addrs);
        h.extend_from_slice(tlvs);
        h
    }

    fn tcp4(src: [u8; 4], sport: u16) -> Vec<u8> {
        let mut a = src.to_vec();
        a.extend_from_slice(&[10, 1, 0, 9]);
        a.extend_from_slice(&sport.to_be_bytes());
        a.extend_from_slice(&8080u16.to_be_bytes());
        a
    }

    fn tcp6(src: std::net::Ipv6Addr, sport: u16) -> Vec<u8> {
        let mut a = src.octets().to_vec();
        a.extend_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
        a.extend_from_slice(&sport.to_be_bytes());
        a.extend_from_slice(&8080u16.to_be_bytes());
        a
    }

    async fn preamble(bytes: &[u8], trusted: bool) -> Result<Preamble> {
        let mut s = bytes;
        read_preamble(&mut s, BALANCER.parse().unwrap(), trusted).await
    }

    async fn client(bytes: &[u8]) -> Result<Peer> {
        preamble(bytes, true).await.map(|p| p.peer)
    }

    #[tokio::test]
    async fn a_trusted_balancer_names_its_clients() {
        let balancer: SocketAddr = BALANCER.parse().unwrap();
        let mut h = v2(1, 0x11, &tcp4([192, 0, 2, 7], 5555), &[]);
        h.extend_from_slice(b"GET / HTTP/1.1\r\n");
        let mut s = &h[..];
        let p = read_preamble(&mut s, balancer, true).await.unwrap();
        assert_eq!(p.peer.client, "192.0.2.7:5555".parse().unwrap());
        assert_eq!(p.peer.via, Some(balancer));
        assert!(p.rest.is_empty());
        assert_eq!(
            s, b"GET / HTTP/1.1\r\n",
            "nothing after the header is consumed"
        );
        // TCP6, also IPv4-mapped; TLVs ignored.
        let six: std::net::Ipv6Addr = "2001:db8::1".parse().unwrap();
        let p = client(&v2(1, 0x21, &tcp6(six, 1), &[0x04, 0, 1, 7]))
            .await
            .unwrap();
        assert_eq!(p.client, "[2001:db8::1]:1".parse().unwrap());
        let mapped: std::net::Ipv6Addr = "::ffff:198.51.100.3".parse().unwrap();
        let p = client(&v2(1, 0x21, &tcp6(mapped, 2), &[])).await.unwrap();
        assert_eq!(p.client, "198.51.100.3:2".parse().unwrap());
    }

    #[tokio::test]
    async fn local_unspec_unix_and_datagram_count_as_the_balancer() {
        let itself = Peer {
            client: BALANCER.parse().unwrap(),
            via: None,
        };
        // LOCAL (health checks): whatever the address block says.
        assert_eq!(client(&v2(0, 0x00, &[], &[])).await.unwrap(), itself);
        assert_eq!(
            client(&v2(0, 0x11, &tcp4([127, 0, 0, 1], 1), &[]))
                .await
                .unwrap(),
            itself
        );
        assert_eq!(client(&v2(1, 0x00, &[], &[])).await.unwrap(), itself);
        assert_eq!(client(&v2(1, 0x31, &[0; 216], &[])).await.unwrap(), itself);
        assert_eq!(
            client(&v2(1, 0x12, &tcp4([192, 0, 2, 9], 1), &[]))
                .await
                .unwrap(),
            itself
        );
    }

    #[tokio::test]
    async fn a_trusted_peer_without_a_valid_header_is_refused() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), "required"),
            (b"PROXY TCP4 192.0.2.1 10.0.0.1 1 2\r\n".to_vec(), "v1"),
            (b"\r\n\r\n\0\r\nQUIT".to_vec(), "ended within"),
            (
                v2(1, 0x11, &tcp4([1, 2, 3, 4], 1), &[])[..20].to_vec(),
                "ended within",
            ),
            (v2(1, 0x11, &[0; 4], &[]), "malformed"),
            (
                {
                    let mut h = v2(1, 0x11, &tcp4([1, 2, 3, 4], 1), &[]);
                    h[12] = 0x11; // version 1 in a v2 signature
                    h
                },
                "malformed",
            ),
            (
                {
                    let mut h = v2(1, 0x11, &tcp4([1, 2, 3, 4], 1), &[]);
                    h[12] = 0x2f; // command 15
                    h
                },
                "malformed",
            ),
            (v2(1, 0x41, &tcp4([1, 2, 3, 4], 1), &[]), "malformed"),
            (
                {
                    let mut h = V2_SIGNATURE.to_vec();
                    h.extend_from_slice(&[0x21, 0x11, 0xff, 0xff]);
                    h
                },
                "at most 4096",
            ),
            (Vec::new(), "ended within"),
        ];
        for (bytes, want) in cases {
            let e = client(&bytes).await.unwrap_err().to_string();
            assert!(e.contains(want), "{bytes:?}: {e}");
        }
        // The largest accepted header still parses.
        let big = v2(
            1,
            0x11,
            &tcp4([192, 0, 2, 1], 1),
            &vec![0xee; MAX_HEADER_BYTES - 28],
        );
        assert_eq!(big.len(), MAX_HEADER_BYTES);
        assert!(client(&big).await.is_ok());
    }

    #[tokio::test]
    async fn an_untrusted_peer_cannot_declare_anyone() {
        for bytes in [
            v2(1, 0x11, &tcp4([127, 0, 0, 1], 1), &[]),
            v2(0, 0x00, &[], &[]),
            b"PROXY TCP4 127.0.0.1 10.0.0.1 1 2\r\nGET / HTTP/1.1\r\n".to_vec(),
        ] {
            let e = preamble(&bytes, false).await.unwrap_err();
            assert!(matches!(e, Error::Untrusted { .. }), "{e}");
        }
        // HTTP passes: the bytes read are kept for the parser, the rest is unread.
        for bytes in [
            &b"POST /mcp HTTP/1.1\r\n"[..],
            b"PUT / HTTP/1.1\r\n",
            b"\r\nGET / HTTP/1.1\r\n",
            b"PROX",
            b"P",
            b"",
        ] {
            let mut s = bytes;
            let p = read_preamble(&mut s, BALANCER.parse().unwrap(), false)
                .await
                .unwrap();
            assert!(p.rest.len() <= 6);
            assert_eq!([&p.rest[..], s].concat(), bytes);
            assert_eq!(p.peer.client, BALANCER.parse().unwrap());
            assert_eq!(p.peer.via, None);
        }
    }

    #[test]
    fn trusted_proxies_parse_addresses_and_networks() {
        let t = TrustedProxies::parse(&[
            "10.0.0.0/8".into(),
            " 192.0.2.7 ".into(),
            "fd00::/8".into(),
            "::1".into(),
        ])
        .unwrap();
        for ip in [
            "10.200.1.1",
            "192.0.2.7",
            "::ffff:10.0.0.1",
            "fd12::5",
            "::1",
        ] {
            assert!(t.contains(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["11.0.0.1", "192.0.2.8", "127.0.0.1", "fe80::1"] {
            assert!(!t.contains(ip.parse().unwrap()), "{ip}");
        }
        assert_eq!(t.to_string(), "10.0.0.0/8, 192.0.2.7/32, fd00::/8, ::1/128");
        for bad in ["10.0.0.0/33", "example.com", "10.0.0.0/x", "", "1.2.3.4:80"] {
            let e = TrustedProxies::parse(&[bad.into()])
                .unwrap_err()
                .to_string();
            assert!(e.contains("not an address"), "{bad}: {e}");
        }
        let e = TrustedProxies::parse(&["10.1.2.3/8".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("host bits") && e.contains("10.0.0.0/8"), "{e}");
        assert!(TrustedProxies::parse(&[]).unwrap().is_empty());
    }
}
