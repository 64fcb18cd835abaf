//! Seccomp policies in codebox's JSON format
//! (`codebox::sandbox::seccomp::CompiledFilter::from_json`): a deployment can point a
//! profile at its own policy file, and a bad one must be refused with a reason, never
//! compiled into a filter that lets through what no policy may.
//!
//! Input: the policy's JSON.
//!
//! Properties, checked on the compiled program by running it (a classic-BPF interpreter
//! `codebox_fuzz_oracles::bpf`, written from the kernel's rules):
//! - it is a program the kernel takes: at most 4096 instructions, only the instructions
//!   `seccomp_check_filter` allows, loads inside `struct seccomp_data`, jumps forward and
//!   in range, every path ending in a return;
//! - whatever the policy says, a call from another architecture or through the x32 ABI
//!   is never allowed (the classic bypass of a filter that checks numbers only);
//! - every return is one of seccomp's actions.

use codebox::sandbox::seccomp::{CompiledFilter, MAX_INSTRUCTIONS};
use codebox_fuzz_oracles::bpf;

use crate::budget;

const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
const AUDIT_ARCH_I386: u32 = 3 | 0x4000_0000;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
/// `SECCOMP_RET_ACTION_FULL`: the action part of a return value.
const ACTION_MASK: u32 = 0xffff_0000;
const ACTIONS: [u32; 7] = [
    0x8000_0000, // KILL_PROCESS
    0x0000_0000, // KILL_THREAD
    0x0003_0000, // TRAP
    0x0005_0000, // ERRNO
    0x7fc0_0000, // USER_NOTIF
    0x7ff0_0000, // TRACE
    0x7ffc_0000, // LOG
];

/// Calls run through every compiled program: the first few, those the default policies
/// name specially (clone, clone3, unshare, mount, ptrace, bpf, io_uring, ...), the last
/// reviewed one and past it, and numbers no architecture has.
const SAMPLE_CALLS: [u32; 26] = [
    0,
    1,
    2,
    3,
    9,
    10,
    16,
    56,
    57,
    59,
    101,
    165,
    169,
    272,
    310,
    317,
    321,
    322,
    425,
    435,
    439,
    462,
    463,
    999,
    0x7fff_ffff,
    u32::MAX,
];

pub fn run(data: &[u8]) {
    let (compiled, peak) = budget::peak_during(|| CompiledFilter::from_json("fuzzed", data));
    budget::assert_within("seccomp compile", peak, data.len(), 256, 4 << 20);
    let filter = match compiled {
        Ok(f) => f,
        Err(e) => {
            let message = e.to_string();
            assert!(!message.is_empty() && message.len() < 4096, "{message}");
            return;
        }
    };
    let bytes = filter.to_bytes();
    assert_eq!(bytes.len(), filter.instructions() * 8);
    let program = bpf::decode(&bytes).expect("whole instructions");
    assert!(!program.is_empty() && program.len() <= MAX_INSTRUCTIONS);
    bpf::check_static(&program);
    for nr in SAMPLE_CALLS {
        for arch in [AUDIT_ARCH_I386, 0, u32::MAX] {
            let ret = bpf::eval(&program, nr, arch);
            assert_ne!(
                ret & ACTION_MASK,
                SECCOMP_RET_ALLOW,
                "arch {arch:#x} nr {nr} allowed"
            );
        }
        let x32 = bpf::eval(&program, nr | X32_SYSCALL_BIT, AUDIT_ARCH_X86_64);
        assert_ne!(
            x32 & ACTION_MASK,
            SECCOMP_RET_ALLOW,
            "x32 call {nr} allowed"
        );
        let native = bpf::eval(&program, nr, AUDIT_ARCH_X86_64);
        assert!(
            native & ACTION_MASK == SECCOMP_RET_ALLOW || ACTIONS.contains(&(native & ACTION_MASK)),
            "return {native:#x} is no seccomp action"
        );
    }
}
