//! Seccomp policies in codebox's JSON format
//! (`codebox::sandbox::seccomp::CompiledFilter::from_json`): a deployment can point a
//! profile at its own policy file, and a bad one must be refused with a reason, never
//! compiled into a filter that lets through what no policy may.
//!
//! Input: the policy's JSON.
//!
//! Properties, checked on the compiled program by running it (a classic-BPF interpreter
//! here, written from the kernel's rules):
//! - it is a program the kernel takes: at most 4096 instructions, only the instructions
//!   `seccomp_check_filter` allows, loads inside `struct seccomp_data`, jumps forward and
//!   in range, every path ending in a return;
//! - whatever the policy says, a call from another architecture or through the x32 ABI
//!   is never allowed (the classic bypass of a filter that checks numbers only);
//! - every return is one of seccomp's actions.

use codebox::sandbox::seccomp::{CompiledFilter, MAX_INSTRUCTIONS};

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

/// One `struct sock_filter`.
#[derive(Debug, Clone, Copy)]
struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

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
    let program: Vec<Insn> = bytes
        .chunks_exact(8)
        .map(|c| Insn {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    assert!(!program.is_empty() && program.len() <= MAX_INSTRUCTIONS);
    check_static(&program);
    for nr in SAMPLE_CALLS {
        for arch in [AUDIT_ARCH_I386, 0, u32::MAX] {
            let ret = eval(&program, nr, arch);
            assert_ne!(
                ret & ACTION_MASK,
                SECCOMP_RET_ALLOW,
                "arch {arch:#x} nr {nr} allowed"
            );
        }
        let x32 = eval(&program, nr | X32_SYSCALL_BIT, AUDIT_ARCH_X86_64);
        assert_ne!(
            x32 & ACTION_MASK,
            SECCOMP_RET_ALLOW,
            "x32 call {nr} allowed"
        );
        let native = eval(&program, nr, AUDIT_ARCH_X86_64);
        assert!(
            native & ACTION_MASK == SECCOMP_RET_ALLOW || ACTIONS.contains(&(native & ACTION_MASK)),
            "return {native:#x} is no seccomp action"
        );
    }
}

const LD_W_ABS: u16 = 0x20;
const ALU_AND_K: u16 = 0x54;
const JMP_JA: u16 = 0x05;
const JMP_JEQ_K: u16 = 0x15;
const JMP_JGT_K: u16 = 0x25;
const JMP_JGE_K: u16 = 0x35;
const JMP_JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
/// `sizeof(struct seccomp_data)`.
const DATA_BYTES: u32 = 64;

/// What the kernel's checker would refuse.
fn check_static(program: &[Insn]) {
    let len = program.len();
    for (pc, i) in program.iter().enumerate() {
        match i.code {
            LD_W_ABS => assert!(
                i.k % 4 == 0 && i.k < DATA_BYTES,
                "load at {pc} outside seccomp_data: {i:?}"
            ),
            ALU_AND_K | RET_K => {}
            JMP_JA => assert!(
                (pc + 1).checked_add(i.k as usize).is_some_and(|t| t < len),
                "jump at {pc} out of range: {i:?}"
            ),
            JMP_JEQ_K | JMP_JGT_K | JMP_JGE_K | JMP_JSET_K => {
                assert!(
                    pc + 1 + usize::from(i.jt) < len && pc + 1 + usize::from(i.jf) < len,
                    "branch at {pc} out of range: {i:?}"
                )
            }
            other => panic!("instruction {other:#x} at {pc}, which this checker does not know"),
        }
    }
    assert_eq!(
        program[len - 1].code,
        RET_K,
        "the program does not end in a return"
    );
}

/// Runs the program on a call `nr` from `arch` with every argument 0.
fn eval(program: &[Insn], nr: u32, arch: u32) -> u32 {
    let mut data = [0u8; DATA_BYTES as usize];
    data[0..4].copy_from_slice(&nr.to_ne_bytes());
    data[4..8].copy_from_slice(&arch.to_ne_bytes());
    let (mut a, mut pc) = (0u32, 0usize);
    loop {
        let i = program[pc];
        pc += 1;
        match i.code {
            LD_W_ABS => {
                let at = i.k as usize;
                a = u32::from_ne_bytes(data[at..at + 4].try_into().expect("4 bytes"));
            }
            ALU_AND_K => a &= i.k,
            JMP_JA => pc += i.k as usize,
            RET_K => return i.k,
            code => {
                let taken = match code {
                    JMP_JEQ_K => a == i.k,
                    JMP_JGT_K => a > i.k,
                    JMP_JGE_K => a >= i.k,
                    _ => a & i.k != 0,
                };
                pc += usize::from(if taken { i.jt } else { i.jf });
            }
        }
    }
}
