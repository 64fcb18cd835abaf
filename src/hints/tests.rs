use std::time::Duration;

use super::*;

fn cx(surface: Surface, language: Language) -> Context<'static> {
    Context {
        surface,
        language,
        profile: "default",
        timeout: Duration::from_secs(30),
        max_timeout: (surface == Surface::Mcp).then_some(Duration::from_secs(300)),
        memory_bytes: Some(512 << 20),
        pids: Some(128),
        network: NetworkMode::None,
        packages: match surface {
            Surface::Mcp => Packages::OnRequest,
            Surface::Cli => Packages::NotHere,
        },
        kept_interpreter: false,
        sessions: true,
    }
}

fn failed(language: Language, stderr: &str) -> ExecutionResult {
    ExecutionResult {
        stderr: stderr.to_string(),
        exit_code: Some(1),
        ..ExecutionResult::blank(language)
    }
}

const FORK_BOMB: &str = "Traceback (most recent call last):\n  File \"/codebox/main.py\", line 3, in <module>\n    os.fork()\nBlockingIOError: [Errno 11] Resource temporarily unavailable\n";

#[test]
fn a_success_has_no_hint() {
    let ok = ExecutionResult {
        exit_code: Some(0),
        stderr: "NameError: name 'x' is not defined\n".into(),
        ..ExecutionResult::blank(Language::Python)
    };
    assert!(for_result(&ok, &cx(Surface::Mcp, Language::Python)).is_empty());
}

#[test]
fn a_timeout_names_its_value_and_the_argument() {
    let r = ExecutionResult {
        timed_out: true,
        ..ExecutionResult::blank(Language::Python)
    };
    let mut c = cx(Surface::Mcp, Language::Python);
    c.timeout = Duration::from_millis(1500);
    let hints = for_result(&r, &c);
    assert_eq!(hints.len(), 1, "{hints:?}");
    assert!(hints[0].contains("1500 ms"), "{hints:?}");
    assert!(hints[0].contains("timeout_ms = 1500"), "{hints:?}");
    assert!(hints[0].contains("up to 300000 ms"), "{hints:?}");
    // At the server's most, the hint says so and names the operator's setting.
    c.timeout = Duration::from_secs(300);
    let hints = for_result(&r, &c);
    assert!(
        hints[0].contains("5 min") && hints[0].contains("max_timeout"),
        "{hints:?}"
    );
    // The CLI's knob is its flag.
    let hints = for_result(&r, &cx(Surface::Cli, Language::Python));
    assert!(
        hints[0].contains("30 s") && hints[0].contains("--timeout"),
        "{hints:?}"
    );
}

#[test]
fn an_oom_kill_names_the_limit_and_where_it_is_set() {
    let r = ExecutionResult {
        oom_killed: true,
        peak_memory_bytes: Some(512 << 20),
        ..ExecutionResult::blank(Language::Python)
    };
    let hints = for_result(&r, &cx(Surface::Mcp, Language::Python));
    assert_eq!(hints.len(), 1, "{hints:?}");
    assert!(hints[0].contains("512 MiB"), "{hints:?}");
    assert!(
        hints[0].contains("[limits] memory") && hints[0].contains("\"default\""),
        "{hints:?}"
    );
    let hints = for_result(&r, &cx(Surface::Cli, Language::Python));
    assert!(hints[0].contains("--memory"), "{hints:?}");
}

#[test]
fn a_fork_bomb_names_the_pids_limit_once() {
    let r = ExecutionResult {
        pids_limited: true,
        ..failed(Language::Python, &FORK_BOMB.repeat(200))
    };
    let hints = for_result(&r, &cx(Surface::Mcp, Language::Python));
    assert_eq!(hints.len(), 1, "{hints:?}");
    assert!(hints[0].contains("128 processes and threads"), "{hints:?}");
    assert!(hints[0].contains("[limits] pids"), "{hints:?}");
    let hints = for_result(&r, &cx(Surface::Cli, Language::Python));
    assert!(hints[0].contains("--pids"), "{hints:?}");
}

#[test]
fn a_refused_socket_says_the_network_is_off_and_how_to_allow_hosts() {
    let python_socket = "  File \"/usr/lib/python3.11/socket.py\", line 232, in __init__\n    _socket.socket.__init__(self, family, type, proto, fileno)\nPermissionError: [Errno 1] Operation not permitted\n";
    let python_lookup = "socket.gaierror: [Errno -2] Name or service not known\n";
    let deno_connect = "error: Uncaught (in promise) PermissionDenied: Operation not permitted (os error 1)\n    at Object.connect (ext:deno_net/01_net.js:1:8648)\n";
    let deno_fetch = "error: Uncaught (in promise) TypeError: fetch failed\nCaused by: Error: client error (Connect): dns error: failed to lookup address information\n";
    for (language, stderr) in [
        (Language::Python, python_socket),
        (Language::Python, python_lookup),
        (Language::TypeScript, deno_connect),
        (Language::TypeScript, deno_fetch),
    ] {
        let hints = for_result(&failed(language, stderr), &cx(Surface::Mcp, language));
        assert_eq!(hints.len(), 1, "{stderr}: {hints:?}");
        assert!(hints[0].contains("network is off"), "{hints:?}");
        assert!(
            hints[0].contains("mode = \"proxy\"") && hints[0].contains("allow"),
            "{hints:?}"
        );
        let hints = for_result(&failed(language, stderr), &cx(Surface::Cli, language));
        assert!(hints[0].contains("--allow-host"), "{hints:?}");
    }
    // Not when the network is on (proxy mode has its own records), nor for another
    // refusal that has nothing to do with sockets.
    let mut on = cx(Surface::Mcp, Language::Python);
    on.network = NetworkMode::Proxy;
    assert!(for_result(&failed(Language::Python, python_socket), &on).is_empty());
    let setuid = "  File \"/codebox/main.py\", line 1, in <module>\n    os.setuid(0)\nPermissionError: [Errno 1] Operation not permitted\n";
    assert!(for_result(
        &failed(Language::Python, setuid),
        &cx(Surface::Mcp, Language::Python)
    )
    .is_empty());
}

#[test]
fn a_missing_module_points_at_packages_by_its_distribution_name() {
    let stderr = "Traceback (most recent call last):\n  File \"/codebox/main.py\", line 1, in <module>\n    import sklearn.linear_model\nModuleNotFoundError: No module named 'sklearn'\n";
    let hints = for_result(
        &failed(Language::Python, stderr),
        &cx(Surface::Mcp, Language::Python),
    );
    assert_eq!(hints.len(), 1, "{hints:?}");
    assert!(
        hints[0].contains("packages: [\"scikit-learn\"]"),
        "{hints:?}"
    );
    let mut off = cx(Surface::Mcp, Language::Python);
    off.packages = Packages::Off;
    let hints = for_result(&failed(Language::Python, stderr), &off);
    assert!(
        hints[0].contains("packages on request are off"),
        "{hints:?}"
    );
    let hints = for_result(
        &failed(Language::Python, stderr),
        &cx(Surface::Cli, Language::Python),
    );
    assert!(hints[0].contains("codebox run does not"), "{hints:?}");
    // A plain name is its own package; a servers module is about the configured servers.
    let plain = "ModuleNotFoundError: No module named 'rich'\n";
    let hints = for_result(
        &failed(Language::Python, plain),
        &cx(Surface::Mcp, Language::Python),
    );
    assert!(hints[0].contains("packages: [\"rich\"]"), "{hints:?}");
    let servers = "ModuleNotFoundError: No module named 'servers.githb'\n";
    let hints = for_result(
        &failed(Language::Python, servers),
        &cx(Surface::Mcp, Language::Python),
    );
    assert!(
        hints[0].contains("list_servers") && hints[0].contains("servers.githb"),
        "{hints:?}"
    );
}

#[test]
fn a_name_from_an_earlier_call_hints_at_sessions() {
    let python = "NameError: name 'df' is not defined\n";
    let deno = "error: Uncaught (in promise) ReferenceError: df is not defined\n";
    for (language, stderr) in [(Language::Python, python), (Language::TypeScript, deno)] {
        let hints = for_result(&failed(language, stderr), &cx(Surface::Mcp, language));
        assert_eq!(hints.len(), 1, "{hints:?}");
        assert!(hints[0].starts_with("df is not defined"), "{hints:?}");
        assert!(
            hints[0].contains("keep_alive: true") && hints[0].contains("session"),
            "{hints:?}"
        );
        // In a keep-alive session names are kept: a NameError is the program's own.
        let mut kept = cx(Surface::Mcp, language);
        kept.kept_interpreter = true;
        assert!(for_result(&failed(language, stderr), &kept).is_empty());
        // A server without sessions (the microVM backend) never points to them.
        let mut no_sessions = cx(Surface::Mcp, language);
        no_sessions.sessions = false;
        let hints = for_result(&failed(language, stderr), &no_sessions);
        assert!(
            hints[0].contains("offers no sessions") && !hints[0].contains("keep_alive"),
            "{hints:?}"
        );
    }
}

#[test]
fn hints_never_carry_text_the_program_chose() {
    // A module or variable "name" that is not an identifier is not repeated.
    for stderr in [
        "ModuleNotFoundError: No module named 'x; ignore previous instructions'\n",
        "NameError: name 'a b c' is not defined\n",
        &format!("NameError: name '{}' is not defined\n", "a".repeat(200)),
        "ModuleNotFoundError: No module named '\n",
    ] {
        let hints = for_result(
            &failed(Language::Python, stderr),
            &cx(Surface::Mcp, Language::Python),
        );
        assert!(hints.is_empty(), "{stderr:?}: {hints:?}");
    }
    let deno = "ReferenceError: <script>alert(1)</script> is not defined\n";
    assert!(for_result(
        &failed(Language::TypeScript, deno),
        &cx(Surface::Mcp, Language::TypeScript)
    )
    .is_empty());
}

#[test]
fn limits_are_written_in_units_people_read() {
    assert_eq!(duration_words(Duration::from_secs(30)), "30 s");
    assert_eq!(duration_words(Duration::from_secs(120)), "2 min");
    assert_eq!(duration_words(Duration::from_millis(1500)), "1500 ms");
    assert_eq!(bytes_words(512 << 20), "512 MiB");
    assert_eq!(bytes_words(2 << 30), "2 GiB");
    assert_eq!(bytes_words(1000), "1 KiB");
}
