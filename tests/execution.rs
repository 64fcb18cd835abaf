//! Running programs: output, exit codes, signals, timeouts, caps and clean-up.

mod common;

use std::time::Instant;

use common::*;

#[test]
fn python_and_typescript_print() {
    if !sandbox_available("python_and_typescript_print") {
        return;
    }
    let v = run_json("python", "print('hello from', 'python')", &[]);
    assert_eq!(v["stdout"], "hello from python\n");
    assert_eq!(v["exit_code"], 0);
    let v = run_json(
        "typescript",
        "const n: number = 6 * 7; console.log(`answer ${n}`); console.error('to stderr');",
        &[],
    );
    assert_eq!(v["stdout"], "answer 42\n", "{v:#}");
    assert_eq!(v["stderr"], "to stderr\n", "{v:#}");
    assert_eq!(v["exit_code"], 0);
}

#[test]
fn exit_codes_and_signals_are_reported() {
    if !sandbox_available("exit_codes_and_signals_are_reported") {
        return;
    }
    let v = run_json("python", "import sys; sys.exit(3)", &[]);
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["signal"], serde_json::Value::Null);
    let v = run_json("python", "exit(5)", &[]);
    assert_eq!(v["exit_code"], 5, "{v:#}");
    let v = run_json("typescript", "Deno.exit(4)", &[]);
    assert_eq!(v["exit_code"], 4, "{v:#}");
    let v = run_json(
        "python",
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
        &[],
    );
    assert_eq!(v["signal"], 9, "{v:#}");
    assert_eq!(v["exit_code"], serde_json::Value::Null);
    let v = run_json("python", "import os; os.abort()", &[]);
    assert_eq!(v["signal"], 6, "{v:#}");
    // The plain CLI exits with the program's status.
    let out = codebox(&["run", "python", "-c", "raise SystemExit(7)"]);
    assert_eq!(out.status.code(), Some(7));
    let out = codebox(&["run", "python", "-c", "import os; os.kill(os.getpid(), 15)"]);
    assert_eq!(out.status.code(), Some(128 + 15));
}

/// A one-shot run skips the interpreter's teardown (the `EPHEMERAL` boot record), but
/// everything a caller can see of a normal exit still happens.
#[test]
fn the_quick_exit_keeps_what_a_normal_exit_shows() {
    if !sandbox_available("the_quick_exit_keeps_what_a_normal_exit_shows") {
        return;
    }
    let code = r#"
import atexit, sys, threading, time
atexit.register(lambda: print("atexit ran"))
def late():
    time.sleep(0.2)
    print("thread done")
threading.Thread(target=late).start()
sys.stdout.write("no newline;")
sys.stderr.write("err no newline")
sys.exit(3)
"#;
    let v = run_json("python", code, &[]);
    assert_eq!(v["exit_code"], 3, "{v:#}");
    assert_eq!(v["stdout"], "no newline;thread done\natexit ran\n", "{v:#}");
    assert_eq!(v["stderr"], "err no newline", "{v:#}");
    // SystemExit with a message: printed on stderr, status 1; negative codes wrap.
    let v = run_json("python", "raise SystemExit('bye')", &[]);
    assert_eq!(
        (v["exit_code"].clone(), v["stderr"].clone()),
        (1.into(), "bye\n".into())
    );
    let v = run_json("python", "import sys; sys.exit(-1)", &[]);
    assert_eq!(v["exit_code"], 255, "{v:#}");
    // An uncaught exception after output: traceback, status 1, output kept.
    let v = run_json("python", "print('before')\n1/0", &[]);
    assert_eq!(v["exit_code"], 1, "{v:#}");
    assert_eq!(v["stdout"], "before\n");
    assert!(
        v["stderr"].as_str().unwrap().contains("ZeroDivisionError"),
        "{v:#}"
    );
}

#[test]
fn exceptions_show_a_traceback_with_source() {
    if !sandbox_available("exceptions_show_a_traceback_with_source") {
        return;
    }
    let v = run_json("python", "x = 1\nraise ValueError('boom')\n", &[]);
    assert_eq!(v["exit_code"], 1);
    let err = v["stderr"].as_str().unwrap();
    assert!(err.contains("ValueError: boom"), "{err}");
    assert!(err.contains("line 2"), "{err}");
    assert!(err.contains("raise ValueError('boom')"), "{err}");
    assert!(!err.contains("boot.py"), "{err}");
    let v = run_json("typescript", "throw new Error('ts boom');", &[]);
    assert_eq!(v["exit_code"], 1, "{v:#}");
    assert!(v["stderr"].as_str().unwrap().contains("ts boom"), "{v:#}");
}

#[test]
fn infinite_loop_is_killed_at_timeout_with_its_children() {
    if !sandbox_available("infinite_loop_is_killed_at_timeout_with_its_children") {
        return;
    }
    let marker = marker("timeout");
    let code = format!(
        "import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600) # {marker}'])\nwhile True: pass\n"
    );
    let start = Instant::now();
    let v = run_json("python", &code, &["--timeout", "1500ms"]);
    let took = start.elapsed();
    assert_eq!(v["timed_out"], true, "{v:#}");
    assert_eq!(v["signal"], 9);
    assert!(took.as_secs_f64() < 10.0, "took {took:?}");
    assert!(v["duration_ms"].as_f64().unwrap() >= 1400.0, "{v:#}");
    assert_eq!(processes_with_marker(&marker), Vec::<i32>::new());
    // The plain CLI reports the timeout with status 124.
    let out = codebox(&[
        "run",
        "--timeout",
        "300ms",
        "typescript",
        "-c",
        "while (true) {}",
    ]);
    assert_eq!(out.status.code(), Some(124));
    assert!(String::from_utf8_lossy(&out.stderr).contains("timed out"));
}

#[test]
fn huge_output_is_truncated_with_true_total() {
    if !sandbox_available("huge_output_is_truncated_with_true_total") {
        return;
    }
    let v = run_json(
        "python",
        "import sys\nchunk = b'x' * 1_000_000\nfor _ in range(100): sys.stdout.buffer.write(chunk)\nsys.stderr.write('done')\n",
        &[],
    );
    assert_eq!(v["exit_code"], 0, "{}", v["stderr"]);
    assert_eq!(v["stdout_truncated"], true);
    assert_eq!(v["stdout_total_bytes"], 100_000_000u64);
    // The head and the end within the 1 MiB cap, around a marker.
    let stdout = v["stdout"].as_str().unwrap();
    let marker = stdout
        .split_once("\n[codebox: ")
        .and_then(|(_, m)| m.split_once("]\n"))
        .map(|(m, _)| m)
        .expect("a marker");
    assert!(
        marker.contains("bytes of stdout were not kept here"),
        "{marker}"
    );
    assert_eq!(
        stdout.len() - marker.len() - "\n[codebox: ]\n".len(),
        1 << 20
    );
    assert_eq!(v["stderr_truncated"], false);
    assert_eq!(v["stderr"], "done");
    // A limit of 10 bytes: the first 8 and the last 2.
    let v = run_json("python", "print('y' * 100)", &["--output-limit", "10"]);
    assert_eq!(
        v["stdout"],
        "yyyyyyyy\n[codebox: 91 bytes of stdout were not kept here: the first 8 and the last 2 bytes are]\ny\n"
    );
    assert_eq!(v["stdout_total_bytes"], 101);
}

#[test]
fn children_left_behind_are_killed_when_the_program_exits() {
    if !sandbox_available("children_left_behind_are_killed_when_the_program_exits") {
        return;
    }
    let marker = marker("orphan");
    let code = format!(
        "import os, subprocess, sys\nfor _ in range(3):\n    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600) # {marker}'], start_new_session=True)\nif os.fork() == 0:\n    import time; time.sleep(600)\nprint('parent exits')\n"
    );
    let v = run_json("python", &code, &[]);
    assert_eq!(v["stdout"], "parent exits\n", "{v:#}");
    assert_eq!(processes_with_marker(&marker), Vec::<i32>::new());
    assert_no_sandbox_process_remains();
}

#[test]
fn workspace_is_shared_and_importable() {
    if !sandbox_available("workspace_is_shared_and_importable") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("helper.py"), "VALUE = 41\n").unwrap();
    std::fs::write(
        dir.path().join("lib.ts"),
        "export function twice(n: number): number { return 2 * n; }\n",
    )
    .unwrap();
    // As root the sandbox user is an unprivileged host id: let it write here.
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).unwrap();
    }
    let ws = dir.path().to_str().unwrap();
    let v = run_json(
        "python",
        "import helper\nopen('out.txt', 'w').write(str(helper.VALUE + 1))\nprint(open('/workspace/out.txt').read())",
        &["--workspace", ws],
    );
    assert_eq!(v["stdout"], "42\n", "{v:#}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).unwrap(),
        "42"
    );
    let v = run_json(
        "typescript",
        "import { twice } from '/workspace/lib.ts';\nconsole.log(twice(21));",
        &["--workspace", ws],
    );
    assert_eq!(v["stdout"], "42\n", "{v:#}");
}

/// A cold Python sandbox imports boot.py from the byte code the rootfs ships: run as a
/// script it was compiled at every start (26 M instructions, more than the interpreter's
/// own start). Under its own name, so a workspace's `boot.py` is the program's `boot`.
#[test]
fn a_cold_python_start_imports_its_boot_file_from_byte_code() {
    if !sandbox_available("a_cold_python_start_imports_its_boot_file_from_byte_code") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("boot.py"), "MINE = True\n").unwrap();
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).unwrap();
    }
    let code = "import os, sys\n\
        spec = sys.modules['_codebox_boot'].__spec__\n\
        print(spec.origin, spec.cached.startswith('/opt/codebox/python/__pycache__/boot.'), os.path.exists(spec.cached))\n\
        print(type(spec.loader).__name__, sys.modules['__main__'].__file__ if hasattr(sys.modules['__main__'], '__file__') else '-')\n\
        import boot\n\
        print(boot.MINE, boot.__file__)\n";
    let v = run_json(
        "python",
        code,
        &["--workspace", dir.path().to_str().unwrap()],
    );
    assert_eq!(
        v["stdout"],
        "/opt/codebox/python/boot.py True True\n\
         SourceFileLoader -\n\
         True /workspace/boot.py\n",
        "{v:#}"
    );
}

#[test]
fn files_are_written_into_the_workspace_before_the_run() {
    if !sandbox_available("files_are_written_into_the_workspace_before_the_run") {
        return;
    }
    let host = tempfile::tempdir().unwrap();
    let csv = host.path().join("local.csv");
    std::fs::write(&csv, "a,b\n1,2\n3,4\n").unwrap();
    let lib = host.path().join("lib.ts");
    std::fs::write(&lib, "export const twice = (n: number) => 2 * n;\n").unwrap();
    let data = format!("data/in.csv={}", csv.display());
    let v = run_json(
        "python",
        "import csv\nprint(sum(int(r['b']) for r in csv.DictReader(open('data/in.csv'))))",
        &["--file", &data],
    );
    assert_eq!(v["stdout"], "6\n", "{v:#}");
    let lib_arg = format!("lib.ts={}", lib.display());
    let v = run_json(
        "typescript",
        "import { twice } from './lib.ts';\nconsole.log(twice((await Deno.readTextFile('data/in.csv')).length));",
        &["--file", &data, "--file", &lib_arg],
    );
    assert_eq!(v["stdout"], "24\n", "{v:#}");
    // Any bytes: a binary file arrives as it is, in both runtimes.
    let bin = host.path().join("blob.bin");
    let bytes: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    std::fs::write(&bin, &bytes).unwrap();
    let bin_arg = format!("blob.bin={}", bin.display());
    let v = run_json(
        "python",
        "import zlib\nb = open('blob.bin', 'rb').read()\nprint(len(b), zlib.crc32(b))",
        &["--file", &bin_arg],
    );
    let crc = {
        // CRC-32 (IEEE), as zlib computes it.
        let mut crc = 0xFFFF_FFFFu32;
        for b in &bytes {
            crc ^= u32::from(*b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    };
    assert_eq!(v["stdout"], format!("300000 {crc}\n"), "{v:#}");
    let v = run_json(
        "typescript",
        "const b = await Deno.readFile('blob.bin'); console.log(b.length, b[255], b[256]);",
        &["--file", &bin_arg],
    );
    assert_eq!(v["stdout"], "300000 255 0\n", "{v:#}");
    // The program's own module (written next to it so relative imports resolve) is not
    // left behind in a bound workspace, even when the program calls Deno.exit.
    let ws = tempfile::tempdir().unwrap();
    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(ws.path(), Some(65534), Some(65534)).unwrap();
    }
    let wsarg = ws.path().to_str().unwrap();
    for code in ["console.log(1)", "Deno.exit(0)", "throw new Error('x')"] {
        let v = run_json(
            "typescript",
            code,
            &["--workspace", wsarg, "--file", &lib_arg],
        );
        let names: Vec<_> = v["workspace_files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["path"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["lib.ts"], "{code}: {v:#}");
    }

    for bad in ["../x.csv", "/abs.csv", "a//b"] {
        let out = codebox(&[
            "run",
            "python",
            "-c",
            "pass",
            "--file",
            &format!("{bad}={}", csv.display()),
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "{bad}: {stderr}");
        assert!(stderr.contains("is invalid"), "{bad}: {stderr}");
    }
}

#[test]
fn file_writer_never_follows_a_workspace_symlink() {
    if !sandbox_available("file_writer_never_follows_a_workspace_symlink") {
        return;
    }
    // A bound workspace holding a symlink to a directory outside it: writing "out/x"
    // through it must fail inside the sandbox, for both boot files.
    let ws = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), ws.path().join("out")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("f"), ws.path().join("f")).unwrap();
    if nix::unistd::geteuid().is_root() {
        for d in [ws.path(), outside.path()] {
            std::os::unix::fs::chown(d, Some(65534), Some(65534)).unwrap();
        }
    }
    let src = ws.path().join("src.txt");
    std::fs::write(&src, "payload").unwrap();
    let wsarg = ws.path().to_str().unwrap();
    for lang in ["python", "typescript"] {
        for dest in ["out/x", "f"] {
            let v = run_json(
                lang,
                "print(1)",
                &[
                    "--workspace",
                    wsarg,
                    "--file",
                    &format!("{dest}={}", src.display()),
                ],
            );
            assert_ne!(v["exit_code"], 0, "{lang} {dest}: {v:#}");
            assert!(
                v["stdout"].as_str().unwrap().is_empty(),
                "{lang} {dest}: {v:#}"
            );
        }
    }
    assert_eq!(
        std::fs::read_dir(outside.path()).unwrap().count(),
        0,
        "a file was written outside the workspace"
    );
}

#[test]
fn large_programs_are_delivered_whole() {
    if !sandbox_available("large_programs_are_delivered_whole") {
        return;
    }
    // ~600 KiB of source: far beyond one argv string (128 KiB).
    let mut code = String::from("total = 0\n");
    for i in 0..40_000 {
        code.push_str(&format!("total += {i}\n"));
    }
    code.push_str("print(total)\n");
    let mut file = tempfile::NamedTempFile::new().unwrap();
    std::io::Write::write_all(&mut file, code.as_bytes()).unwrap();
    let out = codebox(&["run", "--json", "python", file.path().to_str().unwrap()]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["stdout"],
        format!("{}\n", (0..40_000u64).sum::<u64>()),
        "{}",
        v["stderr"]
    );
}

#[test]
fn plain_mode_streams_output_and_reads_files() {
    if !sandbox_available("plain_mode_streams_output_and_reads_files") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("prog.py");
    std::fs::write(&file, "print('from a file')\n").unwrap();
    let out = codebox(&["run", "python", file.to_str().unwrap()]);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "from a file\n");
}

#[test]
fn nothing_is_left_after_200_runs() {
    if !sandbox_available("nothing_is_left_after_200_runs") {
        return;
    }
    let mounts_before = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let tmp_before = tmp_entries();
    for i in 0..200 {
        let lang = if i % 10 == 0 { "typescript" } else { "python" };
        let code = if lang == "python" {
            "print(1)"
        } else {
            "console.log(1)"
        };
        let v = run_json(lang, code, &[]);
        assert_eq!(v["stdout"], "1\n", "run {i}: {v:#}");
    }
    assert_no_sandbox_process_remains();
    assert_eq!(
        std::fs::read_to_string("/proc/self/mountinfo").unwrap(),
        mounts_before,
        "host mounts changed"
    );
    let leaked: Vec<_> = tmp_entries()
        .difference(&tmp_before)
        .filter(|n| n.contains("codebox"))
        .cloned()
        .collect();
    assert!(leaked.is_empty(), "temp entries left: {leaked:?}");
}

fn tmp_entries() -> std::collections::BTreeSet<String> {
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// As root the sandbox user is `nobody`: a directory owned by another unprivileged user is
/// attached through an idmapped mount, so the program writes there and its files are the
/// owner's; a root-owned directory is refused with the fix named.
#[test]
fn as_root_a_workspace_is_writable_through_an_idmapped_mount() {
    let test = "as_root_a_workspace_is_writable_through_an_idmapped_mount";
    if !sandbox_available(test) {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIP {test}: rootless, the sandbox user is the caller and owns its directory");
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(dir.path().join("in.txt"), "given").unwrap();
    for p in [dir.path().to_path_buf(), dir.path().join("in.txt")] {
        std::os::unix::fs::chown(&p, Some(4242), Some(4243)).unwrap();
    }
    let ws = dir.path().to_str().unwrap();
    let v = run_json(
        "python",
        "import os\nopen('out.txt', 'w').write(open('in.txt').read())\nos.mkdir('d')\nos.chmod('out.txt', 0o755)\n\
         try:\n    os.chmod('out.txt', 0o4755)\n    print('set-uid allowed')\nexcept PermissionError:\n    pass\n\
         print(os.stat('.').st_uid == os.getuid())",
        &["--workspace", ws],
    );
    assert_eq!(v["stdout"], "True\n", "{v:#}");
    let out = std::fs::metadata(dir.path().join("out.txt")).unwrap();
    assert_eq!(
        (out.uid(), out.gid()),
        (4242, 4243),
        "files are the owner's"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).unwrap(),
        "given"
    );
    // No set-id file reaches the host directory (seccomp refuses such modes).
    assert_eq!(out.mode() & 0o7777, 0o755, "out.txt mode");
    assert_eq!(std::fs::metadata(dir.path().join("d")).unwrap().uid(), 4242);
    // A root-owned directory: refused, naming the fix.
    let rooted = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(codebox_bin())
        .args([
            "run",
            "--workspace",
            rooted.path().to_str().unwrap(),
            "python",
            "-c",
            "1",
        ])
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("is owned by 0:0 (root's user and group)")
            && err.contains("chown -R 65534:65534"),
        "{err}"
    );
    // An unprivileged owner in root's group: refused too, and the group is what is named.
    std::os::unix::fs::chown(rooted.path(), Some(4242), Some(0)).unwrap();
    let out = std::process::Command::new(codebox_bin())
        .args([
            "run",
            "--workspace",
            rooted.path().to_str().unwrap(),
            "python",
            "-c",
            "1",
        ])
        .env("CODEBOX_ROOTFS", rootfs_dir())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("is owned by 4242:0 (gid 0 is root's group)")
            && !err.contains("belongs to root"),
        "{err}"
    );
}
