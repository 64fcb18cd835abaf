//! Every target over its committed seeds and its regression inputs (crashes found and
//! fixed), without AFL++: `cargo test --lib` in `fuzz/` (the binaries link AFL++'s
//! runtime, which only `cargo afl build` provides; the library does not).

use std::path::Path;

fn replay(target: &str) {
    let run = crate::target(target).expect("a known target");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut inputs = 0;
    for dir in ["corpus", "regressions"] {
        let dir = root.join(dir).join(target);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut paths: Vec<_> = entries
            .map(|e| e.expect("a directory entry").path())
            .collect();
        paths.sort();
        for path in paths {
            let data = std::fs::read(&path).expect("an input file");
            eprintln!("{target}: {}", path.display());
            run(&data);
            inputs += 1;
        }
    }
    assert!(inputs > 0, "{target} has no seeds in fuzz/corpus/{target}");
}

macro_rules! replay_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                replay(stringify!($name));
            }
        )*

        /// Every target in `crate::TARGETS` is replayed here.
        #[test]
        fn every_target_is_replayed() {
            let here = [$(stringify!($name)),*];
            for (name, _) in crate::TARGETS {
                assert!(here.contains(name), "{name} has no replay test");
            }
        }
    };
}

replay_tests!(
    jsonrpc,
    stdio,
    http_body,
    proxy_channel,
    boot_frame,
    pii,
    codegen,
    config,
    seccomp_policy,
    egress_head,
);
