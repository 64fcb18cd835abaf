//! Classic BPF as the kernel takes it for seccomp (`seccomp_check_filter`,
//! `bpf_check_classic`), for the instructions a seccomp compiler emits: a checker for what
//! the kernel would refuse, and an interpreter.

/// One `struct sock_filter`.
#[derive(Debug, Clone, Copy)]
pub struct Insn {
    pub code: u16,
    pub jt: u8,
    pub jf: u8,
    pub k: u32,
}

pub const LD_W_ABS: u16 = 0x20;
pub const ALU_AND_K: u16 = 0x54;
pub const JMP_JA: u16 = 0x05;
pub const JMP_JEQ_K: u16 = 0x15;
pub const JMP_JGT_K: u16 = 0x25;
pub const JMP_JGE_K: u16 = 0x35;
pub const JMP_JSET_K: u16 = 0x45;
pub const RET_K: u16 = 0x06;
/// `sizeof(struct seccomp_data)`.
pub const DATA_BYTES: u32 = 64;

/// A program from its bytes (`struct sock_filter` in native byte order); `None` when the
/// length is not a whole number of instructions.
pub fn decode(bytes: &[u8]) -> Option<Vec<Insn>> {
    if !bytes.len().is_multiple_of(8) {
        return None;
    }
    Some(
        bytes
            .chunks_exact(8)
            .map(|c| Insn {
                code: u16::from_ne_bytes([c[0], c[1]]),
                jt: c[2],
                jf: c[3],
                k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect(),
    )
}

/// Panics with the reason when the kernel would refuse `program` (or when it holds an
/// instruction this checker does not know).
pub fn check_static(program: &[Insn]) {
    let len = program.len();
    assert!(len > 0, "an empty program");
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

/// Runs a program that passed [`check_static`] on a call `nr` from `arch` with every
/// argument 0; returns its return value.
pub fn eval(program: &[Insn], nr: u32, arch: u32) -> u32 {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn insn(code: u16, jt: u8, jf: u8, k: u32) -> Insn {
        Insn { code, jt, jf, k }
    }

    /// "allow call 1, else errno": the interpreter follows both branches.
    #[test]
    fn a_small_program_runs_both_ways() {
        let p = [
            insn(LD_W_ABS, 0, 0, 0),
            insn(JMP_JEQ_K, 0, 1, 1),
            insn(RET_K, 0, 0, 0x7fff_0000),
            insn(RET_K, 0, 0, 0x0005_0001),
        ];
        check_static(&p);
        assert_eq!(eval(&p, 1, 0), 0x7fff_0000);
        assert_eq!(eval(&p, 2, 0), 0x0005_0001);
    }

    #[test]
    #[should_panic(expected = "out of range")]
    fn a_jump_past_the_end_is_refused() {
        check_static(&[insn(JMP_JA, 0, 0, 5), insn(RET_K, 0, 0, 0)]);
    }

    #[test]
    #[should_panic(expected = "outside seccomp_data")]
    fn a_load_past_seccomp_data_is_refused() {
        check_static(&[insn(LD_W_ABS, 0, 0, 64), insn(RET_K, 0, 0, 0)]);
    }

    #[test]
    fn programs_decode_from_native_bytes() {
        let bytes = [0x20, 0, 1, 2, 4, 0, 0, 0];
        let p = decode(&bytes).unwrap();
        assert_eq!((p[0].code, p[0].jt, p[0].jf, p[0].k), (LD_W_ABS, 1, 2, 4));
        assert!(decode(&bytes[..7]).is_none());
    }
}
