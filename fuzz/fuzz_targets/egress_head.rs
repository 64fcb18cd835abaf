//! `cargo afl` target: see `codebox_fuzz::egress_head`.

fn main() {
    afl::fuzz!(|data: &[u8]| codebox_fuzz::egress_head::run(data));
}
