//! Tests of `deno_cache.rs`: the packument cut, and a whole `stage` against an npm registry
//! served on loopback by the test itself (no network), read back by Deno with
//! `--cached-only`.

use super::*;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

#[test]
fn packuments_keep_only_cached_versions() {
    let t = tempfile::tempdir().unwrap();
    let pkg = t.path().join("npm/registry.example/@scope/pkg");
    for v in ["1.0.0", "1.0.0_1", "1.1.0-rc.1"] {
        fs::create_dir_all(pkg.join(v)).unwrap();
    }
    let doc = serde_json::json!({
        "name": "@scope/pkg",
        "dist-tags": {"latest": "2.0.0", "next": "1.1.0-rc.1", "old": "0.9.0"},
        "versions": {"0.9.0": {}, "1.0.0": {"x": 1}, "1.1.0-rc.1": {}, "2.0.0": {}},
        "time": {"created": "t0", "1.0.0": "t1", "2.0.0": "t2"},
    });
    fs::write(pkg.join("registry.json"), doc.to_string()).unwrap();
    trim_npm_registry_files(&t.path().join("npm")).unwrap();
    let got: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(pkg.join("registry.json")).unwrap()).unwrap();
    assert_eq!(
        got,
        serde_json::json!({
            "name": "@scope/pkg",
            // The release outranks its own pre-release of a later version only by number.
            "dist-tags": {"latest": "1.1.0-rc.1", "next": "1.1.0-rc.1"},
            "versions": {"1.0.0": {"x": 1}, "1.1.0-rc.1": {}},
            "time": {"created": "t0", "1.0.0": "t1"},
        })
    );
    assert!(version_key("1.0.0") > version_key("1.0.0-rc.1"));
    assert!(version_key("1.10.0") > version_key("1.9.9"));
    assert!(version_key("2.0.0+build") == version_key("2.0.0"));
}

/// The Deno binary the rootfs build uses: `$DENO`, else the one it installed.
fn deno() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("DENO").map(PathBuf::from),
        Some(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../target/rootfs-build/deno-pip")
                .join("bin/deno"),
        ),
    ];
    let found = candidates.into_iter().flatten().find(|p| p.is_file());
    if found.is_none() {
        eprintln!("skipped: no deno binary (set DENO, or run `cargo xtask rootfs` once)");
    }
    found
}

/// `files` as an npm tarball (`package/...`, gzip) made with tar.
fn tarball(dir: &Path, files: &[(&str, &str)]) -> Vec<u8> {
    let root = dir.join("src");
    for (name, text) in files {
        let p = root.join("package").join(name);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }
    let out = dir.join("pkg.tgz");
    let status = Command::new("tar")
        .arg("-czf")
        .arg(&out)
        .arg("-C")
        .arg(&root)
        .arg("package")
        .status()
        .unwrap();
    assert!(status.success());
    fs::read(out).unwrap()
}

fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A minimal npm registry on 127.0.0.1: `GET /tinypkg` (the packument, versions 1.0.0 and
/// 2.0.0, latest 2.0.0) and the tarballs. Serves until the listener is dropped with the
/// process; returns its URL and a log of the paths asked for.
fn serve_registry(dir: &Path) -> (String, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use sha2::Digest;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let mut files = std::collections::HashMap::new();
    let mut versions = serde_json::Map::new();
    for v in ["1.0.0", "2.0.0"] {
        let tgz = tarball(
            &dir.join(v),
            &[
                (
                    "package.json",
                    &format!(
                        r#"{{"name":"tinypkg","version":"{v}","main":"index.js","type":"module"}}"#
                    ),
                ),
                ("index.js", &format!("export const version = \"{v}\";\n")),
            ],
        );
        let path = format!("/tinypkg/-/tinypkg-{v}.tgz");
        let integrity = format!("sha512-{}", base64(&sha2::Sha512::digest(&tgz)));
        versions.insert(
            v.into(),
            serde_json::json!({
                "name": "tinypkg", "version": v, "main": "index.js",
                "dist": {"tarball": format!("{}{}", url.trim_end_matches('/'), path), "integrity": integrity},
            }),
        );
        files.insert(path, tgz);
    }
    let packument = serde_json::json!({
        "name": "tinypkg", "dist-tags": {"latest": "2.0.0"}, "versions": versions,
    });
    files.insert("/tinypkg".into(), packument.to_string().into_bytes());
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = log.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut reader = BufReader::new(conn.try_clone().unwrap());
            let mut line = String::new();
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
            loop {
                let mut h = String::new();
                if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
                    break;
                }
            }
            seen.lock().unwrap().push(path.clone());
            let (status, body) = match files.get(&path) {
                Some(b) => ("200 OK", b.clone()),
                None => ("404 Not Found", b"{}".to_vec()),
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(&body);
        }
    });
    (url, log)
}

#[test]
fn npm_packages_are_cached_and_resolve_offline_to_the_cached_version() {
    let Some(deno) = deno() else { return };
    let t = tempfile::tempdir().unwrap();
    let (url, log) = serve_registry(t.path());
    let env: [(&str, &OsStr); 1] = [("NPM_CONFIG_REGISTRY", url.as_ref())];
    let build = t.path().join("build");
    fs::create_dir_all(&build).unwrap();
    let pkgs = vec!["npm:tinypkg@1.0.0".to_owned()];
    let s = stage_with(&deno, &pkgs, &build, &env).unwrap();
    assert!(s.installed);
    let mut top: Vec<String> = fs::read_dir(&s.dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    top.sort();
    assert_eq!(top, [STAMP, "npm"], "only the packages are kept");
    assert!(
        !log.lock().unwrap().iter().any(|p| p.contains("2.0.0")),
        "{:?}",
        log.lock().unwrap()
    );
    // Reused while nothing changed.
    let asked = log.lock().unwrap().len();
    assert!(!stage_with(&deno, &pkgs, &build, &env).unwrap().installed);
    assert_eq!(log.lock().unwrap().len(), asked);

    // Deno reads it with --cached-only: an import without a version finds the cached 1.0.0
    // although the registry's latest was 2.0.0, and nothing is fetched.
    let main = t.path().join("main.ts");
    fs::write(
        &main,
        "import { version } from \"npm:tinypkg\";\nconsole.log(version);\n",
    )
    .unwrap();
    let out = Command::new(&deno)
        .args(["run", "--cached-only", "--no-config", "--no-lock"])
        .arg(&main)
        .env("DENO_DIR", &s.dir)
        .env("DENO_NO_UPDATE_CHECK", "1")
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1.0.0\n");
    assert_eq!(log.lock().unwrap().len(), asked);

    // No packages: an empty cache, and deno does not run.
    let none = stage_with(&deno, &[], &build, &env).unwrap();
    assert!(!none.installed && !none.dir.join("npm").exists());
}
