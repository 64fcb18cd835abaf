//! `cargo afl` target: see `codebox_fuzz::proxy_channel`.

fn main() {
    afl::fuzz!(|data: &[u8]| codebox_fuzz::proxy_channel::run(data));
}
