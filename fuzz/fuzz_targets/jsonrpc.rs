//! `cargo afl` target: see `codebox_fuzz::jsonrpc`.

fn main() {
    afl::fuzz!(|data: &[u8]| codebox_fuzz::jsonrpc::run(data));
}
