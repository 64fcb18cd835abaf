//! Unit tests: the policy files, the schema checks, and the assembled program run through a
//! small classic-BPF interpreter (the kernel tests in `tests/seccomp.rs` then show the
//! kernel agrees).

use std::collections::BTreeMap;

use seccompiler::TargetArch;

use super::bpf::{self, *};
use super::policy::{self, Action};
use super::*;

// ---------------------------------------------------------------------------------------
// A classic-BPF interpreter for the instructions seccomp filters use.

#[derive(Debug, Clone, Copy)]
struct Call {
    arch: u32,
    nr: u32,
    args: [u64; 6],
}

impl Call {
    fn native(nr: i64, args: &[u64]) -> Call {
        let mut a = [0u64; 6];
        a[..args.len()].copy_from_slice(args);
        Call {
            arch: bpf::audit_arch(host_arch().unwrap()),
            nr: nr as u32,
            args: a,
        }
    }

    fn load(&self, offset: u32) -> u32 {
        match offset {
            0 => self.nr,
            4 => self.arch,
            8 | 12 => 0, // instruction pointer: never loaded by our filters
            16..=63 if offset % 4 == 0 => {
                let arg = self.args[(offset as usize - 16) / 8];
                if offset % 8 == 0 {
                    arg as u32
                } else {
                    (arg >> 32) as u32
                }
            }
            _ => panic!("load from invalid seccomp_data offset {offset}"),
        }
    }
}

/// Runs `prog` on `call` and returns the filter's verdict (`SECCOMP_RET_*`).
fn run(prog: &[libc::sock_filter], call: &Call) -> u32 {
    let mut acc: u32 = 0;
    let mut pc = 0usize;
    loop {
        let i = prog[pc];
        let k = i.k;
        let cond = |taken: bool| if taken { i.jt as usize } else { i.jf as usize };
        pc += 1;
        match i.code {
            LD_W_ABS => acc = call.load(k),
            ALU_AND_K => acc &= k,
            JMP_JA => pc += k as usize,
            JMP_JEQ_K => pc += cond(acc == k),
            JMP_JGT_K => pc += cond(acc > k),
            JMP_JGE_K => pc += cond(acc >= k),
            RET_K => return k,
            other => panic!("unexpected BPF opcode {other:#x} at {}", pc - 1),
        }
    }
}

const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const KILL: u32 = libc::SECCOMP_RET_KILL_PROCESS;
const EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
const ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

/// An ioctl request as the 64-bit register value (`Ioctl` is `c_ulong` on glibc and
/// `c_int` on musl).
#[allow(clippy::unnecessary_cast)]
fn ioctl_cmd(cmd: libc::Ioctl) -> u64 {
    cmd as u64
}

fn verdict(profile: SeccompProfile, nr: i64, args: &[u64]) -> u32 {
    let f = CompiledFilter::for_profile(profile).unwrap();
    run(f.program(), &Call::native(nr, args))
}

// ---------------------------------------------------------------------------------------
// The policy files.

/// Syscalls the default profile must refuse whatever the arguments, and how.
const REQUIRED: &[(&str, Action)] = &[
    ("add_key", Action::Eperm),
    ("keyctl", Action::Eperm),
    ("request_key", Action::Eperm),
    ("bpf", Action::Eperm),
    ("perf_event_open", Action::Eperm),
    ("userfaultfd", Action::Eperm),
    ("ptrace", Action::Eperm),
    ("process_vm_readv", Action::Eperm),
    ("process_vm_writev", Action::Eperm),
    ("kcmp", Action::Eperm),
    ("mount", Action::Eperm),
    ("umount2", Action::Eperm),
    ("pivot_root", Action::Eperm),
    ("setns", Action::Eperm),
    ("unshare", Action::Eperm),
    ("clone3", Action::Enosys),
    ("io_uring_setup", Action::Enosys),
    ("io_uring_enter", Action::Enosys),
    ("io_uring_register", Action::Enosys),
    ("open_by_handle_at", Action::Eperm),
    ("name_to_handle_at", Action::Eperm),
    ("kexec_load", Action::Eperm),
    ("kexec_file_load", Action::Eperm),
    ("init_module", Action::Eperm),
    ("finit_module", Action::Eperm),
    ("delete_module", Action::Eperm),
    ("reboot", Action::Eperm),
    ("swapon", Action::Eperm),
    ("swapoff", Action::Eperm),
    ("acct", Action::Eperm),
    ("quotactl", Action::Eperm),
    ("quotactl_fd", Action::Eperm),
    ("settimeofday", Action::Eperm),
    ("clock_settime", Action::Eperm),
    ("clock_adjtime", Action::Eperm),
    ("adjtimex", Action::Eperm),
];

/// Syscalls the default profile must refuse for some arguments (rules with `args`).
const REQUIRED_CONDITIONAL: &[(&str, Action)] = &[
    ("clone", Action::Eperm),
    ("ioctl", Action::Eperm),
    ("socket", Action::Eperm),
    ("personality", Action::Eperm),
];

/// (syscall, has args) → action, from the JSON itself.
fn rules_of(profile: SeccompProfile) -> BTreeMap<(String, bool), Action> {
    let doc = policy::check(profile.policy_json().as_bytes()).unwrap();
    let mut rules = BTreeMap::new();
    for (action, filter) in doc.filters() {
        for rule in &filter.filter {
            rules.insert((rule.syscall.clone(), rule.args.is_some()), action);
        }
    }
    rules
}

#[test]
fn every_policy_compiles_within_limits() {
    for p in SeccompProfile::ALL {
        let f = CompiledFilter::for_profile(p).unwrap();
        assert!(f.instructions() <= MAX_INSTRUCTIONS, "{p}: {f:?}");
        assert!(p.policy_json().len() <= MAX_POLICY_BYTES);
        eprintln!("{p}: {} BPF instructions", f.instructions());
        // Cached: a second call shares the same program.
        let again = CompiledFilter::for_profile(p).unwrap();
        assert!(Arc::ptr_eq(&f.program, &again.program));
    }
}

#[test]
fn every_policy_compiles_for_every_architecture() {
    // Syscall names differ between architectures (x86-only calls such as modify_ldt do not
    // exist on aarch64); a policy must name only calls every supported one has.
    for p in SeccompProfile::ALL {
        for arch in [TargetArch::x86_64, TargetArch::aarch64, TargetArch::riscv64] {
            let prog = compile(p.name(), p.policy_json().as_bytes(), arch)
                .unwrap_or_else(|e| panic!("{p} on {arch:?}: {e:#?}"));
            assert!(prog.len() <= MAX_INSTRUCTIONS);
        }
    }
}

#[test]
fn default_policy_names_every_required_syscall() {
    let rules = rules_of(SeccompProfile::Default);
    for (sc, action) in REQUIRED {
        assert_eq!(
            rules.get(&(sc.to_string(), false)),
            Some(action),
            "{sc} must be refused unconditionally with {action:?}"
        );
    }
    for (sc, action) in REQUIRED_CONDITIONAL {
        assert_eq!(
            rules.get(&(sc.to_string(), true)),
            Some(action),
            "{sc} must have a rule with args under {action:?}"
        );
    }
}

#[test]
fn network_differs_from_default_only_in_socket_families() {
    let strip = |p| {
        let mut r = rules_of(p);
        r.remove(&("socket".to_string(), true));
        r
    };
    assert_eq!(
        strip(SeccompProfile::Default),
        strip(SeccompProfile::Network)
    );
    let (d, n): (serde_json::Value, serde_json::Value) = (
        serde_json::from_str(SeccompProfile::Default.policy_json()).unwrap(),
        serde_json::from_str(SeccompProfile::Network.policy_json()).unwrap(),
    );
    let socket_rules = |v: &serde_json::Value| -> Vec<serde_json::Value> {
        v["eperm"]["filter"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["syscall"] != "socket")
            .cloned()
            .collect()
    };
    assert_eq!(socket_rules(&d), socket_rules(&n));
    assert_eq!(d["enosys"], n["enosys"]);
}

#[test]
fn egress_is_network_plus_tcp_only_and_no_fast_open() {
    // Everything the network profile refuses, egress refuses too; what it adds is rules
    // on socket (type, protocol) and on the three send calls that can carry MSG_FASTOPEN.
    let (n, e): (serde_json::Value, serde_json::Value) = (
        serde_json::from_str(SeccompProfile::Network.policy_json()).unwrap(),
        serde_json::from_str(SeccompProfile::Egress.policy_json()).unwrap(),
    );
    let others = |v: &serde_json::Value| -> Vec<serde_json::Value> {
        v["eperm"]["filter"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                !["socket", "sendto", "sendmsg", "sendmmsg"]
                    .contains(&r["syscall"].as_str().unwrap())
            })
            .cloned()
            .collect()
    };
    assert_eq!(others(&n), others(&e));
    assert_eq!(n["enosys"], e["enosys"]);
}

#[test]
fn egress_sockets_are_tcp_only() {
    use SeccompProfile::Egress;
    let s = |domain: i32, ty: i32, protocol: i32| {
        verdict(
            Egress,
            libc::SYS_socket,
            &[domain as u64, ty as u64, protocol as u64],
        )
    };
    let stream_flags = [
        0,
        libc::SOCK_NONBLOCK,
        libc::SOCK_CLOEXEC,
        libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
    ];
    for domain in [libc::AF_INET, libc::AF_INET6] {
        for flags in stream_flags {
            let ty = libc::SOCK_STREAM | flags;
            assert_eq!(s(domain, ty, 0), ALLOW, "{domain} {ty:#x}");
            assert_eq!(s(domain, ty, libc::IPPROTO_TCP), ALLOW, "{domain} {ty:#x}");
            for protocol in [
                libc::IPPROTO_SCTP,
                libc::IPPROTO_MPTCP,
                libc::IPPROTO_UDP,
                255,
            ] {
                assert_eq!(
                    s(domain, ty, protocol),
                    EPERM,
                    "{domain} {ty:#x} {protocol}"
                );
            }
        }
        for ty in [
            libc::SOCK_DGRAM,
            libc::SOCK_RAW,
            libc::SOCK_SEQPACKET,
            libc::SOCK_RDM,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::SOCK_RAW | libc::SOCK_NONBLOCK,
            6,  // SOCK_DCCP
            10, // SOCK_PACKET
        ] {
            assert_eq!(s(domain, ty, 0), EPERM, "{domain} type {ty:#x}");
        }
        // ICMP "ping" sockets are datagram sockets.
        assert_eq!(s(domain, libc::SOCK_DGRAM, libc::IPPROTO_ICMP), EPERM);
    }
    // AF_UNIX keeps every type (the runtimes use datagram and seqpacket pairs).
    assert_eq!(s(libc::AF_UNIX, libc::SOCK_DGRAM, 0), ALLOW);
    assert_eq!(s(libc::AF_NETLINK, libc::SOCK_RAW, 0), EPERM);
    // High bits of the int arguments are not looked at by the kernel and not by us.
    assert_eq!(
        verdict(
            Egress,
            libc::SYS_socket,
            &[libc::AF_INET as u64, (1 << 32) | libc::SOCK_DGRAM as u64, 0]
        ),
        EPERM
    );
    // The network profile keeps UDP: it has no egress port to protect.
    assert_eq!(
        verdict(
            SeccompProfile::Network,
            libc::SYS_socket,
            &[libc::AF_INET as u64, libc::SOCK_DGRAM as u64, 0]
        ),
        ALLOW
    );
}

#[test]
fn egress_refuses_fast_open_sends() {
    use SeccompProfile::Egress;
    let fastopen = libc::MSG_FASTOPEN as u64;
    let other = (libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) as u64;
    for (nr, index) in [
        (libc::SYS_sendto, 3),
        (libc::SYS_sendmsg, 2),
        (libc::SYS_sendmmsg, 3),
    ] {
        let mut args = [3u64, 0, 1, 0, 0, 0];
        args[index] = fastopen | other;
        assert_eq!(verdict(Egress, nr, &args), EPERM, "{nr}");
        args[index] = other;
        assert_eq!(verdict(Egress, nr, &args), ALLOW, "{nr}");
        args[index] = fastopen;
        for p in [SeccompProfile::Default, SeccompProfile::Network] {
            assert_eq!(verdict(p, nr, &args), ALLOW, "{p} {nr}");
        }
    }
}

#[test]
fn every_required_syscall_is_refused_with_its_action() {
    let table = policy_syscall_numbers();
    for p in SeccompProfile::ALL {
        for (sc, action) in REQUIRED {
            let nr = table[sc];
            let want = match action {
                Action::KillProcess => KILL,
                Action::Enosys => ENOSYS,
                Action::Eperm => EPERM,
            };
            assert_eq!(verdict(p, nr, &[]), want, "{p}: {sc} ({nr})");
        }
    }
}

/// Numbers of the required syscalls on the host (libc's constants, not seccompiler's table,
/// so the two are checked against each other).
fn policy_syscall_numbers() -> BTreeMap<&'static str, i64> {
    use libc::*;
    [
        ("add_key", SYS_add_key),
        ("keyctl", SYS_keyctl),
        ("request_key", SYS_request_key),
        ("bpf", SYS_bpf),
        ("perf_event_open", SYS_perf_event_open),
        ("userfaultfd", SYS_userfaultfd),
        ("ptrace", SYS_ptrace),
        ("process_vm_readv", SYS_process_vm_readv),
        ("process_vm_writev", SYS_process_vm_writev),
        ("kcmp", SYS_kcmp),
        ("mount", SYS_mount),
        ("umount2", SYS_umount2),
        ("pivot_root", SYS_pivot_root),
        ("setns", SYS_setns),
        ("unshare", SYS_unshare),
        ("clone3", SYS_clone3),
        ("io_uring_setup", SYS_io_uring_setup),
        ("io_uring_enter", SYS_io_uring_enter),
        ("io_uring_register", SYS_io_uring_register),
        ("open_by_handle_at", SYS_open_by_handle_at),
        ("name_to_handle_at", SYS_name_to_handle_at),
        ("kexec_load", SYS_kexec_load),
        ("kexec_file_load", SYS_kexec_file_load),
        ("init_module", SYS_init_module),
        ("finit_module", SYS_finit_module),
        ("delete_module", SYS_delete_module),
        ("reboot", SYS_reboot),
        ("swapon", SYS_swapon),
        ("swapoff", SYS_swapoff),
        ("acct", SYS_acct),
        ("quotactl", SYS_quotactl),
        ("quotactl_fd", SYS_quotactl_fd),
        ("settimeofday", SYS_settimeofday),
        ("clock_settime", SYS_clock_settime),
        ("clock_adjtime", SYS_clock_adjtime),
        ("adjtimex", SYS_adjtimex),
    ]
    .into_iter()
    .collect()
}

// ---------------------------------------------------------------------------------------
// Argument rules, through the interpreter.

#[test]
fn everyday_syscalls_are_allowed() {
    for p in SeccompProfile::ALL {
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_mmap,
            libc::SYS_futex,
            libc::SYS_getpid,
            libc::SYS_execve,
            libc::SYS_seccomp,
            libc::SYS_landlock_create_ruleset,
        ] {
            assert_eq!(verdict(p, nr, &[0, 0, 0]), ALLOW, "{p}: {nr}");
        }
        assert_eq!(
            verdict(p, libc::SYS_ioctl, &[1, ioctl_cmd(libc::FIONREAD)]),
            ALLOW
        );
        // fork and pthread_create's clone flags.
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u64;
        assert_eq!(verdict(p, libc::SYS_clone, &[thread]), ALLOW);
        assert_eq!(verdict(p, libc::SYS_clone, &[libc::SIGCHLD as u64]), ALLOW);
        assert_eq!(verdict(p, libc::SYS_personality, &[0xffff_ffff]), ALLOW);
        assert_eq!(verdict(p, libc::SYS_personality, &[0]), ALLOW);
    }
}

#[test]
fn clone_with_any_namespace_flag_is_refused() {
    for flag in [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWCGROUP,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
    ] {
        let flags = flag as u32 as u64 | libc::SIGCHLD as u64;
        for p in SeccompProfile::ALL {
            assert_eq!(verdict(p, libc::SYS_clone, &[flags]), EPERM, "{flag:#x}");
            // Garbage in the upper half of the register changes nothing.
            assert_eq!(
                verdict(p, libc::SYS_clone, &[flags | 0xdead_beef_0000_0000]),
                EPERM
            );
        }
    }
}

#[test]
fn tty_injection_ioctls_are_refused_whatever_the_high_bits() {
    for cmd in [libc::TIOCSTI, libc::TIOCLINUX] {
        let cmd = ioctl_cmd(cmd);
        for high in [0, 1 << 32, 0xffff_ffff_0000_0000] {
            for p in SeccompProfile::ALL {
                assert_eq!(
                    verdict(p, libc::SYS_ioctl, &[0, cmd | high]),
                    EPERM,
                    "{cmd:#x} | {high:#x}"
                );
            }
        }
    }
}

#[test]
fn socket_families_per_profile() {
    use SeccompProfile::*;
    let s = |p, domain: i32, protocol: i32| {
        verdict(
            p,
            libc::SYS_socket,
            &[domain as u64, libc::SOCK_STREAM as u64, protocol as u64],
        )
    };
    for p in [Default, Network] {
        assert_eq!(s(p, libc::AF_UNIX, 0), ALLOW);
        for refused in [
            libc::AF_VSOCK,
            libc::AF_NETLINK,
            libc::AF_PACKET,
            libc::AF_BLUETOOTH,
            libc::AF_ALG,
        ] {
            assert_eq!(s(p, refused, 0), EPERM, "{p}: family {refused}");
        }
        assert_eq!(s(p, libc::AF_INET, libc::IPPROTO_MPTCP), EPERM);
        assert_eq!(
            verdict(p, libc::SYS_socketpair, &[libc::AF_UNIX as u64, 1, 0]),
            ALLOW
        );
        assert_eq!(
            verdict(p, libc::SYS_socketpair, &[libc::AF_INET as u64, 1, 0]),
            EPERM
        );
    }
    assert_eq!(s(Default, libc::AF_INET, 0), EPERM);
    assert_eq!(s(Default, libc::AF_INET6, 0), EPERM);
    assert_eq!(s(Network, libc::AF_INET, 0), ALLOW);
    assert_eq!(s(Network, libc::AF_INET6, libc::IPPROTO_TCP), ALLOW);
    // The kernel reads domain as an int: high bits cannot turn AF_INET into a pass.
    assert_eq!(
        verdict(Default, libc::SYS_socket, &[(1 << 32) | 2, 1, 0]),
        EPERM
    );
}

#[test]
fn personality_changes_are_refused() {
    for p in SeccompProfile::ALL {
        for persona in [
            libc::ADDR_NO_RANDOMIZE as u64,
            libc::READ_IMPLIES_EXEC as u64,
            0x0008, // PER_LINUX32
        ] {
            assert_eq!(verdict(p, libc::SYS_personality, &[persona]), EPERM);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The ABI guard.

#[test]
fn foreign_architectures_are_killed() {
    let f = CompiledFilter::for_profile(SeccompProfile::Default).unwrap();
    for arch in [
        AUDIT_ARCH_I386,
        AUDIT_ARCH_X86_64,
        AUDIT_ARCH_AARCH64,
        AUDIT_ARCH_RISCV64,
    ] {
        if arch == bpf::audit_arch(host_arch().unwrap()) {
            continue;
        }
        let call = Call {
            arch,
            nr: 20, // getpid on i386
            args: [0; 6],
        };
        assert_eq!(run(f.program(), &call), KILL, "arch {arch:#x}");
    }
}

#[test]
#[cfg(target_arch = "x86_64")]
fn x32_and_out_of_range_numbers_are_killed() {
    for p in SeccompProfile::ALL {
        for nr in [
            X32_SYSCALL_BIT | libc::SYS_getpid as u32,
            X32_SYSCALL_BIT | libc::SYS_keyctl as u32,
            X32_SYSCALL_BIT,
            0x8000_0000,
            u32::MAX, // syscall(-1)
        ] {
            assert_eq!(verdict(p, nr as i64, &[]), KILL, "{nr:#x}");
        }
    }
}

#[test]
fn syscalls_newer_than_the_review_get_enosys() {
    for p in SeccompProfile::ALL {
        assert_eq!(
            verdict(p, LAST_REVIEWED_SYSCALL as i64, &[]),
            ALLOW,
            "mseal"
        );
        for nr in [LAST_REVIEWED_SYSCALL + 1, 469, 1000, X32_SYSCALL_BIT - 1] {
            assert_eq!(verdict(p, nr as i64, &[]), ENOSYS, "{nr}");
        }
    }
}

#[test]
fn last_reviewed_syscall_is_mseal() {
    #[cfg(target_arch = "x86_64")]
    assert_eq!(libc::SYS_mseal, LAST_REVIEWED_SYSCALL as i64);
    // Seccompiler's table agrees (a rule on mseal compiles to a JEQ 462).
    let json = br#"{"eperm": {"mismatch_action": "allow", "match_action": {"errno": 1},
        "filter": [{"syscall": "mseal", "comment": "EPERM: test"}]}}"#;
    let f = CompiledFilter::from_json("test", json).unwrap();
    assert_eq!(run(f.program(), &Call::native(462, &[])), EPERM);
}

#[test]
fn chaining_keeps_the_harshest_action_first() {
    // getpid(7) matches kill_process and eperm: kill wins; getppid(0) matches enosys and
    // eperm: enosys, evaluated first, wins.
    let json = br#"{
        "eperm": {"mismatch_action": "allow", "match_action": {"errno": 1},
            "filter": [{"syscall": "getpid", "comment": "EPERM: test"},
                       {"syscall": "getppid", "comment": "EPERM: test", "args": [
                        {"index": 0, "type": "dword", "op": "eq", "val": 0, "comment": "0"}]}]},
        "kill_process": {"mismatch_action": "allow", "match_action": "kill_process",
            "filter": [{"syscall": "getpid", "args": [
                {"index": 0, "type": "dword", "op": "eq", "val": 7, "comment": "seven"}],
                "comment": "KILL: test"}]},
        "enosys": {"mismatch_action": "allow", "match_action": {"errno": 38},
            "filter": [{"syscall": "getppid", "comment": "ENOSYS: test"}]}
    }"#;
    let f = CompiledFilter::from_json("test", json).unwrap();
    let v = |nr, a0| run(f.program(), &Call::native(nr, &[a0]));
    assert_eq!(v(libc::SYS_getpid, 7), KILL);
    assert_eq!(v(libc::SYS_getpid, 8), EPERM);
    assert_eq!(v(libc::SYS_getppid, 0), ENOSYS);
    assert_eq!(v(libc::SYS_gettid, 0), ALLOW);
}

// ---------------------------------------------------------------------------------------
// Rejected policies.

fn reject(json: &str) -> Error {
    CompiledFilter::from_json("test", json.as_bytes()).expect_err("policy must be rejected")
}

const GOOD_RULE: &str = r#"{"syscall": "keyctl", "comment": "EPERM: keyring"}"#;

fn eperm_filter(rules: &str) -> String {
    format!(
        r#"{{"eperm": {{"mismatch_action": "allow", "match_action": {{"errno": 1}},
            "filter": [{rules}]}}}}"#
    )
}

#[test]
fn a_minimal_policy_compiles() {
    CompiledFilter::from_json("test", eperm_filter(GOOD_RULE).as_bytes()).unwrap();
}

#[test]
fn unknown_keys_are_rejected_by_seccompiler_itself() {
    // seccompiler's own serde types deny unknown fields in a filter, a rule and a condition.
    for bad in [
        r#"{"f": {"mismatch_action": "allow", "match_action": "trap", "filter": [], "x": 1}}"#,
        r#"{"f": {"mismatch_action": "allow", "match_action": "trap",
             "filter": [{"syscall": "keyctl", "action": "allow"}]}}"#,
        r#"{"f": {"mismatch_action": "allow", "match_action": "trap",
             "filter": [{"syscall": "ioctl", "args": [
                {"index": 1, "type": "dword", "op": "eq", "val": 1, "mask": 2}]}]}}"#,
    ] {
        let err =
            seccompiler::compile_from_json(bad.as_bytes(), host_arch().unwrap()).expect_err(bad);
        assert!(err.to_string().contains("unknown field"), "{err}");
    }
}

#[test]
fn unknown_keys_are_rejected() {
    for bad in [
        // Top level: seccompiler takes any filter name; codebox only its three.
        format!(
            r#"{{"eprem": {{"mismatch_action": "allow", "match_action": {{"errno": 1}},
                "filter": [{GOOD_RULE}]}}}}"#
        ),
        format!(
            r#"{{"eperm": {{"mismatch_action": "allow", "match_action": {{"errno": 1}},
                "filter": [{GOOD_RULE}], "comment": "x"}}}}"#
        ),
        eperm_filter(r#"{"syscall": "keyctl", "comment": "EPERM: k", "arg": []}"#),
        eperm_filter(
            r#"{"syscall": "ioctl", "comment": "EPERM: k", "args": [
                {"index": 1, "type": "dword", "op": "eq", "val": 1, "comment": "c", "x": 0}]}"#,
        ),
        // seccompiler's aliases are not part of codebox's format.
        format!(
            r#"{{"eperm": {{"default_action": "allow", "match_action": {{"errno": 1}},
                "filter": [{GOOD_RULE}]}}}}"#
        ),
    ] {
        match reject(&bad) {
            Error::PolicyJson { source, .. } => {
                assert!(source.to_string().contains("unknown field"), "{source}")
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn duplicate_keys_are_rejected() {
    let twice = format!(
        r#"{{"eperm": {{"mismatch_action": "allow", "match_action": {{"errno": 1}},
            "filter": [{GOOD_RULE}]}},
            "eperm": {{"mismatch_action": "allow", "match_action": {{"errno": 1}},
            "filter": [{GOOD_RULE}]}}}}"#
    );
    assert!(matches!(reject(&twice), Error::PolicyJson { .. }));
    let rule = eperm_filter(r#"{"syscall": "keyctl", "syscall": "getpid", "comment": "EPERM: x"}"#);
    assert!(matches!(reject(&rule), Error::PolicyJson { .. }));
}

#[test]
fn oversized_policies_are_rejected_before_parsing() {
    let mut json = eperm_filter(GOOD_RULE);
    json.push_str(&" ".repeat(MAX_POLICY_BYTES));
    match reject(&json) {
        Error::PolicyTooLarge { size, max, .. } => {
            assert_eq!(max, MAX_POLICY_BYTES);
            assert!(size > max);
        }
        other => panic!("{other:?}"),
    }
}

/// A filter of `rules` rules on ioctl, each of five 64-bit masked compares (~32 BPF
/// instructions a rule, the densest seccompiler output per byte of JSON).
fn dense_filter(name: &str, errno: i32, tag: &str, rules: usize) -> String {
    let cond = r#"{"index":1,"type":"qword","op":{"masked_eq":1},"val":1,"comment":"c"}"#;
    let rule = format!(
        r#"{{"syscall":"ioctl","comment":"{tag} x","args":[{}]}}"#,
        [cond; 5].join(",")
    );
    format!(
        r#""{name}":{{"mismatch_action":"allow","match_action":{{"errno":{errno}}},"filter":[{}]}}"#,
        vec![rule; rules].join(",")
    )
}

#[test]
fn programs_over_the_kernel_limit_are_rejected() {
    // Each filter alone is under 4096 instructions (seccompiler's own check passes); the
    // chained program is over, and the file is under the size cap.
    let json = format!(
        "{{{},{}}}",
        dense_filter("eperm", 1, "EPERM:", 66),
        dense_filter("enosys", 38, "ENOSYS:", 66)
    );
    assert!(json.len() <= MAX_POLICY_BYTES, "{}", json.len());
    match reject(&json) {
        Error::TooManyInstructions {
            instructions, max, ..
        } => {
            assert_eq!(max, 4096);
            assert!(instructions > max);
        }
        other => panic!("{other:?}"),
    }
    // One filter over the limit: seccompiler's check.
    let json = format!("{{{}}}", dense_filter("eperm", 1, "EPERM:", 130));
    assert!(json.len() <= MAX_POLICY_BYTES, "{}", json.len());
    match reject(&json) {
        Error::Compile { source, .. } => {
            assert!(
                source.to_string().contains("too many BPF instructions"),
                "{source}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn schema_rules_are_enforced() {
    let cases: Vec<(String, &str)> = vec![
        (r#"{}"#.into(), "no filter"),
        (
            r#"{"eperm": {"mismatch_action": "trap", "match_action": {"errno": 1},
                "filter": [{"syscall": "keyctl", "comment": "EPERM: k"}]}}"#
                .into(),
            "mismatch_action must be",
        ),
        (
            r#"{"eperm": {"mismatch_action": "allow", "match_action": {"errno": 13},
                "filter": [{"syscall": "keyctl", "comment": "EPERM: k"}]}}"#
                .into(),
            "match_action must be",
        ),
        (eperm_filter(""), "has no rules"),
        (eperm_filter(r#"{"syscall": "keyctl"}"#), "missing comment"),
        (
            eperm_filter(r#"{"syscall": "keyctl", "comment": "  "}"#),
            "missing comment",
        ),
        (
            eperm_filter(r#"{"syscall": "keyctl", "comment": "ENOSYS: wrong"}"#),
            "must start with",
        ),
        (
            eperm_filter(
                r#"{"syscall": "ioctl", "comment": "EPERM: k", "args": [
                {"index": 1, "type": "dword", "op": "eq", "val": 1}]}"#,
            ),
            "condition 0 has no comment",
        ),
        (
            eperm_filter(
                r#"{"syscall": "ioctl", "comment": "EPERM: k", "args": [
                {"index": 1, "type": "dword", "op": "eq", "val": 4294988818, "comment": "c"}]}"#,
            ),
            "over 32 bits",
        ),
        (
            eperm_filter(
                r#"{"syscall": "ioctl", "comment": "EPERM: k", "args": [
                {"index": 1, "type": "dword", "op": {"masked_eq": 8589934591}, "val": 1,
                 "comment": "c"}]}"#,
            ),
            "over 32 bits",
        ),
        (
            eperm_filter(
                r#"{"syscall": "ioctl", "comment": "EPERM: k", "args": [
                {"index": 6, "type": "dword", "op": "eq", "val": 1, "comment": "c"}]}"#,
            ),
            "index 6",
        ),
        (
            eperm_filter(r#"{"syscall": "ioctl", "comment": "EPERM: k", "args": []}"#),
            "empty args",
        ),
        (
            eperm_filter(&format!("{GOOD_RULE}, {GOOD_RULE}")),
            "listed twice",
        ),
        (
            eperm_filter(
                r#"{"syscall": "ioctl", "comment": "EPERM: all"},
                {"syscall": "ioctl", "comment": "EPERM: some", "args": [
                {"index": 1, "type": "dword", "op": "eq", "val": 1, "comment": "c"}]}"#,
            ),
            "with and without args",
        ),
        (
            format!(
                r#"{{"eperm": {{"mismatch_action": "allow", "match_action": {{"errno": 1}},
                    "filter": [{GOOD_RULE}]}},
                  "enosys": {{"mismatch_action": "allow", "match_action": {{"errno": 38}},
                    "filter": [{{"syscall": "keyctl", "comment": "ENOSYS: k"}}]}}}}"#
            ),
            "by both",
        ),
    ];
    for (json, want) in cases {
        match reject(&json) {
            Error::PolicyInvalid { problem, .. } => {
                assert!(problem.contains(want), "{json}: {problem}")
            }
            other => panic!("{json}: {other:?}"),
        }
    }
}

#[test]
fn unknown_syscall_names_are_rejected() {
    let json = eperm_filter(r#"{"syscall": "kexec_loads", "comment": "EPERM: typo"}"#);
    assert!(matches!(reject(&json), Error::Compile { .. }));
}

#[test]
fn profile_names_round_trip() {
    for p in SeccompProfile::ALL {
        assert_eq!(p.to_string().parse::<SeccompProfile>().unwrap(), p);
    }
    assert_eq!(SeccompProfile::default(), SeccompProfile::Default);
    assert!(matches!(
        "Network".parse::<SeccompProfile>(),
        Err(Error::UnknownProfile(_))
    ));
}

#[test]
fn kill_signal_is_sigsys() {
    assert_eq!(SECCOMP_KILL_SIGNAL, 31);
}

#[test]
fn x86_64_only_calls_are_kept_on_x86_64_and_dropped_elsewhere() {
    let json = br#"{"eperm": {"mismatch_action": "allow", "match_action": {"errno": 1},
        "filter": [{"syscall": "chmod"}, {"syscall": "fchmodat"}, {"syscall": "open"}]}}"#;
    let names = |bytes: &[u8]| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_slice(bytes).unwrap();
        v["eperm"]["filter"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["syscall"].as_str().unwrap().to_string())
            .collect()
    };
    let same = super::without_legacy_syscalls(json, TargetArch::x86_64).unwrap();
    assert_eq!(names(&same), ["chmod", "fchmodat", "open"]);
    for arch in [TargetArch::aarch64, TargetArch::riscv64] {
        let kept = super::without_legacy_syscalls(json, arch).unwrap();
        assert_eq!(names(&kept), ["fchmodat"], "{arch:?}");
    }
}

#[test]
fn the_zygote_variant_allows_only_unshare_and_mount_beyond_its_profile() {
    let eperm = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
    for profile in SeccompProfile::ALL {
        let zygote = CompiledFilter::zygote_variant(profile).unwrap();
        assert_eq!(zygote.policy(), format!("{}+zygote", profile.name()));
        let full = CompiledFilter::for_profile(profile).unwrap();
        let on =
            |f: &CompiledFilter, nr: i64, args: &[u64]| run(f.program(), &Call::native(nr, args));
        for (nr, args) in [
            (libc::SYS_unshare, vec![libc::CLONE_NEWUSER as u64]),
            (libc::SYS_mount, vec![0, 0, 0, 0, 0]),
        ] {
            assert_eq!(
                on(&full, nr, &args),
                eperm,
                "{profile}: {nr} refused in the profile"
            );
            assert_eq!(
                on(&zygote, nr, &args),
                libc::SECCOMP_RET_ALLOW,
                "{profile}: {nr}"
            );
        }
        // Everything else stays as the profile has it.
        for (nr, args) in [
            (libc::SYS_ptrace, vec![0u64]),
            (libc::SYS_setns, vec![0, 0]),
            (libc::SYS_bpf, vec![0, 0, 0]),
            (libc::SYS_umount2, vec![0, 0]),
            (libc::SYS_pivot_root, vec![0, 0]),
            (libc::SYS_clone, vec![libc::CLONE_NEWUSER as u64]),
            (libc::SYS_keyctl, vec![0]),
        ] {
            assert_eq!(
                on(&full, nr, &args),
                on(&zygote, nr, &args),
                "{profile}: {nr}"
            );
            assert_ne!(
                on(&zygote, nr, &args),
                libc::SECCOMP_RET_ALLOW,
                "{profile}: {nr}"
            );
        }
        assert_eq!(zygote.to_bytes().len(), zygote.instructions() * 8);
    }
}
