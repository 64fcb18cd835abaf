//! A representative part of the escape suite (`tests/escapes.rs`) inside the guest: one
//! program makes each attempt in turn, raw through ctypes, on both backends; the
//! microVM's sandbox must refuse each as the namespace backend's does, and the guest's
//! own devices (the ports to the host, the rootfs disk) must not be in the program's
//! `/dev`.

use std::time::Instant;

use libtest_mimic::Failed;
use serde_json::Value;

use super::{cost, run_json};
use crate::common::guest::microvm_available;

/// Each attempt as `(name, code printing its answer)`; `probe(nr, *args)` answers
/// `-1 ERRNO` or `OK`.
const PROGRAM: &str = r#"
import ctypes, errno, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def probe(nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    return f"-1 {errno.errorcode.get(ctypes.get_errno(), '?')}" if r == -1 else "OK"
def attempt(f):
    try:
        return f()
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
out = {
    "keyctl": probe(250, 0, 0),
    "bpf": probe(321, 0, 0, 0),
    "perf_event_open": probe(298, 0, 0, -1, -1, 0),
    "userfaultfd": probe(323, 0),
    "io_uring_setup": probe(425, 8, 0),
    "ptrace of pid 1": probe(101, 16, 1, 0, 0),
    "mount": probe(165, 0, 0, 0, 0, 0),
    "setns": probe(308, 0, 0),
    "unshare a user namespace": probe(272, 0x10000000),
    "open_by_handle_at": probe(304, -100, 0, 0),
    "init_module": probe(175, 0, 0, 0),
    "finit_module": probe(313, 0, 0, 0),
    "kexec_load": probe(246, 0, 0, 0, 0),
    "reboot": probe(169, 0xfee1dead, 672274793, 0x4321fedc, 0),
    "settimeofday": probe(164, 0, 0),
    "AF_INET socket": probe(41, 2, 1, 0),
    "AF_VSOCK socket": probe(41, 40, 1, 0),
    "AF_NETLINK socket": probe(41, 16, 3, 0),
    "write the rootfs": attempt(lambda: open("/usr/lib/codebox-escape", "w") and "written"),
    "the host's ports and disks in /dev": sorted(
        n for n in os.listdir("/dev")
        if n.startswith(("vport", "vd", "hvc", "kvm", "mem", "port", "sd", "console"))
    ),
}
print(json.dumps(out, sort_keys=True))
"#;

/// The answers every backend must give.
fn expected() -> Value {
    let mut v = serde_json::json!({
        "io_uring_setup": "-1 ENOSYS",
        "write the rootfs": "EROFS",
        "the host's ports and disks in /dev": [],
    });
    for name in [
        "keyctl",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "ptrace of pid 1",
        "mount",
        "setns",
        "unshare a user namespace",
        "open_by_handle_at",
        "init_module",
        "finit_module",
        "kexec_load",
        "reboot",
        "settimeofday",
        "AF_INET socket",
        "AF_VSOCK socket",
        "AF_NETLINK socket",
    ] {
        v[name] = "-1 EPERM".into();
    }
    v
}

pub fn escapes_are_refused_in_the_guest_as_on_the_host() -> Result<(), Failed> {
    if !microvm_available("escapes_are_refused_in_the_guest_as_on_the_host") {
        return Ok(());
    }
    let started = Instant::now();
    let want = expected();
    for backend in ["namespace", "microvm"] {
        let v = run_json(backend, "python", PROGRAM, &[]);
        assert_eq!(v["exit_code"], 0, "{backend}: {v:#}");
        let got: Value = serde_json::from_str(v["stdout"].as_str().unwrap_or("").trim())
            .unwrap_or_else(|e| panic!("{backend}: not JSON ({e}): {v:#}"));
        let wrong: Vec<String> = want
            .as_object()
            .expect("an object")
            .iter()
            .filter(|(name, answer)| got[name.as_str()] != **answer)
            .map(|(name, answer)| format!("{name}: {} (expected {answer})", got[name.as_str()]))
            .collect();
        assert!(wrong.is_empty(), "{backend}: {}", wrong.join("; "));
    }
    cost(
        "escapes_are_refused_in_the_guest_as_on_the_host",
        started,
        1,
    );
    Ok(())
}
