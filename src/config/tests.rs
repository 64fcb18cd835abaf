use super::*;

/// Editors count characters: the column of an error after text with multi-byte
/// characters on its line is counted in characters, not bytes.
#[test]
fn error_columns_count_characters() {
    let e = Config::parse("profile = \"é€\" x\n", Path::new("c.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 1, column 16:"), "{e}");
    let e = Config::parse("# ünïcödé\nconcurrency = \"é\"\n", Path::new("c.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 2, column 15:"), "{e}");
}

#[test]
fn the_backend_and_guest_come_from_the_file_or_the_environment() {
    use crate::microvm::Backend;
    let mut c = Config::parse(
        "backend = \"microvm\"\nguest = \"g\"\n",
        Path::new("/etc/c/codebox.toml"),
    )
    .unwrap();
    c.resolve_paths(Path::new("/etc/c"));
    assert_eq!(c.backend, Some(Backend::Microvm));
    assert_eq!(c.guest.as_deref(), Some(Path::new("/etc/c/g")));
    c.apply_env(&env_of(&[("CODEBOX_BACKEND", "namespace")]))
        .unwrap();
    assert_eq!(c.backend, Some(Backend::Namespace));
    let err = c
        .apply_env(&env_of(&[("CODEBOX_BACKEND", "firecracker")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("namespace or microvm"), "{err}");
    assert!(Config::parse("backend = \"kvm\"\n", Path::new("c.toml")).is_err());
}

#[test]
fn full_file_parses() {
    let c = Config::parse(
        "profile = \"network\"\nconcurrency = 3\n[http]\naddr = \"0.0.0.0:9\"\ntoken = \"env:T\"\nallowed_hosts = [\"a\"]\n",
        Path::new("c.toml"),
    )
    .unwrap();
    assert_eq!(c.profile.as_deref(), Some("network"));
    assert_eq!(c.concurrency, Some(3));
    assert_eq!(c.http.allowed_hosts, Some(vec!["a".to_string()]));
    assert_eq!(
        c.http_token(&env_of(&[("T", "s3")])).unwrap().as_deref(),
        Some("s3")
    );
}

#[test]
fn the_zygote_switch_parses_from_the_file_and_the_environment() {
    let c = Config::parse("[python]\nzygote = false\n", Path::new("c.toml")).unwrap();
    assert_eq!(c.python.zygote, Some(false));
    let mut c = Config::default();
    c.apply_env(&|k| (k == "CODEBOX_ZYGOTE").then(|| "on".to_string()))
        .unwrap();
    assert_eq!(c.python.zygote, Some(true));
    let err = c
        .apply_env(&|k| (k == "CODEBOX_ZYGOTE").then(|| "maybe".to_string()))
        .unwrap_err();
    assert!(err.to_string().contains("CODEBOX_ZYGOTE"), "{err}");
    assert!(Config::parse("[python]\nzygote = 1\n", Path::new("c.toml")).is_err());
}

#[test]
fn python_preload_parses_and_unknown_keys_are_refused() {
    let c = Config::parse("[python]\npreload = [\"numpy\"]\n", Path::new("c.toml")).unwrap();
    assert_eq!(c.python.preload, Some(vec!["numpy".to_string()]));
    let c = Config::parse("", Path::new("c.toml")).unwrap();
    assert_eq!(c.python.preload, None);
    assert!(Config::parse("[python]\npreloads = []\n", Path::new("c.toml")).is_err());
}

#[test]
fn network_section_parses_and_the_environment_can_allow_hosts() {
    let text = "[network]\nmode = \"proxy\"\nallow = [\"api.example.com\"]\n\
                [[network.credentials]]\nhost = \"api.example.com\"\nbearer = \"env:API_TOKEN\"\n";
    let mut c = Config::parse(text, Path::new("c.toml")).unwrap();
    let n = c.network.clone().unwrap();
    assert_eq!(n.mode, Some(crate::egress::NetworkMode::Proxy));
    assert_eq!(n.credentials.len(), 1);
    c.apply_env(&env_of(&[
        ("CODEBOX_NETWORK_ALLOW", "a.example, *.b.example:443"),
        ("CODEBOX_STATE_DIR", "/srv/codebox"),
    ]))
    .unwrap();
    let n = c.network.unwrap();
    assert_eq!(n.allow, ["a.example", "*.b.example:443"]);
    assert_eq!(n.credentials.len(), 1, "the rest of [network] stays");
    assert_eq!(c.state_dir.as_deref(), Some(Path::new("/srv/codebox")));
    let e = Config::parse("[network]\nalow = []\n", Path::new("c.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("alow"), "{e}");
}

#[test]
fn unknown_keys_are_named() {
    let e = Config::parse("concurency = 3\n", Path::new("c.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("concurency") && e.contains("c.toml"), "{e}");
    let e = Config::parse("[http]\ntokn = \"x\"\n", Path::new("c.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("tokn"), "{e}");
}

#[test]
fn the_metrics_address_comes_from_the_file_or_the_environment() {
    let mut c = Config::parse("[metrics]\naddr = \"0.0.0.0:9464\"\n", Path::new("c")).unwrap();
    assert_eq!(c.metrics.addr.as_deref(), Some("0.0.0.0:9464"));
    c.apply_env(&env_of(&[("CODEBOX_METRICS_ADDR", "127.0.0.1:9")]))
        .unwrap();
    assert_eq!(c.metrics.addr.as_deref(), Some("127.0.0.1:9"));
    let e = Config::parse("[metrics]\nport = 1\n", Path::new("c.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("port"), "{e}");
}

#[test]
fn environment_overrides_the_file() {
    let mut c = Config::parse(
        "queue = 1\n[http]\naddr = \"127.0.0.1:1\"\n",
        Path::new("c"),
    )
    .unwrap();
    c.apply_env(&env_of(&[
        ("CODEBOX_QUEUE", "7"),
        ("CODEBOX_HTTP_ADDR", "127.0.0.1:2"),
        ("CODEBOX_HTTP_ALLOWED_ORIGINS", "http://a:*, http://b:*"),
    ]))
    .unwrap();
    assert_eq!(c.queue, Some(7));
    assert_eq!(c.http.addr.as_deref(), Some("127.0.0.1:2"));
    assert_eq!(c.http.allowed_origins.as_ref().unwrap().len(), 2);
    let e = c
        .apply_env(&env_of(&[("CODEBOX_QUEUE", "many")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("CODEBOX_QUEUE"), "{e}");
}

#[test]
fn pool_bounds_from_file_and_environment() {
    let mut c = Config::parse(
        "pool_size = 1\npool_max = 6\npool_shrink_after = \"30s\"\n",
        Path::new("c"),
    )
    .unwrap();
    assert_eq!(
        (c.pool_size, c.pool_max, c.pool_shrink_after.as_deref()),
        (Some(1), Some(6), Some("30s"))
    );
    c.apply_env(&env_of(&[
        ("CODEBOX_POOL_MAX", "12"),
        ("CODEBOX_POOL_SHRINK_AFTER", "2m"),
    ]))
    .unwrap();
    assert_eq!(
        (c.pool_max, c.pool_shrink_after.as_deref()),
        (Some(12), Some("2m"))
    );
    for bad in ["-1", "eight", ""] {
        let e = c
            .apply_env(&env_of(&[("CODEBOX_POOL_MAX", bad)]))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("CODEBOX_POOL_MAX") && e.contains("not a number"),
            "{e}"
        );
    }
    // A wrong type is pointed at (line and column), like every other key's.
    let e = Config::parse("pool_max = \"8\"\n", Path::new("c.toml"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("line 1, column 12") && e.contains("expected usize"),
        "{e}"
    );
    let e = Config::parse("pool_maximum = 8\n", Path::new("c.toml"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("pool_maximum"), "{e}");
}

#[test]
fn connection_limits_from_file_and_environment() {
    let mut c = Config::parse(
        "[http]\nheader_timeout = \"2s\"\nmax_connections = 9\nmax_connections_per_peer = 3\n",
        Path::new("c"),
    )
    .unwrap();
    assert_eq!(c.http.header_timeout.as_deref(), Some("2s"));
    c.apply_env(&env_of(&[
        ("CODEBOX_HTTP_BODY_TIMEOUT", "5s"),
        ("CODEBOX_HTTP_IDLE_TIMEOUT", "1m"),
        ("CODEBOX_HTTP_MAX_CONNECTIONS", "10"),
    ]))
    .unwrap();
    assert_eq!(c.http.body_timeout.as_deref(), Some("5s"));
    assert_eq!(c.http.idle_timeout.as_deref(), Some("1m"));
    assert_eq!(c.http.max_connections, Some(10));
    assert_eq!(c.http.max_connections_per_peer, Some(3));
    let e = c
        .apply_env(&env_of(&[("CODEBOX_HTTP_MAX_CONNECTIONS_PER_PEER", "x")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("CODEBOX_HTTP_MAX_CONNECTIONS_PER_PEER"), "{e}");
    assert!(Config::parse("[http]\nmax_conections = 1\n", Path::new("c")).is_err());
    let mut c = Config::parse(
        "[http]\ntrusted_proxies = [\"10.0.0.0/8\"]\n",
        Path::new("c"),
    )
    .unwrap();
    assert_eq!(c.http.trusted_proxies, Some(vec!["10.0.0.0/8".to_string()]));
    c.apply_env(&env_of(&[(
        "CODEBOX_HTTP_TRUSTED_PROXIES",
        "127.0.0.2, fd00::/8",
    )]))
    .unwrap();
    assert_eq!(
        c.http.trusted_proxies,
        Some(vec!["127.0.0.2".to_string(), "fd00::/8".to_string()])
    );
}

#[test]
fn tool_settings_from_file_and_environment() {
    let c = Config::parse(
        "allowed_tools = [\"time__*\"]\nmax_tool_calls = 5\ntool_call_timeout = \"2s\"\n",
        Path::new("c"),
    )
    .unwrap();
    assert_eq!(c.allowed_tools, Some(vec!["time__*".to_string()]));
    assert_eq!(
        (c.max_tool_calls, c.tool_call_timeout.as_deref()),
        (Some(5), Some("2s"))
    );
    let mut c = Config::default();
    let env = |k: &str| match k {
        "CODEBOX_ALLOWED_TOOLS" => Some("a__*, b__c".to_string()),
        "CODEBOX_MAX_TOOL_CALLS" => Some("7".to_string()),
        _ => None,
    };
    c.apply_env(&env).unwrap();
    assert_eq!(
        c.allowed_tools,
        Some(vec!["a__*".to_string(), "b__c".to_string()])
    );
    assert_eq!(c.max_tool_calls, Some(7));
    let c = Config::parse(
        "max_tool_calls_in_flight = 4\nmax_tool_call_records = 20\ntool_answer_queue = \"1MiB\"\n",
        Path::new("c"),
    )
    .unwrap();
    assert_eq!(
        (c.max_tool_calls_in_flight, c.max_tool_call_records),
        (Some(4), Some(20))
    );
    assert_eq!(c.tool_answer_queue.as_deref(), Some("1MiB"));
    let mut c = Config::default();
    c.apply_env(&env_of(&[("CODEBOX_TOOL_REQUEST_MEMORY", "128MiB")]))
        .unwrap();
    assert_eq!(c.tool_request_memory.as_deref(), Some("128MiB"));
    let mut c = Config::default();
    c.apply_env(&env_of(&[
        ("CODEBOX_MAX_TOOL_CALLS_IN_FLIGHT", "8"),
        ("CODEBOX_MAX_TOOL_CALL_RECORDS", "50"),
    ]))
    .unwrap();
    assert_eq!(
        (c.max_tool_calls_in_flight, c.max_tool_call_records),
        (Some(8), Some(50))
    );
    let e = Config::default()
        .apply_env(&env_of(&[("CODEBOX_MAX_TOOL_CALLS_IN_FLIGHT", "-1")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("CODEBOX_MAX_TOOL_CALLS_IN_FLIGHT"), "{e}");
}

#[test]
fn the_tool_set_from_file_and_environment() {
    use crate::config::tool_set::ToolSet;
    let mut c = Config::parse("tools = \"minimal\"\n", Path::new("c")).unwrap();
    assert_eq!(c.tools, Some(ToolSet::Minimal));
    c.apply_env(&env_of(&[("CODEBOX_TOOLS", "full")])).unwrap();
    assert_eq!(c.tools, Some(ToolSet::Full));
    assert_eq!(Config::default().tools, None);
    let e = Config::parse("tools = \"tiny\"\n", Path::new("c"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("tiny") || e.contains("minimal"), "{e}");
    let e = Config::default()
        .apply_env(&env_of(&[("CODEBOX_TOOLS", "tiny")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("CODEBOX_TOOLS") && e.contains("minimal"), "{e}");
}

#[test]
fn mcp_config_from_file_and_environment() {
    let mut c = Config::parse("mcp_config = \"/etc/codebox/mcp.json\"\n", Path::new("c")).unwrap();
    assert_eq!(c.mcp_config, Some(PathBuf::from("/etc/codebox/mcp.json")));
    c.apply_env(&env_of(&[("CODEBOX_MCP_CONFIG", "/srv/.mcp.json")]))
        .unwrap();
    assert_eq!(c.mcp_config, Some(PathBuf::from("/srv/.mcp.json")));
    let e = Config::parse("mcp_confg = \"x\"\n", Path::new("c"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("mcp_confg"), "{e}");
    assert_eq!(Config::default().mcp_config, None);
}

#[test]
fn missing_secret_names_the_variable() {
    let c = Config::parse("[http]\ntoken = \"env:NOPE\"\n", Path::new("c")).unwrap();
    let e = c.http_token(&env_of(&[])).unwrap_err().to_string();
    assert!(e.contains("NOPE") && e.contains("http.token"), "{e}");
}

#[test]
fn search_order_and_explicit_paths() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(home.join(".config/codebox")).unwrap();
    std::fs::write(home.join(".config/codebox/config.toml"), "queue = 5\n").unwrap();
    let h = home.to_str().unwrap().to_string();
    let (c, from) = Config::load(None, &env_of(&[("HOME", &h)])).unwrap();
    assert_eq!(c.queue, Some(5));
    assert!(from.unwrap().ends_with("config.toml"));
    let explicit = dir.path().join("x.toml");
    std::fs::write(&explicit, "queue = 9\n").unwrap();
    let e = explicit.to_str().unwrap().to_string();
    let (c, _) = Config::load(None, &env_of(&[("HOME", &h), ("CODEBOX_CONFIG", &e)])).unwrap();
    assert_eq!(c.queue, Some(9));
    assert!(Config::load(Some(Path::new("/nonexistent/c.toml")), &env_of(&[])).is_err());
}

#[test]
fn relative_roots_are_relative_to_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "[network]\nmode = \"none\"\nextra_roots = [\"ca.pem\"]\n[packages]\nextra_roots = [\"mirror/ca.pem\", \"/abs.pem\"]\n",
    )
    .unwrap();
    let (c, _) = Config::load(Some(&file), &env_of(&[])).unwrap();
    assert_eq!(c.network.unwrap().extra_roots, [dir.path().join("ca.pem")]);
    assert_eq!(
        c.packages.extra_roots,
        [dir.path().join("mirror/ca.pem"), PathBuf::from("/abs.pem")]
    );
}

/// The Kubernetes manifests' codebox.toml is one this server takes: its paused sessions
/// on the shared volume, sealed with the key the pod gets from the Secret.
#[test]
fn the_kubernetes_configuration_parses_and_keeps_paused_sessions_on_the_shared_volume() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/base/codebox.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let c = Config::parse(&text, &path).unwrap();
    let key: String = (0u8..32)
        .map(|i| format!("{:02x}", i.wrapping_mul(37) ^ 0x5a))
        .collect();
    let env = |var: &str| (var == "CODEBOX_SNAPSHOT_KEY").then(|| key.clone());
    let persist = c
        .sessions
        .settings(c.state_dir.as_deref(), &env)
        .unwrap()
        .expect("paused sessions are on");
    assert_eq!(persist.dir, Path::new("/var/lib/codebox/sessions"));
    // Without the Secret's key the server says so instead of starting without it.
    assert!(c
        .sessions
        .settings(c.state_dir.as_deref(), &|_: &str| None)
        .is_err());
}
