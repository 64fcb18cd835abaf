//! `cargo afl` target: see `codebox_fuzz::config`.

fn main() {
    afl::fuzz!(|data: &[u8]| codebox_fuzz::config::run(data));
}
