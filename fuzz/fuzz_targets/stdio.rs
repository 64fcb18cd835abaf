//! `cargo afl` target: see `codebox_fuzz::stdio`.

fn main() {
    afl::fuzz!(|data: &[u8]| codebox_fuzz::stdio::run(data));
}
