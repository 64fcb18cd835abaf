//! The rootfs's data set (`rootfs/recipe.toml` `[python] packages`, `[deno] packages`) and
//! pip for the package installer, in real sandboxes: cold (`codebox run`) and pooled (a
//! `codebox serve --pool-size 2`, `common::pooled`), as root and, through
//! `cargo xtask test --rootless-only datasets`, as an unprivileged user.
//!
//! A slim rootfs (`cargo xtask rootfs --slim`) has no data set: these tests then skip with
//! the reason, or fail under `CODEBOX_TEST_STRICT`.

mod common;

use common::pooled::{python_ok_cold_and_warm, run_warm};
use common::*;

/// How a pooled interpreter reaches pip: the installer directory put on `sys.path` by hand
/// (it is not on the program's), pip run as `python -m pip` would.
const PIP: &str = "import sys; sys.path.insert(0, \"/opt/codebox/installer\"); import runpy; runpy.run_module(\"pip\", run_name=\"__main__\")";

fn manifest() -> String {
    std::fs::read_to_string(rootfs_dir().join(".manifest")).unwrap_or_default()
}

/// Whether the rootfs has the data set; prints the reason when not.
fn data_set_available(test: &str) -> bool {
    if !sandbox_available(test) {
        return false;
    }
    if manifest().contains("\t/opt/codebox/site-packages/pandas/__init__.py\n") {
        return true;
    }
    let why = "the rootfs has no data set (built with --slim?): run `cargo xtask rootfs`";
    if strict() {
        panic!("{test}: {why}");
    }
    eprintln!("SKIP {test}: {why}");
    false
}

const DATA_SET: &str = r#"
import numpy as np, pandas as pd, matplotlib, matplotlib.pyplot as plt
rng = np.random.default_rng(7)
df = pd.DataFrame({"k": rng.integers(0, 10, 10_000), "v": rng.random(10_000)})
g = df.groupby("k")["v"].agg(["count", "mean"])
print(len(df), len(g), int(g["count"].sum()), round(float(g["mean"].mean()), 1))
fig, ax = plt.subplots()
ax.bar(g.index, g["mean"])
fig.savefig("/tmp/plot.png")
png = open("/tmp/plot.png", "rb").read()
print(matplotlib.get_backend(), png[:8] == b"\x89PNG\r\n\x1a\n", len(png) > 1000)
print(np.linalg.solve(np.array([[2.0, 0], [0, 4.0]]), np.array([2.0, 8.0])).tolist())
import requests, certifi
print(requests.Session().__class__.__name__, certifi.where())
"#;

#[test]
fn numpy_pandas_matplotlib_and_requests_work_cold_and_pooled() {
    if !data_set_available("numpy_pandas_matplotlib_and_requests_work_cold_and_pooled") {
        return;
    }
    let out = python_ok_cold_and_warm(DATA_SET);
    assert_eq!(
        out,
        "10000 10 10000 0.5\nmodule://codebox_mpl True True\n[1.0, 2.0]\n\
         Session /opt/codebox/site-packages/certifi/cacert.pem\n"
    );
}

#[test]
fn a_pooled_interpreter_has_the_data_set_imported_and_a_cold_one_does_not() {
    if !data_set_available("a_pooled_interpreter_has_the_data_set_imported_and_a_cold_one_does_not")
    {
        return;
    }
    // The variable that asks for the preload is gone from the program's environment (the
    // process's initial environment block, /proc/self/environ, keeps it).
    let probe = "import sys, os\n\
        print(sorted(m for m in ('numpy', 'pandas', 'matplotlib.pyplot') if m in sys.modules))\n\
        print('CODEBOX_PRELOAD' in os.environ)";
    assert_eq!(python_ok(probe), "[]\nFalse\n");
    let warm = run_warm("python", probe);
    assert_eq!(warm["exit_code"], 0, "{warm:#}");
    assert_eq!(
        warm["stdout"],
        "['matplotlib.pyplot', 'numpy', 'pandas']\nFalse\n"
    );

    // What the program's own import then costs (printed, not asserted: a benchmark).
    let timing = "import time\nt = time.perf_counter()\nimport pandas, numpy\n\
        print(round((time.perf_counter() - t) * 1e6))";
    let warm = run_warm("python", timing);
    let cold = run_json("python", timing, &[]);
    eprintln!(
        "import pandas, numpy: pooled {} us, cold {} us",
        warm["stdout"].as_str().unwrap_or("?").trim(),
        cold["stdout"].as_str().unwrap_or("?").trim()
    );
}

#[test]
fn codebox_toml_replaces_the_profiles_preload() {
    if !data_set_available("codebox_toml_replaces_the_profiles_preload") {
        return;
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let config = dir.path().join("codebox.toml");
    let probe = "import sys\n\
        print(sorted(m for m in ('numpy', 'pandas', 'matplotlib.pyplot') if m in sys.modules))";
    for (preload, imported) in [("[]", "[]\n"), ("[\"numpy\"]", "['numpy']\n")] {
        std::fs::write(&config, format!("[python]\npreload = {preload}\n")).unwrap();
        let mut server = common::pooled::Server::start_with_config(Some(&config));
        server.until_pool_ready(2);
        let r = server.request(
            "tools/call",
            serde_json::json!({"name": "execute_python", "arguments": {"code": probe}}),
        );
        let sc = &r["result"]["structuredContent"];
        assert_eq!(sc["start"], "warm", "{r:#}");
        assert_eq!(sc["stdout"], imported, "preload = {preload}: {r:#}");
        server.kill();
    }
    // A name that is not a module name stops the server with a clear error.
    std::fs::write(&config, "[python]\npreload = [\"os; import x\"]\n").unwrap();
    let out = std::process::Command::new(common::codebox_bin())
        .args(["serve", "--pool-size", "1"])
        .env("CODEBOX_CONFIG", &config)
        .env("CODEBOX_ROOTFS", common::rootfs_dir())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("codebox serve runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("not a dotted module name"), "{stderr}");
}

#[test]
fn a_workspace_module_named_like_a_preloaded_one_wins_as_in_a_cold_run() {
    if !data_set_available("a_workspace_module_named_like_a_preloaded_one_wins_as_in_a_cold_run") {
        return;
    }
    let code = "import numpy\nprint(numpy.__file__)";
    let args = serde_json::json!({"code": code, "files": {"numpy.py": "X = 1\n"}});
    let warm = common::pooled::run_warm_with("python", args);
    assert_eq!(warm["exit_code"], 0, "{warm:#}");
    assert_eq!(warm["stdout"], "/workspace/numpy.py\n");
}

#[test]
fn typescript_imports_the_cached_npm_package_cold_and_pooled() {
    if !data_set_available("typescript_imports_the_cached_npm_package_cold_and_pooled") {
        return;
    }
    let code = "import _ from \"npm:lodash\";\nconsole.log(JSON.stringify(_.chunk([1, 2, 3], 2)), _.VERSION);";
    let cold = run_json("typescript", code, &[]);
    assert_eq!(cold["exit_code"], 0, "{cold:#}");
    let warm = run_warm("typescript", code);
    assert_eq!(warm["exit_code"], 0, "{warm:#}");
    assert_eq!(cold["stdout"], warm["stdout"]);
    assert_eq!(cold["stdout"], "[[1,2],[3]] 4.18.1\n");

    // A package the rootfs does not hold is never fetched: the import fails at once,
    // naming it.
    let missing = run_json(
        "typescript",
        "import x from \"npm:left-pad\";\nconsole.log(x);",
        &[],
    );
    assert_ne!(missing["exit_code"], 0, "{missing:#}");
    let err = missing["stderr"].as_str().unwrap_or_default();
    assert!(
        err.contains("left-pad") && err.contains("--cached-only"),
        "{err}"
    );
}

#[test]
fn pip_for_the_installer_runs_in_a_sandbox_and_installs_a_local_wheel() {
    if !data_set_available("pip_for_the_installer_runs_in_a_sandbox_and_installs_a_local_wheel") {
        return;
    }
    // The program makes a wheel in its /tmp and has pip install it, offline, the way the
    // package installer runs pip.
    let code = format!(
        r#"
import base64, hashlib, subprocess, sys, zipfile, os
PIP = {PIP:?}
os.makedirs("/tmp/wheels")
info = "tinypkg-1.0.dist-info"
files = {{
    "tinypkg/__init__.py": "VALUE = 42\n",
    info + "/METADATA": "Metadata-Version: 2.1\nName: tinypkg\nVersion: 1.0\n",
    info + "/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}}
record = [p + ",sha256=" + base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b"=").decode() + "," + str(len(t)) for p, t in files.items()]
files[info + "/RECORD"] = "\n".join(record + [info + "/RECORD,,"]) + "\n"
with zipfile.ZipFile("/tmp/wheels/tinypkg-1.0-py3-none-any.whl", "w") as z:
    for p, t in files.items():
        z.writestr(p, t)
pip = [sys.executable, "-I", "-S", "-B", "-c", PIP]
v = subprocess.run(pip + ["--version"], capture_output=True, text=True)
print(v.returncode, v.stdout.split(" from ")[1].split(" ")[0])
r = subprocess.run(pip + ["install", "--only-binary=:all:", "--no-index", "--find-links", "/tmp/wheels",
                          "--target", "/tmp/x", "--no-cache-dir", "--disable-pip-version-check", "tinypkg"],
                   capture_output=True, text=True)
print(r.returncode, r.stderr.strip())
sys.path.insert(0, "/tmp/x")
import tinypkg
print(tinypkg.VALUE)
try:
    import pip
except ImportError:
    print("pip is not on the program's path")
"#
    );
    let out = python_ok(&code);
    assert_eq!(
        out,
        "0 /opt/codebox/installer/pip\n0 \n42\npip is not on the program's path\n"
    );
}

#[test]
fn the_manifest_covers_every_package_file_and_vendored_library() {
    if !data_set_available("the_manifest_covers_every_package_file_and_vendored_library") {
        return;
    }
    use sha2::Digest;
    let manifest = manifest();
    let listed: std::collections::HashMap<&str, &str> = manifest
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f.first() == Some(&"f")).then(|| (f[4], f[3]))
        })
        .collect();
    let root = rootfs_dir();
    let mut shared_objects = 0;
    let mut stack = vec![root.join("opt/codebox/site-packages")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let path = e.path();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = format!("/{}", path.strip_prefix(&root).unwrap().display());
            let sha = listed
                .get(rel.as_str())
                .unwrap_or_else(|| panic!("{rel} is not in the manifest"));
            let name = path.file_name().unwrap().to_string_lossy();
            if name.ends_with(".so") || name.contains(".so.") {
                shared_objects += 1;
                let got = format!("{:x}", sha2::Sha256::digest(std::fs::read(&path).unwrap()));
                assert_eq!(&got, sha, "{rel}");
            }
        }
    }
    assert!(shared_objects > 50, "{shared_objects} shared objects");
    // numpy's vendored OpenBLAS sits where numpy's $ORIGIN run path finds it, once.
    let openblas: Vec<&&str> = listed.keys().filter(|p| p.contains("openblas")).collect();
    assert_eq!(openblas.len(), 1, "{openblas:?}");
    assert!(openblas[0].starts_with("/opt/codebox/site-packages/numpy.libs/"));
    // The C++ runtime the wheels need comes from the host, at its own path.
    assert!(
        listed
            .keys()
            .any(|p| p.starts_with("/usr/lib/") && p.contains("libstdc++.so")),
        "no libstdc++"
    );

    // A changed byte in a package's shared object (same size) is refused, naming it.
    let so =
        "/opt/codebox/site-packages/numpy/_core/_multiarray_umath.cpython-311-x86_64-linux-gnu.so";
    let line = manifest
        .lines()
        .find(|l| l.ends_with(&format!("\t{so}")))
        .expect("numpy's core extension is in the manifest");
    let t = tempfile::tempdir().unwrap();
    let copy = t.path().join(&so[1..]);
    let mut dirs = Vec::new();
    let mut d = copy.parent().unwrap();
    while d != t.path() {
        dirs.push(format!(
            "d\t0755\t/{}",
            d.strip_prefix(t.path()).unwrap().display()
        ));
        d = d.parent().unwrap();
    }
    dirs.reverse();
    std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
    let mut bytes = std::fs::read(root.join(&so[1..])).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&copy, bytes).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o755)).unwrap();
    for dir in std::iter::once(t.path().to_path_buf()).chain(
        copy.ancestors()
            .skip(1)
            .take_while(|a| *a != t.path())
            .map(|a| a.to_path_buf()),
    ) {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(
        t.path().join(".manifest"),
        format!(
            "# codebox rootfs manifest v1\n{}\n{line}\n",
            dirs.join("\n")
        ),
    )
    .unwrap();
    let out = std::process::Command::new(codebox_bin())
        .args([
            "run",
            "--rootfs",
            t.path().to_str().unwrap(),
            "python",
            "-c",
            "1",
        ])
        .env("XDG_CACHE_HOME", t.path().join("cache"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("_multiarray_umath") && err.contains("tampered"),
        "{err}"
    );
}
