//! Proxy mode's kernel side, against the real kernel, as root and rootless: the sandbox
//! init binds the egress listener inside the sandbox's own network namespace and hands it
//! over; the program reaches that listener and nothing else.
//!
//! The test itself holds the listener (no proxy): what matters here is what the kernel
//! lets the program do. Every probe that must fail names the layer that refuses it:
//! landlock (`EACCES` on connect/bind), seccomp (`EPERM` on socket types and TCP Fast
//! Open), the empty namespace (`ENETUNREACH`, no DNS).
//!
//! `harness = false`: the spawner must be forked while the process is single-threaded.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::time::Duration;

use codebox::runtime::{self, Language};
use codebox::sandbox::landlock::{kernel_abi, NET_ABI};
use codebox::sandbox::ProgramStatus;
use codebox::spawner::wire::SpawnNetwork;
use codebox::spawner::SpawnSpec;
use libtest_mimic::{Failed, Trial};

mod common;
use common::spawner_harness as harness;

fn main() {
    let (args, host) = harness::arguments_and_host("egress kernel tests", || {
        if kernel_abi().unwrap_or(0) < NET_ABI {
            return Err(format!(
                "landlock ABI {:?} has no TCP rules (needs {NET_ABI})",
                kernel_abi()
            ));
        }
        Ok(())
    });
    // SAFETY: no thread exists yet: libtest-mimic has not started and tokio is not built.
    unsafe { harness::start_spawner(&host) };
    let trials = vec![
        Trial::test(
            "python_reaches_the_listener_and_nothing_else",
            python_reaches_the_listener_and_nothing_else,
        ),
        Trial::test(
            "typescript_reaches_the_listener_and_nothing_else",
            typescript_reaches_the_listener_and_nothing_else,
        ),
        Trial::test(
            "the_listener_is_the_supervisors_alone",
            the_listener_is_the_supervisors_alone,
        ),
        Trial::test("side_doors_stay_shut", side_doors_stay_shut),
        Trial::test(
            "the_proxy_environment_and_trust_bundle_are_in_place",
            the_proxy_environment_and_trust_bundle_are_in_place,
        ),
        Trial::test(
            "without_proxy_mode_there_is_no_listener",
            without_proxy_mode_there_is_no_listener,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}

use harness::block_on;

/// The shared default spawn of `language`, with `network`.
fn spec(language: Language, network: Option<SpawnNetwork>) -> SpawnSpec {
    SpawnSpec {
        network,
        ..harness::spec(language)
    }
}

struct Run {
    stdout: String,
    stderr: String,
    status: Option<ProgramStatus>,
    /// What the test's side of the listener saw: one line per accepted connection.
    accepted: Vec<String>,
}

/// Runs `code` in a proxy-mode sandbox while a thread accepts on its listener, answers
/// `hello` to each connection and records the first line each one sent.
fn run(language: Language, code: &str, trust: Option<std::path::PathBuf>) -> Result<Run, Failed> {
    block_on(async {
        let mut sb = harness::client()
            .spawn(spec(language, Some(SpawnNetwork::Proxy { trust })))
            .await
            .map_err(|e| e.to_string())?;
        let listener = sb
            .take_egress_listener()
            .ok_or("a proxy-mode sandbox came without its listener")?;
        let server = std::thread::spawn(move || serve_hello(listener));
        let outcome = sb
            .run_to_completion(
                &runtime::boot_frame(code),
                1 << 20,
                1 << 20,
                Duration::from_secs(20),
                std::future::pending(),
                |_, _| {},
            )
            .await
            .map_err(|e| e.to_string())?;
        let accepted = server.join().map_err(|_| "listener thread panicked")?;
        Ok(Run {
            stdout: String::from_utf8_lossy(&outcome.stdout.bytes).into_owned(),
            stderr: String::from_utf8_lossy(&outcome.stderr.bytes).into_owned(),
            status: outcome.status,
            accepted,
        })
    })
}

/// Accepts until no connection has come for a while (the program has ended by then).
fn serve_hello(listener: OwnedFd) -> Vec<String> {
    let listener = std::net::TcpListener::from(listener);
    listener.set_nonblocking(true).unwrap();
    let mut seen = Vec::new();
    let mut idle = std::time::Instant::now();
    while idle.elapsed() < Duration::from_secs(3) {
        match listener.accept() {
            Ok((mut conn, peer)) => {
                idle = std::time::Instant::now();
                conn.set_nonblocking(false).unwrap();
                conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                let _ = conn.write_all(b"hello\n");
                let mut buf = [0u8; 256];
                let n = conn.read(&mut buf).unwrap_or(0);
                let line = String::from_utf8_lossy(&buf[..n]).trim().to_string();
                seen.push(format!("{line} from {}", peer.ip()));
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("accept failed: {e}"),
        }
    }
    seen
}

fn check(cond: bool, msg: impl Into<String>) -> Result<(), Failed> {
    if cond {
        Ok(())
    } else {
        Err(msg.into().into())
    }
}

fn expect_lines(run: &Run, wants: &[&str]) -> Result<(), Failed> {
    check(
        run.status == Some(ProgramStatus::Exited(0)),
        format!(
            "status {:?}\nstdout:\n{}\nstderr:\n{}",
            run.status, run.stdout, run.stderr
        ),
    )?;
    for want in wants {
        check(
            run.stdout.lines().any(|l| l == *want),
            format!("no line {want:?} in:\n{}", run.stdout),
        )?;
    }
    Ok(())
}

const PYTHON_PROBES: &str = r#"
import errno, os, socket

def name(e):
    if isinstance(e, OSError) and not isinstance(e, socket.gaierror) and e.errno:
        return errno.errorcode.get(e.errno, str(e.errno))
    return type(e).__name__

import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def unshare(flags):
    if libc.unshare(flags) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))

def attempt(label, f):
    try:
        f()
        print(label, "OK")
    except Exception as e:
        print(label, name(e))

def tcp(host, port, family=socket.AF_INET):
    def go():
        s = socket.socket(family, socket.SOCK_STREAM)
        s.settimeout(3)
        try:
            s.connect((host, port))
            if port == 3128:
                assert s.recv(16) == b"hello\n"
                s.sendall(b"python " + host.encode() + b"\n")
        finally:
            s.close()
    return go

print("interfaces", sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]))
attempt("proxy-port", tcp("127.0.0.1", 3128))
attempt("mapped-proxy-port", tcp("::ffff:127.0.0.1", 3128, socket.AF_INET6))
attempt("other-port", tcp("127.0.0.1", 3129))
attempt("port-80", tcp("127.0.0.1", 80))
attempt("v6-other-port", tcp("::1", 443, socket.AF_INET6))
attempt("outside-other-port", tcp("10.0.2.2", 443))
attempt("outside-proxy-port", tcp("10.0.2.2", 3128))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
attempt("udp6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM))
attempt("raw", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW))
attempt("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW))
def bind_any():
    s = socket.socket(); s.bind(("127.0.0.1", 0))
attempt("bind", bind_any)
def bind_proxy_port():
    s = socket.socket(); s.bind(("127.0.0.1", 3128))
attempt("bind-proxy-port", bind_proxy_port)
def fastopen():
    s = socket.socket()
    s.sendto(b"x", socket.MSG_FASTOPEN, ("127.0.0.1", 3129))
attempt("fastopen", fastopen)
attempt("dns", lambda: socket.getaddrinfo("example.com", 443))
attempt("unshare-net", lambda: unshare(0x40000000))
attempt("unshare-user", lambda: unshare(0x10000000))
attempt("init-fds", lambda: os.listdir("/proc/1/fd"))
"#;

fn python_reaches_the_listener_and_nothing_else() -> Result<(), Failed> {
    let run = run(Language::Python, PYTHON_PROBES, None)?;
    expect_lines(
        &run,
        &[
            "interfaces ['lo']",
            "proxy-port OK",
            "mapped-proxy-port OK",
            // landlock: only the egress port may be connected to.
            "other-port EACCES",
            "port-80 EACCES",
            "v6-other-port EACCES",
            "outside-other-port EACCES",
            // the namespace: no route anywhere but lo.
            "outside-proxy-port ENETUNREACH",
            // seccomp: TCP only, and no families but unix and IP.
            "udp EPERM",
            "udp6 EPERM",
            "raw EPERM",
            "packet EPERM",
            "netlink EPERM",
            // landlock: no bind at all; the port is taken anyway.
            "bind EACCES",
            "bind-proxy-port EACCES",
            // seccomp: no connect hidden in a send.
            "fastopen EPERM",
            // no DNS: no resolver, no UDP.
            "dns gaierror",
            "unshare-net EPERM",
            "unshare-user EPERM",
            "init-fds EACCES",
        ],
    )?;
    let mut accepted = run.accepted.clone();
    accepted.sort();
    check(
        accepted
            == [
                "python 127.0.0.1 from 127.0.0.1",
                "python ::ffff:127.0.0.1 from 127.0.0.1",
            ],
        format!("the listener saw {:?}", run.accepted),
    )
}

const DENO_PROBES: &str = r#"
async function attempt(label: string, f: () => Promise<unknown> | unknown) {
  try {
    await f();
    console.log(label, "OK");
  } catch (e) {
    console.log(label, (e as { code?: string }).code ?? (e as Error).name);
  }
}
async function tcp(hostname: string, port: number) {
  const conn = await Deno.connect({ hostname, port });
  try {
    if (port === 3128) {
      const buf = new Uint8Array(16);
      const n = await conn.read(buf);
      if (new TextDecoder().decode(buf.subarray(0, n ?? 0)) !== "hello\n") throw new Error("no hello");
      await conn.write(new TextEncoder().encode("deno " + hostname + "\n"));
    }
  } finally {
    conn.close();
  }
}
await attempt("proxy-port", () => tcp("127.0.0.1", 3128));
await attempt("other-port", () => tcp("127.0.0.1", 3129));
await attempt("outside", () => tcp("10.0.2.2", 443));
import dgram from "node:dgram";
await attempt("udp", () => new Promise((resolve, reject) => {
  const s = dgram.createSocket("udp4");
  s.on("error", reject);
  s.send("x", 53, "127.0.0.1", (e) => (e ? reject(e) : resolve(s.close())));
}));
await attempt("listen", () => Deno.listen({ hostname: "127.0.0.1", port: 0 }));
await attempt("dns", () => Deno.resolveDns("example.com", "A"));
// HTTP_PROXY is set: fetch goes to the listener (which is no HTTP proxy here).
await attempt("fetch", () => fetch("http://127.0.0.1:3129/"));
"#;

fn typescript_reaches_the_listener_and_nothing_else() -> Result<(), Failed> {
    let run = run(Language::TypeScript, DENO_PROBES, None)?;
    expect_lines(
        &run,
        &[
            "proxy-port OK",
            "other-port EACCES",
            "outside EACCES",
            "udp EPERM",
            "listen EACCES",
            "fetch TypeError",
        ],
    )?;
    check(
        run.stdout
            .lines()
            .any(|l| l.starts_with("dns ") && l != "dns OK"),
        format!("DNS answered:\n{}", run.stdout),
    )?;
    // fetch's connection reaches the listener; whether its request line arrives first is
    // a race with the listener's greeting, which Deno's client may read as a malformed
    // response and close on before it writes.
    check(
        run.accepted.len() == 2
            && run.accepted[0] == "deno 127.0.0.1 from 127.0.0.1"
            && (run.accepted[1].starts_with("GET http://127.0.0.1:3129/ HTTP/1.1")
                || run.accepted[1] == " from 127.0.0.1"),
        format!("the listener saw {:?}", run.accepted),
    )
}

/// No process in the sandbox holds the listening socket: nothing there can accept the
/// connections meant for the supervisor, or learn of other sandboxes' traffic.
fn the_listener_is_the_supervisors_alone() -> Result<(), Failed> {
    let code = r#"
import os, socket, stat
held = []
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                if stat.S_ISSOCK(os.stat(f"/proc/{pid}/fd/{fd}").st_mode):
                    held.append((pid, fd))
            except OSError:
                pass
    except OSError as e:
        print("unreadable", pid)
print("sockets", held)
lines = open("/proc/net/tcp").read().splitlines()[1:]
listening = [l.split()[1] for l in lines if l.split()[3] == "0A"]
print("listening", listening)
"#;
    let run = run(Language::Python, code, None)?;
    expect_lines(
        &run,
        &[
            // 127.0.0.1:3128 in /proc/net/tcp's hex, held by no process of the sandbox.
            "listening ['0100007F:0C38']",
            "unreadable 1",
        ],
    )?;
    // The program's own fd 3 is a unix socket (the tool channel); nothing else.
    check(
        run.stdout.contains("sockets [('2', '3')]"),
        format!("sockets held in the sandbox:\n{}", run.stdout),
    )
}

/// What a hostile review tried next to the plain probes: other stream protocols and
/// families, every way of connecting without `connect(2)`, re-connecting a connected
/// socket, a listener of its own, io_uring, and taking the init's descriptors or memory.
/// Each names the layer that refuses it.
const SIDE_DOORS: &str = r#"
import ctypes, errno, os, socket, struct
libc = ctypes.CDLL(None, use_errno=True)

def attempt(label, f):
    try:
        f()
        print(label, "OK")
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, str(e.errno)))

def check(r):
    if r < 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))
    return r

def sock(family, kind, proto=0):
    return lambda: socket.socket(family, kind, proto).close()

attempt("mptcp", sock(socket.AF_INET, socket.SOCK_STREAM, 262))
attempt("mptcp6", sock(socket.AF_INET6, socket.SOCK_STREAM, 262))
attempt("sctp-stream", sock(socket.AF_INET, socket.SOCK_STREAM, 132))
attempt("sctp-seqpacket", sock(socket.AF_INET, socket.SOCK_SEQPACKET, 132))
attempt("vsock", sock(40, socket.SOCK_STREAM))
attempt("smc", sock(43, socket.SOCK_STREAM))
attempt("tipc", sock(30, socket.SOCK_RDM))

def fastopen_connect():
    s = socket.socket()
    s.setsockopt(socket.IPPROTO_TCP, 30, 1)  # TCP_FASTOPEN_CONNECT
    s.connect(("127.0.0.1", 3129))
attempt("fastopen-connect", fastopen_connect)
def fastopen_sendmsg():
    socket.socket().sendmsg([b"x"], [], socket.MSG_FASTOPEN, ("127.0.0.1", 3129))
attempt("fastopen-sendmsg", fastopen_sendmsg)
def fastopen_sendmmsg():
    s = socket.socket()
    check(libc.syscall(307, s.fileno(), None, 0, socket.MSG_FASTOPEN))  # sendmmsg
attempt("fastopen-sendmmsg", fastopen_sendmmsg)

def unspec_reconnect():
    s = socket.socket()
    s.settimeout(3)
    s.connect(("127.0.0.1", 3128))
    unspec = struct.pack("=H14x", socket.AF_UNSPEC)
    check(libc.connect(s.fileno(), ctypes.c_char_p(unspec), len(unspec)))
    s.connect(("127.0.0.1", 3129))
attempt("unspec-reconnect", unspec_reconnect)

# listen() binds an ephemeral port itself (landlock sees no bind), but nothing in the
# sandbox may connect to it: the port is not the egress port.
own = socket.socket()
own.listen(1)
print("own-listener-port-is-egress", own.getsockname()[1] == 3128)
attempt("connect-own-listener", lambda: socket.create_connection(("127.0.0.1", own.getsockname()[1]), 3))

attempt("io_uring", lambda: check(libc.syscall(425, 8, ctypes.create_string_buffer(128))))
pidfd = os.pidfd_open(1)
attempt("pidfd_getfd", lambda: check(libc.syscall(438, pidfd, 0, 0)))
attempt("ptrace-init", lambda: check(libc.ptrace(16, 1, None, None)))  # PTRACE_ATTACH
attempt("init-mem", lambda: open("/proc/1/mem", "rb"))
attempt("init-environ", lambda: open("/proc/1/environ", "rb"))
"#;

fn side_doors_stay_shut() -> Result<(), Failed> {
    let run = run(Language::Python, SIDE_DOORS, None)?;
    expect_lines(
        &run,
        &[
            // seccomp: TCP is the only IP stream protocol, IP and unix the only families.
            "mptcp EPERM",
            "mptcp6 EPERM",
            "sctp-stream EPERM",
            "sctp-seqpacket EPERM",
            "vsock EPERM",
            "smc EPERM",
            "tipc EPERM",
            // landlock: a Fast Open connect is still a connect.
            "fastopen-connect EACCES",
            // seccomp: no connect hidden in a send.
            "fastopen-sendmsg EPERM",
            "fastopen-sendmmsg EPERM",
            // landlock checks every connect, also of a socket that was connected before.
            "unspec-reconnect EACCES",
            "own-listener-port-is-egress False",
            "connect-own-listener EACCES",
            // seccomp: no io_uring (ENOSYS), no descriptor or memory of another process.
            "io_uring ENOSYS",
            "pidfd_getfd EPERM",
            "ptrace-init EPERM",
            // the init is not dumpable: its /proc entries are closed to the program.
            "init-mem EACCES",
            "init-environ EACCES",
        ],
    )
}

fn the_proxy_environment_and_trust_bundle_are_in_place() -> Result<(), Failed> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    std::fs::write(dir.path().join("ca-bundle.pem"), "test bundle\n").map_err(|e| e.to_string())?;
    // The sandbox user must be able to read it (as root it is nobody on the host).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
        .map_err(|e| e.to_string())?;
    let code = r#"
import os
for k in ["HTTP_PROXY", "https_proxy", "ALL_PROXY", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "DENO_CERT", "NO_PROXY"]:
    print(k, os.environ.get(k))
print("bundle", open(os.environ["SSL_CERT_FILE"]).read().strip())
try:
    open("/etc/codebox/ca-bundle.pem", "a")
    print("bundle writable")
except OSError as e:
    print("bundle", e.strerror)
"#;
    let run = run(Language::Python, code, Some(dir.path().to_path_buf()))?;
    expect_lines(
        &run,
        &[
            "HTTP_PROXY http://127.0.0.1:3128",
            "https_proxy http://127.0.0.1:3128",
            "ALL_PROXY http://127.0.0.1:3128",
            "SSL_CERT_FILE /etc/codebox/ca-bundle.pem",
            "REQUESTS_CA_BUNDLE /etc/codebox/ca-bundle.pem",
            "DENO_CERT /etc/codebox/ca-bundle.pem",
            "NO_PROXY None",
            "bundle test bundle",
        ],
    )?;
    // Landlock refuses the write before the read-only mount would.
    check(
        run.stdout.contains("bundle Permission denied")
            || run.stdout.contains("bundle Read-only file system"),
        format!("the bundle is writable:\n{}", run.stdout),
    )
}

/// The default mode is exactly what it was: no listener comes back, `lo` stays down and
/// no IP socket can be made.
fn without_proxy_mode_there_is_no_listener() -> Result<(), Failed> {
    block_on(async {
        let mut sb = harness::client()
            .spawn(spec(Language::Python, None))
            .await
            .map_err(|e| e.to_string())?;
        check(
            sb.take_egress_listener().is_none(),
            "a listener without proxy mode",
        )?;
        let outcome = sb
            .run_to_completion(
                &runtime::boot_frame(
                    "import socket, os\nprint('proxy', os.environ.get('HTTP_PROXY'))\n\
                     try:\n    socket.socket()\nexcept PermissionError:\n    print('inet refused')\n",
                ),
                1 << 20,
                1 << 20,
                Duration::from_secs(20),
                std::future::pending(),
                |_, _| {},
            )
            .await
            .map_err(|e| e.to_string())?;
        let out = String::from_utf8_lossy(&outcome.stdout.bytes).into_owned();
        check(
            out.contains("proxy None") && out.contains("inet refused"),
            out.clone(),
        )
    })
}
