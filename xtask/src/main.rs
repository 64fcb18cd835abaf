//! Project automation in Rust, run as `cargo xtask <command>` (the alias lives in
//! `.cargo/config.toml`), in the manner of rust-analyzer's xtask: no build scripts, no shell,
//! few dependencies, arguments parsed by hand.
//!
//! One module per command; `main` only dispatches.

use std::ffi::OsString;
use std::process::ExitCode;

mod bench;
mod bench_compare;
mod bench_datasets;
mod bench_sdk;
mod bench_throughput;
mod dist;
mod docs;
mod fuzz;
mod guest;
mod image;
mod instructions;
mod rootfs;
mod test;

const HELP: &str = "\
cargo xtask <command> [options]

Commands:
  rootfs            build the sandbox's root filesystem (target/rootfs)
  guest             the microVM backend's guest (kernel, initramfs, erofs rootfs image)
                    and the jailed VMM's root directory (target/guest)
  test              everything CI runs: rootfs, lints, all tests as root and rootless
  docs              the book (docs/, mdBook) into target/book: the configuration reference
                    rendered from the types, every internal link checked
  dist              a relocatable release (target/packages): tarball with the stripped binary
                    and the rootfs, a Debian package; checked unpacked with `env -i`
  fuzz              the coverage-guided fuzz targets of fuzz/ under AFL++ (cargo afl),
                    each for a bounded time; fails on a crash
  image             an OCI image layout of the release (target/image), no container
                    engine needed: `codebox serve --http` as a non-root user
  bench-compare     start-up latency: bare interpreters vs bwrap vs codebox (exec, run,
                    MCP with and without the warm pool), side by side
  bench-datasets    what the rootfs's data set adds (size, cold start) and what the
                    pool's preload saves (import pandas pooled/cold/host, memory)
  check-kubernetes  deploy/kubernetes offline: schemas (kubernetes-validate), security
                    properties, `haproxy -c` and the balancer's routing on loopback
  bench-throughput  executions per second of one `codebox serve --http` under K clients,
                    latency, warm starts, and a leak check
  bench-sdk         tool-call latency as the official Python MCP SDK sees it over stdio:
                    over the client's floor, warm and in bursts, next to mcp-run-python
                    and code-executor-mcp
  instructions      instruction budgets of the hot paths under valgrind's callgrind
                    (benches/instruction_budgets.toml); fails when one is over

Run `cargo xtask <command> --help` for a command's options.
";

fn main() -> ExitCode {
    // Started by cargo as the rustc wrapper of the fuzz build (see fuzz/rustc_wrapper.rs).
    if fuzz::rustc_wrapper::wrapping() {
        return fuzz::rustc_wrapper::run(std::env::args_os().skip(1).collect());
    }
    let mut args = std::env::args_os().skip(1);
    let command = args.next();
    let rest: Vec<OsString> = args.collect();
    let result = match command
        .as_ref()
        .map(|c| c.to_str().unwrap_or("<not UTF-8>"))
    {
        Some("rootfs") => rootfs::run(&rest),
        Some("test") => test::run(&rest),
        Some("guest") => guest::run(&rest),
        Some("dist") => dist::run(&rest),
        Some("docs") => docs::run(&rest),
        Some("fuzz") => fuzz::run(&rest),
        Some("image") => image::run(&rest),
        Some("bench-compare") => bench_compare::run(&rest),
        Some("bench-throughput") => bench_throughput::run(&rest),
        Some("bench-datasets") => bench_datasets::run(&rest),
        Some("bench-sdk") => bench_sdk::run(&rest),
        Some("instructions") => instructions::run(&rest),
        Some("check-kubernetes") => test::check_kubernetes(&rest),
        // `test`, `ci` and `bench` are dispatched here, each to its own module.
        None | Some("help" | "-h" | "--help") => {
            print!("{HELP}");
            Ok(())
        }
        Some(other) => Err(anyhow::anyhow!(
            "unknown command {other:?}; see `cargo xtask --help`"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}
