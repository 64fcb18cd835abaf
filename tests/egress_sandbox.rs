//! Proxy mode end to end, as a user runs it: `codebox run` with a profile in proxy mode,
//! real Python and Deno programs in real sandboxes, a real HTTPS "API" on 127.0.0.1 with
//! its own test CA (trusted by the proxy through `extra_roots`), and a credential the
//! program must never see. Root and rootless (the unprivileged pass runs this binary as
//! another user).
//!
//! The API's address is private, so the profile names it in `allow_private`; `localhost`
//! resolves (on the supervisor, through /etc/hosts) to it.

mod common;
#[path = "egress/support.rs"]
mod support;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use common::*;
use support::{Origin, TestPki};

/// Made fresh for every test binary run; matched by the programs with a pattern that does
/// not match itself.
fn secret() -> &'static str {
    static SECRET: OnceLock<String> = OnceLock::new();
    SECRET.get_or_init(|| {
        let mut raw = [0u8; 16];
        getrandom::fill(&mut raw).unwrap();
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        format!("cbxsecret-{hex}")
    })
}

/// The origins (an HTTPS API with a credential, a second HTTPS origin the profile allows
/// by name but not by address) and the profile, for one test (dropped with it, so its
/// directory goes too).
struct World {
    _rt: tokio::runtime::Runtime,
    api: Origin,
    other: Origin,
    dir: tempfile::TempDir,
}

fn world() -> World {
    {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let pki = TestPki::new();
        let (api, other) = rt.block_on(async {
            (
                Origin::start(Some(pki.server.clone())).await,
                Origin::start(Some(pki.server.clone())).await,
            )
        });
        let dir = tempfile::tempdir().unwrap();
        // The sandbox user (nobody, as root) reads the trust bundle below the state dir.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::write(dir.path().join("test-ca.pem"), &pki.ca_pem).unwrap();
        let default = include_str!("../policies/profiles/default.toml");
        let base = default.split("[network]").next().unwrap();
        let profile = format!(
            "{base}[network]\n\
             mode = \"proxy\"\n\
             allow = [\"localhost:{api}\", \"localhost:{other}\", \"*.example.org\"]\n\
             deny = [\"evil.example.org\"]\n\
             allow_private = [\"127.0.0.1:{api}\"]\n\
             extra_roots = [\"{ca}\"]\n\
             [[network.credentials]]\n\
             host = \"localhost:{api}\"\n\
             header = \"X-Api-Key\"\n\
             value = \"env:CODEBOX_TEST_API_KEY\"\n",
            api = api.port(),
            other = other.port(),
            ca = dir.path().join("test-ca.pem").display(),
        );
        std::fs::write(dir.path().join("proxy.toml"), profile).unwrap();
        World {
            _rt: rt,
            api,
            other,
            dir,
        }
    }
}

fn run(w: &World, language: &str, code: &str) -> Value {
    let state = w.dir.path().join("state");
    let out = Command::new(codebox_bin())
        .args(["run", "--json", "--profile"])
        .arg(w.dir.path().join("proxy.toml"))
        .arg("--state-dir")
        .arg(&state)
        .args([language, "-c", code])
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .env("CODEBOX_TEST_API_KEY", secret())
        .output()
        .expect("codebox runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stdout.contains(secret()) && !stderr.contains(secret()),
        "the secret left the sandbox:\n{stdout}\n{stderr}"
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON from codebox ({e}); status {:?}\nstdout: {stdout}\nstderr: {stderr}",
            out.status
        )
    })
}

fn stdout(v: &Value) -> &str {
    v["stdout"].as_str().unwrap_or_default()
}

fn lines(v: &Value) -> Vec<&str> {
    stdout(v).lines().collect()
}

fn records(v: &Value) -> &Vec<Value> {
    v["network"]["connections"]
        .as_array()
        .unwrap_or_else(|| panic!("no network records: {v:#}"))
}

fn record_for<'a>(v: &'a Value, host: &str, port: u16) -> &'a Value {
    records(v)
        .iter()
        .find(|r| r["host"] == host && r["port"] == port)
        .unwrap_or_else(|| panic!("no record for {host}:{port}: {v:#}"))
}

/// A Python search for the secret: the environment, every readable file outside /proc
/// and /sys, the /proc files of every process it can read, and its own memory. The
/// pattern does not match itself.
const PYTHON_SEARCH: &str = r#"
import os, re
pat = re.compile(rb"cbxsecret-[0-9a-f]{32}")
found = []
if any(pat.search(f"{k}={v}".encode()) for k, v in os.environ.items()):
    found.append("environ")
for top in ["/etc", "/tmp", "/workspace", "/opt", "/dev/shm"]:
    for root, dirs, files in os.walk(top):
        for f in files:
            p = os.path.join(root, f)
            try:
                with open(p, "rb") as fh:
                    if pat.search(fh.read()):
                        found.append(p)
            except OSError:
                pass
for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
    for f in ["environ", "cmdline"]:
        try:
            if pat.search(open(f"/proc/{pid}/{f}", "rb").read()):
                found.append(f"/proc/{pid}/{f}")
        except OSError:
            pass
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
    for line in maps:
        addr, perms = line.split()[:2]
        if not perms.startswith("r"):
            continue
        start, end = (int(x, 16) for x in addr.split("-"))
        if end - start > 256 << 20:
            continue
        try:
            mem.seek(start)
            if pat.search(mem.read(end - start)):
                found.append("memory " + line.split()[-1])
        except (OSError, ValueError, OverflowError):
            pass
print("secret found:", found)
"#;

#[test]
fn python_calls_an_allowed_https_api_with_a_credential_it_never_sees() {
    if !sandbox_available("python_calls_an_allowed_https_api_with_a_credential_it_never_sees") {
        return;
    }
    let w = &world();
    let port = w.api.port();
    let code = format!(
        r#"
import http.client, json, os, ssl, urllib.request
# urllib: HTTPS_PROXY from the environment, the trust bundle from SSL_CERT_FILE.
r = urllib.request.urlopen("https://localhost:{port}/echo")
body = r.read().decode()
print("status", r.status)
print("key in body", [l for l in body.splitlines() if l.startswith("x-api-key")])
print("key in headers", r.headers.get("x-echo-x-api-key"))
# http.client with an explicit CONNECT tunnel, as requests-style clients do.
c = http.client.HTTPSConnection("127.0.0.1", 3128, context=ssl.create_default_context())
c.set_tunnel("localhost", {port})
c.request("GET", "/ok")
print("tunnel", c.getresponse().status)
{search}
"#,
        search = PYTHON_SEARCH
    );
    let v = run(w, "python", &code);
    assert_eq!(v["exit_code"], 0, "{v:#}");
    let out = lines(&v);
    assert!(out.contains(&"status 200"), "{v:#}");
    // The origin echoed the header it received; the proxy replaced the value on the way
    // back, so the program saw only the marker.
    assert!(
        out.contains(&"key in body ['x-api-key: [REDACTED]']"),
        "{v:#}"
    );
    assert!(out.contains(&"key in headers [REDACTED]"), "{v:#}");
    assert!(out.contains(&"tunnel 200"), "{v:#}");
    assert!(out.contains(&"secret found: []"), "{v:#}");
    // The API received the real credential.
    let seen = w.api.seen.lock().unwrap().clone();
    assert!(
        seen.iter()
            .any(|s| s.header("x-api-key") == Some(secret()) && s.uri == "/echo"),
        "the API did not get the credential: {seen:?}"
    );
    let rec = record_for(&v, "localhost", port);
    assert_eq!(rec["allowed"], true, "{rec}");
    assert_eq!(rec["kind"], "intercept", "{rec}");
    assert_eq!(rec["credential_added"], true, "{rec}");
    assert!(rec["bytes_down"].as_u64().unwrap() > 0, "{rec}");
}

#[test]
fn typescript_calls_an_allowed_https_api_with_a_credential_it_never_sees() {
    if !sandbox_available("typescript_calls_an_allowed_https_api_with_a_credential_it_never_sees") {
        return;
    }
    let w = &world();
    let port = w.api.port();
    let code = format!(
        r#"
const r = await fetch("https://localhost:{port}/echo");
const body = await r.text();
console.log("status", r.status);
console.log("key in body", body.split("\n").filter((l) => l.startsWith("x-api-key")).join());
console.log("key in headers", r.headers.get("x-echo-x-api-key"));
const pat = /cbxsecret-[0-9a-f]{{32}}/;
const found: string[] = [];
for (const [k, v] of Object.entries(Deno.env.toObject())) if (pat.test(`${{k}}=${{v}}`)) found.push("env " + k);
for (const f of ["/etc/codebox/ca-bundle.pem", "/proc/self/environ", "/proc/self/cmdline"]) {{
  try {{ if (pat.test(new TextDecoder().decode(Deno.readFileSync(f)))) found.push(f); }} catch {{}}
}}
console.log("secret found:", JSON.stringify(found));
"#
    );
    let v = run(w, "typescript", &code);
    assert_eq!(v["exit_code"], 0, "{v:#}");
    let out = lines(&v);
    assert!(out.contains(&"status 200"), "{v:#}");
    assert!(out.contains(&"key in body x-api-key: [REDACTED]"), "{v:#}");
    assert!(out.contains(&"key in headers [REDACTED]"), "{v:#}");
    assert!(out.contains(&"secret found: []"), "{v:#}");
    let rec = record_for(&v, "localhost", port);
    assert_eq!(rec["credential_added"], true, "{rec}");
}

#[test]
fn refusals_carry_their_reason_to_the_program_and_the_result() {
    if !sandbox_available("refusals_carry_their_reason_to_the_program_and_the_result") {
        return;
    }
    let w = &world();
    let (api, other) = (w.api.port(), w.other.port());
    let code = format!(
        r#"
import urllib.request
def get(label, url):
    try:
        print(label, "OK", urllib.request.urlopen(url, timeout=20).status)
    except Exception as e:
        print(label, "ERR", e)
get("unlisted", "https://unlisted.example.com/")
get("denied", "https://evil.example.org/")
get("private", "https://localhost:{other}/ok")
get("plain-unlisted", "http://unlisted.example.com/x")
get("bare-ip", "https://10.0.0.1/")
get("redirect", "https://localhost:{api}/redirect?to=https://unlisted.example.com/")
"#
    );
    let v = run(w, "python", &code);
    let out = stdout(&v);
    for (label, reason) in [
        (
            "unlisted",
            "egress to unlisted.example.com:443 denied (not in allowlist)",
        ),
        (
            "denied",
            "egress to evil.example.org:443 denied (denied by rule evil.example.org)",
        ),
        ("private", "127.0.0.1"),
        (
            "plain-unlisted",
            "egress to unlisted.example.com:80 denied (not in allowlist)",
        ),
        ("bare-ip", "egress to 10.0.0.1:443 denied"),
        (
            "redirect",
            "egress to unlisted.example.com:443 denied (not in allowlist)",
        ),
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{label} ")))
            .unwrap_or_else(|| panic!("no line for {label}: {v:#}"));
        assert!(line.contains(" ERR "), "{line}\n{v:#}");
        assert!(line.contains(reason), "{label}: {line:?} lacks {reason:?}");
    }
    let rec = record_for(&v, "evil.example.org", 443);
    assert_eq!(rec["allowed"], false);
    assert_eq!(rec["rule"], "evil.example.org", "{rec}");
    let rec = record_for(&v, "localhost", other);
    assert_eq!(rec["allowed"], false, "{rec}");
    assert!(
        rec["reason"].as_str().unwrap().contains("127.0.0.1"),
        "{rec}"
    );
    // The redirect's first hop was allowed; the second connection was checked again.
    assert!(records(&v)
        .iter()
        .any(|r| r["host"] == "localhost" && r["port"] == api && r["allowed"] == true));
    assert_eq!(v["network"]["denied"].as_u64().unwrap(), 6, "{v:#}");
}

#[test]
fn typescript_refusals_name_their_reason() {
    if !sandbox_available("typescript_refusals_name_their_reason") {
        return;
    }
    let w = &world();
    let other = w.other.port();
    let code = format!(
        r#"
for (const [label, url] of [["unlisted", "https://unlisted.example.com/"], ["private", "https://localhost:{other}/ok"], ["plain", "http://unlisted.example.com/"]]) {{
  try {{
    const r = await fetch(url);
    console.log(label, "HTTP", r.status, (await r.text()).trim());
  }} catch (e) {{
    console.log(label, "ERR", String((e as Error).message));
  }}
}}
"#
    );
    let v = run(w, "typescript", &code);
    let out = stdout(&v);
    for (label, reason) in [
        (
            "unlisted",
            "egress to unlisted.example.com:443 denied (not in allowlist)",
        ),
        ("private", "127.0.0.1"),
        (
            "plain",
            "egress to unlisted.example.com:80 denied (not in allowlist)",
        ),
    ] {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("{label} ")))
            .unwrap_or_else(|| panic!("no line for {label}: {v:#}"));
        assert!(line.contains(reason), "{label}: {line:?} lacks {reason:?}");
    }
    // One record per refused connection: Deno's question to the proxy about why (see
    // runtime/deno/egress.js) is none.
    let hosts: Vec<(&str, &str)> = records(&v)
        .iter()
        .map(|r| {
            (
                r["host"].as_str().unwrap(),
                r["reason"].as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(hosts.len(), 3, "{hosts:?}");
    assert!(
        hosts
            .iter()
            .all(|(h, why)| !h.is_empty() && !why.contains("request head")),
        "{hosts:?}"
    );
}

/// `codebox run` reads codebox.toml as `serve` does: its `[network]` (here: proxy mode, a
/// private CA in extra_roots, a credential) and `state_dir` apply, whether the file is
/// named with `--config`, `$CODEBOX_CONFIG`, or found as `./codebox.toml`.
#[test]
fn the_cli_reads_codebox_toml_for_the_network_and_its_private_ca() {
    if !sandbox_available("the_cli_reads_codebox_toml_for_the_network_and_its_private_ca") {
        return;
    }
    let w = &world();
    let profile = std::fs::read_to_string(w.dir.path().join("proxy.toml")).unwrap();
    let network = &profile[profile.find("[network]").unwrap()..];
    let config = w.dir.path().join("codebox.toml");
    std::fs::write(
        &config,
        format!(
            "state_dir = \"{}\"\n{network}",
            w.dir.path().join("state-config").display()
        ),
    )
    .unwrap();
    let code = format!(
        "import urllib.request\nprint(urllib.request.urlopen('https://localhost:{}/ok').read().decode())",
        w.api.port()
    );
    for how in ["--config", "CODEBOX_CONFIG", "cwd"] {
        let mut cmd = Command::new(codebox_bin());
        cmd.arg("run").arg("--json");
        match how {
            "--config" => {
                cmd.arg("--config").arg(&config);
            }
            "CODEBOX_CONFIG" => {
                cmd.env("CODEBOX_CONFIG", &config);
            }
            _ => {
                cmd.current_dir(w.dir.path());
            }
        }
        let out = cmd
            .args(["python", "-c", &code])
            .env("CODEBOX_ROOTFS", rootfs_dir())
            .env("CODEBOX_TEST_API_KEY", secret())
            .env_remove("CODEBOX_STATE_DIR")
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{how}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
        assert_eq!(v["exit_code"], 0, "{how}: {v:#}");
        let record = record_for(&v, "localhost", w.api.port());
        assert_eq!(record["allowed"], true, "{how}: {record}");
        assert_eq!(record["credential_added"], true, "{how}: {record}");
        assert!(
            w.dir.path().join("state-config/egress-trust").is_dir(),
            "{how}: the config's state_dir"
        );
    }
}

/// Without `--allow-host` or a proxy-mode profile nothing changes: no proxy, no
/// environment, no IP sockets.
#[test]
fn the_default_profile_has_no_way_out() {
    if !sandbox_available("the_default_profile_has_no_way_out") {
        return;
    }
    let v = run_json(
        "python",
        "import os, socket\nprint(os.environ.get('HTTPS_PROXY'))\ntry:\n    socket.socket()\nexcept PermissionError:\n    print('refused')\n",
        &[],
    );
    assert_eq!(stdout(&v), "None\nrefused\n", "{v:#}");
    assert!(v.get("network").is_none(), "{v:#}");
}

/// `--allow-host` alone: proxy mode with that host; everything else refused, and a
/// credential-free tunnel stays opaque (no interception: the program sees the origin's
/// own certificate, from the test CA it does not trust, so it skips verification here).
#[test]
fn allow_host_on_the_command_line() {
    if !sandbox_available("allow_host_on_the_command_line") {
        return;
    }
    let w = &world();
    let port = w.other.port();
    let state = tempfile::tempdir().unwrap();
    std::fs::set_permissions(state.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let code = format!(
        r#"
import http.client, ssl, urllib.request
c = http.client.HTTPSConnection("127.0.0.1", 3128, context=ssl._create_unverified_context())
c.set_tunnel("localhost", {port})
c.request("GET", "/ok")
body = c.getresponse().read().decode().strip()
# The origin's own certificate came through: the tunnel is opaque.
print(body, b"egress test CA" in c.sock.getpeercert(True))
try:
    urllib.request.urlopen("https://unlisted.example.com/")
except Exception as e:
    print("ERR", e)
"#
    );
    let out = Command::new(codebox_bin())
        .args(["run", "--json", "--allow-host"])
        .arg(format!("localhost:{port}"))
        .arg("--allow-private")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--state-dir")
        .arg(state.path())
        .args(["python", "-c", &code])
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(v["exit_code"], 0, "{v:#}");
    assert!(stdout(&v).starts_with("ok True\n"), "{v:#}");
    assert!(
        stdout(&v).contains("Tunnel connection failed: 403 codebox: egress to unlisted.example.com:443 denied (not in allowlist)"),
        "{v:#}"
    );
    let rec = record_for(&v, "localhost", port);
    assert_eq!(rec["kind"], "connect", "{rec}");
    assert_eq!(rec["allowed"], true, "{rec}");
    assert_eq!(rec["credential_added"], false, "{rec}");
}

/// However the value got into the program (here: written into its code), `codebox run`
/// never prints it: not in streamed output, even cut across writes, nor in `--json`.
#[test]
fn the_cli_redacts_configured_secrets_from_output() {
    if !sandbox_available("the_cli_redacts_configured_secrets_from_output") {
        return;
    }
    let w = &world();
    let half = secret().len() / 2;
    let code = format!(
        "import sys, time\ns = {:?} + {:?}\nsys.stdout.write(s[:5]); sys.stdout.flush(); time.sleep(0.2)\n\
         sys.stdout.write(s[5:] + '\\n'); print('again', s); print(s, file=sys.stderr)\n",
        &secret()[..half],
        &secret()[half..]
    );
    let out = Command::new(codebox_bin())
        .args(["run", "--profile"])
        .arg(w.dir.path().join("proxy.toml"))
        .arg("--state-dir")
        .arg(w.dir.path().join("state"))
        .args(["python", "-c", &code])
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .env("CODEBOX_TEST_API_KEY", secret())
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(printed, "[REDACTED]\nagain [REDACTED]\n", "{stderr}");
    assert!(
        stderr.contains("[REDACTED]") && !stderr.contains(secret()),
        "{stderr}"
    );
    let v = run(w, "python", &code);
    assert_eq!(stdout(&v), "[REDACTED]\nagain [REDACTED]\n", "{v:#}");
}
