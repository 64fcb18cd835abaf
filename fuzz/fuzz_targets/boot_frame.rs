//! `cargo afl` target: see `codebox_fuzz::boot_frame`.

fn main() {
    afl::fuzz!(|data: &[u8]| codebox_fuzz::boot_frame::run(data));
}
