//! `cargo afl` target: see `codebox_fuzz::seccomp_policy`.

fn main() {
    afl::fuzz!(|data: &[u8]| codebox_fuzz::seccomp_policy::run(data));
}
