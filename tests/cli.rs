//! Bad input gets a one-line error naming the problem and the fix, and a non-zero exit.

mod common;

use std::io::Write;

use common::*;

fn stderr_of(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn missing_rootfs_names_the_fix() {
    let out = std::process::Command::new(codebox_bin())
        .args(["run", "python", "-c", "print(1)"])
        .env("CODEBOX_ROOTFS", "/nonexistent/rootfs")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = stderr_of(&out);
    assert!(err.contains("cargo xtask rootfs"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[test]
fn tampered_rootfs_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("etc")).unwrap();
    std::fs::write(dir.path().join("etc/hosts"), "tampered").unwrap();
    std::fs::write(
        dir.path().join(".manifest"),
        "# codebox rootfs manifest v1\nd\t0755\t/etc\nf\t0644\t8\te3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\t/etc/hosts\n",
    )
    .unwrap();
    for p in ["", "etc"] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path().join(p), std::fs::Permissions::from_mode(0o755))
            .unwrap();
    }
    std::fs::set_permissions(
        dir.path().join("etc/hosts"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let out = std::process::Command::new(codebox_bin())
        .args([
            "run",
            "--rootfs",
            dir.path().to_str().unwrap(),
            "python",
            "-c",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = stderr_of(&out);
    assert!(
        err.contains("tampered") && err.contains("/etc/hosts"),
        "{err}"
    );

    std::fs::remove_file(dir.path().join("etc/hosts")).unwrap();
    let out = std::process::Command::new(codebox_bin())
        .args([
            "run",
            "--rootfs",
            dir.path().to_str().unwrap(),
            "python",
            "-c",
            "1",
        ])
        .output()
        .unwrap();
    let err = stderr_of(&out);
    assert!(
        err.contains("incomplete") && err.contains("/etc/hosts is missing"),
        "{err}"
    );
}

/// A tiny sealed tree (0555 directories, 0444 files) with a valid manifest: codebox
/// verifies it (then fails later: there is no Python in it).
fn tiny_sealed_rootfs() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("etc")).unwrap();
    std::fs::write(dir.path().join("etc/hosts"), "").unwrap();
    std::fs::write(
        dir.path().join(".manifest"),
        "# codebox rootfs manifest v1\nd\t0555\t/etc\nf\t0444\t0\te3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855\t/etc/hosts\n",
    )
    .unwrap();
    for (p, m) in [
        ("etc/hosts", 0o444),
        (".manifest", 0o444),
        ("etc", 0o555),
        ("", 0o555),
    ] {
        std::fs::set_permissions(dir.path().join(p), std::fs::Permissions::from_mode(m)).unwrap();
    }
    dir
}

/// `codebox run --rootfs ROOT python -c 1` with `home` as its HOME (its stamp cache).
fn run_in(root: &std::path::Path, home: &std::path::Path) -> (String, String) {
    let out = std::process::Command::new(codebox_bin())
        .args([
            "run",
            "--rootfs",
            root.to_str().unwrap(),
            "python",
            "-c",
            "1",
        ])
        .env("HOME", home)
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("RUST_LOG", "codebox=debug")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let err = stderr_of(&out);
    // Without the log's colour sequences (`ESC [ ... m`).
    let plain: String = err
        .split('\u{1b}')
        .enumerate()
        .map(|(i, part)| match (i, part.split_once('m')) {
            (0, _) => part,
            (_, Some((_, rest))) => rest,
            (_, None) => "",
        })
        .collect();
    let how = [
        "verification=Full",
        "verification=Sealed",
        "verification=Stamp",
    ]
    .into_iter()
    .find(|v| plain.contains(v))
    .unwrap_or("refused")
    .to_string();
    (how, err)
}

#[test]
fn a_sealed_rootfs_is_trusted_by_its_stamp_but_a_planted_file_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let root = tiny_sealed_rootfs();
    let home = tempfile::tempdir().unwrap();
    assert_eq!(run_in(root.path(), home.path()).0, "verification=Full");
    assert_eq!(run_in(root.path(), home.path()).0, "verification=Sealed");
    // A file planted in a sealed directory, the directory sealed again.
    let etc = root.path().join("etc");
    std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(etc.join("ld.so.preload"), "/tmp/evil.so").unwrap();
    std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(0o555)).unwrap();
    let (how, err) = run_in(root.path(), home.path());
    assert_eq!(how, "refused", "{err}");
    assert!(err.contains("/etc/ld.so.preload is not listed"), "{err}");
    // A tree that became writable is no longer trusted by its seal. (A sealed directory
    // refuses its owner's unlink unless they are root: opened for the removal first.)
    std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::remove_file(etc.join("ld.so.preload")).unwrap();
    std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(0o555)).unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (how, err) = run_in(root.path(), home.path());
    assert!(
        how == "verification=Full" || how == "verification=Stamp",
        "{how}: {err}"
    );
    // Opened again so the temporary directory can be removed by a user other than root.
    std::fs::set_permissions(&etc, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn unknown_language_is_refused() {
    let out = codebox(&["run", "ruby", "-c", "puts 1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr_of(&out).contains("python or typescript"),
        "{}",
        stderr_of(&out)
    );
}

#[test]
fn unreadable_file_is_named() {
    let out = codebox(&["run", "python", "/nonexistent/prog.py"]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr_of(&out).contains("/nonexistent/prog.py"),
        "{}",
        stderr_of(&out)
    );
}

#[test]
fn non_utf8_code_is_refused() {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(b"print('caf\xe9')\n").unwrap();
    let out = codebox(&["run", "python", file.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(125));
    let err = stderr_of(&out);
    assert!(
        err.contains("not valid UTF-8") && err.contains("offset 10"),
        "{err}"
    );
}

#[test]
fn bad_options_are_refused() {
    let out = codebox(&["run", "--timeout", "soon", "python", "-c", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr_of(&out).contains("duration"), "{}", stderr_of(&out));
    let out = codebox(&["run", "--workspace", "/nonexistent/ws", "python", "-c", "1"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        stderr_of(&out).contains("/nonexistent/ws"),
        "{}",
        stderr_of(&out)
    );
}

#[test]
fn oversized_code_is_refused() {
    if !sandbox_available("oversized_code_is_refused") {
        return;
    }
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(&vec![b'#'; 2 * 1024 * 1024]).unwrap();
    let out = codebox(&["run", "python", file.path().to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr_of(&out).contains("limit is 1048576 bytes"),
        "{}",
        stderr_of(&out)
    );
}

#[test]
fn host_without_user_namespaces_gets_the_fix() {
    if !sandbox_available("host_without_user_namespaces_gets_the_fix") {
        return;
    }
    // user.max_user_namespaces is per user namespace: 0 inside a throwaway one makes a
    // host without user namespaces, for codebox running in it.
    let script = format!(
        "echo 0 > /proc/sys/user/max_user_namespaces && exec {} run python -c 'print(1)'",
        codebox_bin().display()
    );
    let out = std::process::Command::new("unshare")
        .args(["-U", "-r", "sh", "-c", &script])
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .output()
        .expect("unshare runs");
    assert_eq!(out.status.code(), Some(125), "{}", stderr_of(&out));
    let err = stderr_of(&out);
    assert!(
        err.contains("user namespaces are not available") && err.contains("sysctl"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

fn serve_with_config(toml: &str, env: &[(&str, &str)]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("codebox.toml");
    std::fs::write(&path, toml).unwrap();
    let mut cmd = std::process::Command::new(codebox_bin());
    cmd.args(["serve", "--config", path.to_str().unwrap()])
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .env_remove("CODEBOX_HTTP_TOKEN")
        .stdin(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn config_file_unknown_keys_are_named() {
    let out = serve_with_config("concurency = 4\n", &[]);
    assert_eq!(out.status.code(), Some(125));
    let err = stderr_of(&out);
    assert!(
        err.contains("concurency") && err.contains("codebox.toml"),
        "{err}"
    );
}

#[test]
fn config_file_secrets_and_env_overrides() {
    // A token named by env:VAR that is not set is an error naming the variable.
    let out = serve_with_config(
        "[http]\naddr = \"0.0.0.0:0\"\ntoken = \"env:CODEBOX_TEST_NO_SUCH_VAR\"\n",
        &[],
    );
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr_of(&out).contains("CODEBOX_TEST_NO_SUCH_VAR"),
        "{}",
        stderr_of(&out)
    );
    // A non-loopback address from the environment, without a token, is refused.
    let out = serve_with_config("queue = 3\n", &[("CODEBOX_HTTP_ADDR", "0.0.0.0:0")]);
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr_of(&out).contains("bearer token is required"),
        "{}",
        stderr_of(&out)
    );
    // A bad value in the environment names the variable.
    let out = serve_with_config("", &[("CODEBOX_QUEUE", "lots")]);
    assert!(
        stderr_of(&out).contains("CODEBOX_QUEUE"),
        "{}",
        stderr_of(&out)
    );
    let out = std::process::Command::new(codebox_bin())
        .args(["serve", "--config", "/nonexistent/codebox.toml"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        stderr_of(&out).contains("/nonexistent/codebox.toml"),
        "{}",
        stderr_of(&out)
    );
}

#[test]
fn zero_tool_calls_in_flight_is_refused() {
    let out = serve_with_config("max_tool_calls_in_flight = 0\n", &[]);
    assert_eq!(out.status.code(), Some(125));
    let err = stderr_of(&out);
    assert!(
        err.contains("max_tool_calls_in_flight: must be at least 1"),
        "{err}"
    );
    let out = serve_with_config("tool_answer_queue = \"lots\"\n", &[]);
    assert_eq!(out.status.code(), Some(125));
    let err = stderr_of(&out);
    assert!(err.contains("tool_answer_queue"), "{err}");
}

// `codebox exec`: a rootfs program under every layer `run` uses.

fn exec(args: &[&str]) -> std::process::Output {
    std::process::Command::new(codebox_bin())
        .arg("exec")
        .args(args)
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn exec_passes_exit_status_and_output_through() {
    if !sandbox_available("exec_passes_exit_status_and_output_through") {
        return;
    }
    let out = exec(&[
        "--",
        "/usr/bin/python3",
        "-c",
        "import sys; print('out', sys.argv[1:]); print('err', file=sys.stderr); sys.exit(7)",
        "-x",
        "y z",
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", stderr_of(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out ['-x', 'y z']\n");
    assert_eq!(stderr_of(&out), "err\n");
    let out = exec(&["/usr/bin/python3", "-S", "-c", "pass"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
}

#[test]
fn exec_reports_a_signal_as_128_plus_its_number() {
    if !sandbox_available("exec_reports_a_signal_as_128_plus_its_number") {
        return;
    }
    let out = exec(&[
        "--",
        "/usr/bin/python3",
        "-c",
        "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
    ]);
    assert_eq!(out.status.code(), Some(128 + 15), "{}", stderr_of(&out));
}

#[test]
fn exec_refuses_a_relative_or_missing_program() {
    let out = exec(&["--", "python3", "-c", "pass"]);
    assert_eq!(out.status.code(), Some(125));
    let err = stderr_of(&out);
    assert!(err.contains("absolute path"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    if !sandbox_available("exec_refuses_a_relative_or_missing_program") {
        return;
    }
    let out = exec(&["--", "/usr/bin/no-such-program"]);
    assert_eq!(out.status.code(), Some(125));
    let err = stderr_of(&out);
    assert!(
        err.contains("/usr/bin/no-such-program") && err.contains("No such file"),
        "{err}"
    );
}

#[test]
fn exec_runs_under_every_layer() {
    if !sandbox_available("exec_runs_under_every_layer") {
        return;
    }
    let code = "import os, socket, sys\n\
        status = dict(l.split(':\\t', 1) for l in open('/proc/self/status').read().splitlines() if ':\\t' in l)\n\
        print(socket.gethostname(), os.getuid(), os.getgid(), repr(sys.stdin.read()))\n\
        print(status['CapEff'].strip(), status['NoNewPrivs'].strip(), status['Seccomp'].strip())\n\
        print(sorted(os.environ))\n\
        print(os.path.exists('/home'), os.getcwd())";
    let out = exec(&["--", "/usr/bin/python3", "-c", code]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr_of(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 4, "{stdout}");
    // Own hostname, the unprivileged sandbox user, empty stdin.
    assert_eq!(lines[0], "codebox 1000 1000 ''", "{stdout}");
    // No capabilities, no_new_privs, a seccomp filter (mode 2).
    assert_eq!(lines[1], "0000000000000000 1 2", "{stdout}");
    // The fixed environment of `run`'s Python, nothing of ours.
    assert_eq!(
        lines[2],
        "['HOME', 'LANG', 'MPLBACKEND', 'MPLCONFIGDIR', 'PATH', 'PYTHONDONTWRITEBYTECODE', 'TMPDIR']",
        "{stdout}"
    );
    // The rootfs, not the host's: no /home; the working directory of `run`.
    assert_eq!(lines[3], "False /workspace", "{stdout}");
}
