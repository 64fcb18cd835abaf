//! `cargo afl` target: see `codebox_fuzz::pii`.

fn main() {
    afl::fuzz!(|data: &[u8]| codebox_fuzz::pii::run(data));
}
