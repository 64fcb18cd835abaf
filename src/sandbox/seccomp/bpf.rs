//! Turning seccompiler's per-filter programs into the one classic-BPF program codebox
//! installs: a fixed ABI guard, then the policy's filters chained in evaluation order.
//!
//! ```text
//! guard:  arch != native                 -> KILL_PROCESS   (i386 int 0x80, foreign arch)
//!         nr >= 0x40000000 (x86_64 only) -> KILL_PROCESS   (x32 ABI, out-of-range numbers)
//!         nr >  LAST_REVIEWED_SYSCALL    -> ERRNO(ENOSYS)  (syscalls newer than the policy)
//! kill_process filter  (seccompiler)     -> KILL_PROCESS | go on
//! enosys filter        (seccompiler)     -> ERRNO(ENOSYS) | go on
//! eperm filter         (seccompiler)     -> ERRNO(EPERM)  | ALLOW
//! ```
//!
//! seccompiler ends every path of a deny-list filter in `RET ALLOW` or `RET <match
//! action>`. Chaining rewrites each `RET ALLOW` of every filter but the last into `JA` to
//! the first instruction after that filter: the same length at the same position, so none
//! of seccompiler's relative jumps move. The result behaves as the filters stacked in the
//! kernel would (the harshest action wins) but is one program, installed with one
//! `seccomp(2)` call, and every instruction used is one the kernel's per-syscall
//! "always allowed" cache can evaluate, so plain syscalls stay on the fast path.
//!
//! The guard is code, not policy data, because seccompiler's JSON matches syscall names
//! only; it cannot say "every number above N".

use std::mem::offset_of;

use libc::sock_filter;
use seccompiler::TargetArch;

/// The last syscall the policies were reviewed against: `mseal` (Linux 6.10), number 462
/// on x86_64, aarch64 and riscv64 alike (syscalls from 424 on have one number on every
/// architecture). Anything newer gets `ENOSYS`, the answer of a kernel that predates it,
/// so a new kernel cannot widen the sandbox before the policies are reviewed for it.
pub const LAST_REVIEWED_SYSCALL: u32 = 462;

/// `__X32_SYSCALL_BIT`: x32-ABI syscalls run with the x86_64 audit arch and this bit set
/// in the number, so per-number rules would not see them.
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `AUDIT_ARCH_*` from `<linux/audit.h>`: `EM_*` | 64-bit | little-endian.
const AUDIT_ARCH_64LE: u32 = 0x8000_0000 | 0x4000_0000;
pub const AUDIT_ARCH_X86_64: u32 = 62 | AUDIT_ARCH_64LE;
pub const AUDIT_ARCH_AARCH64: u32 = 183 | AUDIT_ARCH_64LE;
pub const AUDIT_ARCH_RISCV64: u32 = 243 | AUDIT_ARCH_64LE;
/// `AUDIT_ARCH_I386` (`EM_386` | little-endian): what `int 0x80` reports on x86_64.
#[cfg(test)]
pub const AUDIT_ARCH_I386: u32 = 3 | 0x4000_0000;

// Classic BPF opcodes (`<linux/bpf_common.h>`), as the 16-bit `code` field.
pub const LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
#[cfg(test)]
pub const ALU_AND_K: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
pub const JMP_JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
pub const JMP_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
pub const JMP_JGT_K: u16 = (libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K) as u16;
pub const JMP_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
pub const RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

/// The kernel's limit on one filter (`BPF_MAXINSNS`).
pub const MAX_INSTRUCTIONS: usize = libc::BPF_MAXINSNS as usize;

const NR_OFFSET: u32 = offset_of!(libc::seccomp_data, nr) as u32;
const ARCH_OFFSET: u32 = offset_of!(libc::seccomp_data, arch) as u32;

pub fn audit_arch(arch: TargetArch) -> u32 {
    match arch {
        TargetArch::x86_64 => AUDIT_ARCH_X86_64,
        TargetArch::aarch64 => AUDIT_ARCH_AARCH64,
        TargetArch::riscv64 => AUDIT_ARCH_RISCV64,
    }
}

fn stmt(code: u16, k: u32) -> sock_filter {
    sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> sock_filter {
    sock_filter { code, jt, jf, k }
}

/// The ABI guard every program starts with (see the module docs).
pub fn guard(arch: TargetArch) -> Vec<sock_filter> {
    let mut p = vec![
        stmt(LD_W_ABS, ARCH_OFFSET),
        jump(JMP_JEQ_K, audit_arch(arch), 1, 0),
        stmt(RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        stmt(LD_W_ABS, NR_OFFSET),
    ];
    if arch == TargetArch::x86_64 {
        p.extend([
            jump(JMP_JGE_K, X32_SYSCALL_BIT, 0, 1),
            stmt(RET_K, libc::SECCOMP_RET_KILL_PROCESS),
        ]);
    }
    p.extend([
        jump(JMP_JGT_K, LAST_REVIEWED_SYSCALL, 0, 1),
        stmt(
            RET_K,
            libc::SECCOMP_RET_ERRNO | (libc::ENOSYS as u32 & libc::SECCOMP_RET_DATA),
        ),
    ]);
    p
}

/// The guard followed by `filters` (seccompiler output, in evaluation order), chained.
pub fn assemble(arch: TargetArch, filters: &[Vec<seccompiler::sock_filter>]) -> Vec<sock_filter> {
    let mut program = guard(arch);
    program.reserve(filters.iter().map(Vec::len).sum());
    for (i, filter) in filters.iter().enumerate() {
        let last = i + 1 == filters.len();
        for (pc, insn) in filter.iter().enumerate() {
            let insn = if !last && insn.code == RET_K && insn.k == libc::SECCOMP_RET_ALLOW {
                // "Allowed by this filter" becomes "ask the next one": jump past the end.
                let to_end = filter.len() - pc - 1;
                stmt(JMP_JA, to_end as u32)
            } else {
                sock_filter {
                    code: insn.code,
                    jt: insn.jt,
                    jf: insn.jf,
                    k: insn.k,
                }
            };
            program.push(insn);
        }
    }
    if filters.is_empty() {
        // The policy check refuses empty policies; still, never emit a program that can
        // run off its end.
        program.push(stmt(RET_K, libc::SECCOMP_RET_ALLOW));
    }
    program
}
