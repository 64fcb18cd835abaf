//! `cargo afl` target: see `codebox_fuzz::http_body`.

fn main() {
    afl::fuzz!(|data: &[u8]| codebox_fuzz::http_body::run(data));
}
