//! `cargo afl` target: see `codebox_fuzz::codegen`.

fn main() {
    afl::fuzz!(|data: &[u8]| codebox_fuzz::codegen::run(data));
}
