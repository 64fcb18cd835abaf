//! Upstream MCP servers, for real: the reference servers (filesystem, memory, everything
//! on Node; time on Python) installed by `cargo xtask test` into `CODEBOX_TEST_UPSTREAMS`
//! (default `target/upstreams`), and a tiny SDK server (`tests/upstream/dynamic_server.py`)
//! for list changes and pagination.
//!
//! When the servers are missing a test prints `SKIP <test>: <reason>` and passes, unless
//! `CODEBOX_TEST_STRICT=1`, where it fails. Every test shuts its servers down and checks
//! through /proc that no process of their groups is left.

#[path = "upstream/support.rs"]
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use codebox::upstream::{
    ServerConfig, ServerState, TransportConfig, UpstreamError, UpstreamOptions, Upstreams,
};
use serde_json::json;

use support::*;

#[tokio::test(flavor = "multi_thread")]
async fn four_servers_connect_concurrently_and_answer() {
    let Some(fx) = fixtures("four_servers_connect_concurrently_and_answer") else {
        return;
    };
    let servers = vec![
        fx.filesystem(fx.tmp.path()),
        fx.memory(),
        fx.everything(),
        fx.time(),
    ];
    let started = Instant::now();
    let u = Upstreams::connect(servers, options()).await;
    eprintln!("four upstream servers connected in {:?}", started.elapsed());
    for s in u.servers() {
        assert_eq!(s.state, ServerState::Ready, "{s:?}");
        assert!(s.tool_count > 0 && s.pid.is_some(), "{s:?}");
        assert_eq!(s.attempts, 1, "{s:?}");
    }
    let catalog = u.catalog();
    for name in [
        "filesystem__read_text_file",
        "filesystem__list_directory",
        "memory__create_entities",
        "memory__read_graph",
        "everything__echo",
        "everything__get_sum",
        "time__get_current_time",
        "time__convert_time",
    ] {
        assert!(
            catalog.get(name).is_some(),
            "{name} missing from {:?}",
            catalog.tools.iter().map(|t| &t.name).collect::<Vec<_>>()
        );
    }
    let sum = catalog.get("everything__get_sum").unwrap();
    assert_eq!(
        (sum.server.as_str(), sum.tool.as_str()),
        ("everything", "get-sum")
    );
    assert_eq!(
        (sum.server_ident.as_str(), sum.tool_ident.as_str()),
        ("everything", "get_sum")
    );
    assert_eq!(sum.input_schema["type"], "object");
    let mut names: Vec<&str> = catalog.tools.iter().map(|t| t.name.as_str()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), catalog.tools.len(), "exposed names are unique");
    let total: usize = u.servers().iter().map(|s| s.tool_count).sum();
    assert_eq!(total, catalog.tools.len());

    let now = u
        .call(
            "time__get_current_time",
            args(json!({"timezone": "UTC"})),
            CALL,
        )
        .await
        .unwrap();
    assert!(text(&now).contains("UTC"), "{now:?}");
    let sum = u
        .call("everything__get_sum", args(json!({"a": 2, "b": 40})), CALL)
        .await
        .unwrap();
    assert!(text(&sum).contains("42"), "{sum:?}");
    // A refusal from the server is a result with isError, not a transport failure.
    let missing = u
        .call(
            "filesystem__read_text_file",
            args(json!({"path": "/definitely/not/allowed"})),
            CALL,
        )
        .await
        .unwrap();
    assert_eq!(missing.is_error, Some(true), "{missing:?}");

    let pgids = stdio_pids(&u);
    assert_eq!(pgids.len(), 4);
    shutdown_and_check(&u, &pgids).await;
    assert!(u.catalog().tools.is_empty());
    let e = u
        .call("time__get_current_time", None, CALL)
        .await
        .unwrap_err();
    assert!(matches!(e, UpstreamError::ShutDown), "{e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn filesystem_reads_small_and_ten_megabyte_files() {
    let Some(fx) = fixtures("filesystem_reads_small_and_ten_megabyte_files") else {
        return;
    };
    let dir = fx.tmp.path().join("files");
    std::fs::create_dir(&dir).unwrap();
    let dir = dir.canonicalize().unwrap();
    std::fs::write(dir.join("hello.txt"), "hello from codebox\n").unwrap();
    // 10 MiB of lines: passes through the stdio transport as one JSON-RPC line.
    let line = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_+=!?\n";
    let big: String = line.repeat(10 * 1024 * 1024 / line.len() + 1);
    std::fs::write(dir.join("big.txt"), &big).unwrap();

    let u = Upstreams::connect(vec![fx.filesystem(&dir)], options()).await;
    assert_eq!(status(&u, "filesystem").state, ServerState::Ready);
    let small = u
        .call(
            "filesystem__read_text_file",
            args(json!({"path": dir.join("hello.txt")})),
            CALL,
        )
        .await
        .unwrap();
    assert_eq!(text(&small), "hello from codebox\n");

    let started = Instant::now();
    let large = u
        .call(
            "filesystem__read_text_file",
            args(json!({"path": dir.join("big.txt")})),
            CALL,
        )
        .await
        .unwrap();
    let got = text(&large);
    eprintln!(
        "{} bytes through the filesystem server in {:?}",
        got.len(),
        started.elapsed()
    );
    assert_eq!(got.len(), big.len());
    assert!(got == big, "the 10 MiB file came back changed");
    shutdown_and_check(&u, &stdio_pids(&u)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn memory_takes_nested_arguments() {
    let Some(fx) = fixtures("memory_takes_nested_arguments") else {
        return;
    };
    let u = Upstreams::connect(vec![fx.memory()], options()).await;
    assert_eq!(status(&u, "memory").state, ServerState::Ready);
    let created = u
        .call(
            "memory__create_entities",
            args(json!({"entities": [
                {"name": "codebox", "entityType": "project",
                 "observations": ["runs code in sandboxes", "speaks MCP"]},
                {"name": "rmcp", "entityType": "crate", "observations": ["MCP in Rust"]}
            ]})),
            CALL,
        )
        .await
        .unwrap();
    assert!(text(&created).contains("codebox"), "{created:?}");
    u.call(
        "memory__create_relations",
        args(json!({"relations": [{"from": "codebox", "to": "rmcp", "relationType": "uses"}]})),
        CALL,
    )
    .await
    .unwrap();
    let graph = u.call("memory__read_graph", None, CALL).await.unwrap();
    let graph = text(&graph);
    for needle in [
        "runs code in sandboxes",
        "speaks MCP",
        "MCP in Rust",
        "uses",
    ] {
        assert!(graph.contains(needle), "{needle} not in {graph}");
    }
    shutdown_and_check(&u, &stdio_pids(&u)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn broken_servers_fail_fast_are_retried_and_do_not_hold_up_the_others() {
    let Some(fx) = fixtures("broken_servers_fail_fast_are_retried_and_do_not_hold_up_the_others")
    else {
        return;
    };
    let starts = fx.tmp.path().join("starts");
    let crashing = format!(
        "echo started >> '{}'; echo 'fatal: no API key' >&2; exit 7",
        starts.display()
    );
    let servers = vec![
        stdio(
            "missing",
            "/nonexistent/mcp-server",
            vec![],
            BTreeMap::new(),
        ),
        stdio(
            "crashing",
            "/bin/sh",
            vec!["-c".into(), crashing],
            BTreeMap::new(),
        ),
        stdio("silent", "/bin/sleep", vec!["1000".into()], BTreeMap::new()),
        fx.time(),
    ];
    let opts = UpstreamOptions {
        connect_timeout: Duration::from_secs(5),
        ..options()
    };
    let started = Instant::now();
    let u = Upstreams::connect(servers, opts).await;
    let elapsed = started.elapsed();
    eprintln!("start with one silent server (5 s connect timeout) returned after {elapsed:?}");
    // Bounded by the silent server's timeout (plus the time server's own start), not more.
    assert!(elapsed < PATIENCE, "{elapsed:?}");

    assert_eq!(status(&u, "time").state, ServerState::Ready);
    let missing = status(&u, "missing");
    assert_ne!(missing.state, ServerState::Ready);
    let error = missing.last_error.unwrap();
    assert!(error.contains("/nonexistent/mcp-server"), "{error}");
    let crashing = status(&u, "crashing");
    assert_ne!(crashing.state, ServerState::Ready);
    let error = crashing.last_error.unwrap();
    assert!(
        error.contains("status 7") && error.contains("no API key"),
        "{error}"
    );
    let silent = status(&u, "silent");
    assert_ne!(silent.state, ServerState::Ready);
    assert!(silent.last_error.unwrap().contains("no answer within 5s"));

    // A call to a server that is down fails at once, saying why.
    let e = u.call("crashing__anything", None, CALL).await.unwrap_err();
    assert!(matches!(e, UpstreamError::Unavailable { .. }), "{e}");
    assert!(e.to_string().contains("no API key"), "{e}");
    let e = u.call("nosuchserver__tool", None, CALL).await.unwrap_err();
    assert!(matches!(e, UpstreamError::UnknownTool { .. }), "{e}");
    let e = u.call("time__no_such_tool", None, CALL).await.unwrap_err();
    assert!(matches!(e, UpstreamError::NotListed { .. }), "{e}");
    assert!(e.to_string().contains("time__get_current_time"), "{e}");
    // The healthy one works meanwhile.
    u.call(
        "time__get_current_time",
        args(json!({"timezone": "UTC"})),
        CALL,
    )
    .await
    .unwrap();

    // Retried in the background, with backoff.
    wait_until(&u, "the crashing server was retried twice", |u| {
        status(u, "crashing").attempts >= 3 && status(u, "missing").attempts >= 3
    })
    .await;
    let runs = std::fs::read_to_string(&starts).unwrap().lines().count();
    assert!(runs >= 3, "crashing server started {runs} times");
    shutdown_and_check(&u, &stdio_pids(&u)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_server_fails_the_call_in_flight_and_comes_back() {
    let Some(fx) = fixtures("a_killed_server_fails_the_call_in_flight_and_comes_back") else {
        return;
    };
    let u = Upstreams::connect(vec![fx.everything()], options()).await;
    let first = status(&u, "everything");
    assert_eq!(first.state, ServerState::Ready);
    let pid = first.pid.unwrap();

    let caller = u.clone();
    let call = tokio::spawn(async move {
        let started = Instant::now();
        let r = caller
            .call(
                "everything__trigger_long_running_operation",
                args(json!({"duration": 50, "steps": 50})),
                Duration::from_secs(120),
            )
            .await;
        (r, started.elapsed())
    });
    // Let the call reach the server, then kill the server (the pid codebox spawned).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let (result, took) = call.await.unwrap();
    let e = result.unwrap_err();
    assert!(matches!(e, UpstreamError::ConnectionLost { .. }), "{e}");
    assert!(e.to_string().contains("everything"), "{e}");
    assert!(took < Duration::from_secs(45), "the call hung for {took:?}");

    // A call right after the crash fails at once or, if the reconnect already happened,
    // works; either way the server comes back by itself.
    wait_until(&u, "the server reconnected", |u| {
        let s = status(u, "everything");
        s.state == ServerState::Ready && s.pid != Some(pid)
    })
    .await;
    let s = status(&u, "everything");
    assert!(s.attempts >= 2, "{s:?}");
    assert!(group_members(pid).is_empty(), "the old group is gone");
    let echo = u
        .call("everything__echo", args(json!({"message": "back"})), CALL)
        .await
        .unwrap();
    assert_eq!(text(&echo), "Echo: back");
    shutdown_and_check(&u, &[pid, s.pid.unwrap()]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_call_that_times_out_is_cancelled_and_the_server_stays() {
    let Some(fx) = fixtures("a_call_that_times_out_is_cancelled_and_the_server_stays") else {
        return;
    };
    let u = Upstreams::connect(vec![fx.everything()], options()).await;
    let e = u
        .call(
            "everything__trigger_long_running_operation",
            args(json!({"duration": 30, "steps": 30})),
            Duration::from_millis(500),
        )
        .await
        .unwrap_err();
    assert!(matches!(e, UpstreamError::Timeout { .. }), "{e}");
    assert_eq!(status(&u, "everything").state, ServerState::Ready);
    let echo = u
        .call(
            "everything__echo",
            args(json!({"message": "still here"})),
            CALL,
        )
        .await
        .unwrap();
    assert_eq!(text(&echo), "Echo: still here");
    shutdown_and_check(&u, &stdio_pids(&u)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_kills_grandchildren_too() {
    let Some(fx) = fixtures("shutdown_kills_grandchildren_too") else {
        return;
    };
    // Like `npx`: a wrapper whose child is the real server, plus a stray grandchild
    // that ignores SIGTERM.
    let everything = fx.everything();
    let TransportConfig::Stdio { command, args, .. } = &everything.transport else {
        unreachable!()
    };
    let script = format!(
        "(trap '' TERM; exec sleep 1000 >/dev/null) & {} {}",
        command,
        args.join(" ")
    );
    let wrapped = stdio(
        "wrapped",
        "/bin/sh",
        vec!["-c".into(), script],
        BTreeMap::new(),
    );
    let u = Upstreams::connect(vec![wrapped], options()).await;
    let s = status(&u, "wrapped");
    assert_eq!(s.state, ServerState::Ready, "{s:?}");
    let pgid = s.pid.unwrap();
    let members = group_members(pgid);
    assert!(
        members.len() >= 2,
        "the server and the stray sleep: {members:?}"
    );
    shutdown_and_check(&u, &[pgid]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn streamable_http_upstream() {
    let Some(fx) = fixtures("streamable_http_upstream") else {
        return;
    };
    let server = HttpEverything::start(&fx);
    let http = ServerConfig {
        name: "remote-everything".into(),
        transport: TransportConfig::Http {
            url: format!("http://127.0.0.1:{}/mcp", server.port),
            headers: [("X-Codebox-Test".to_string(), "1".to_string())].into(),
        },
    };
    let u = Upstreams::connect(vec![http], options()).await;
    let s = status(&u, "remote-everything");
    assert_eq!(s.state, ServerState::Ready, "{s:?}");
    assert_eq!((s.transport, s.pid), ("http", None));
    assert!(u.catalog().get("remote_everything__echo").is_some());
    let echo = u
        .call(
            "remote_everything__echo",
            args(json!({"message": "over http"})),
            CALL,
        )
        .await
        .unwrap();
    assert_eq!(text(&echo), "Echo: over http");
    let sum = u
        .call(
            "remote_everything__get_sum",
            args(json!({"a": 1, "b": 2})),
            CALL,
        )
        .await
        .unwrap();
    assert!(text(&sum).contains('3'), "{sum:?}");

    // The server goes away: the next call fails at once, the connection is found dead
    // and the server is reconnected once it is back.
    let port = server.port;
    drop(server);
    let e = u
        .call(
            "remote_everything__echo",
            args(json!({"message": "gone"})),
            CALL,
        )
        .await
        .unwrap_err();
    assert!(e.to_string().contains("remote-everything"), "{e}");
    wait_until(&u, "the dead HTTP upstream is noticed", |u| {
        status(u, "remote-everything").state != ServerState::Ready
    })
    .await;
    let e = u
        .call(
            "remote_everything__echo",
            args(json!({"message": "down"})),
            CALL,
        )
        .await
        .unwrap_err();
    assert!(matches!(e, UpstreamError::Unavailable { .. }), "{e}");
    let _server = HttpEverything::start_on(&fx, port);
    wait_until(&u, "the HTTP upstream is back", |u| {
        status(u, "remote-everything").state == ServerState::Ready
    })
    .await;
    let echo = u
        .call(
            "remote_everything__echo",
            args(json!({"message": "again"})),
            CALL,
        )
        .await
        .unwrap();
    assert_eq!(text(&echo), "Echo: again");
    u.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn list_changed_refreshes_the_catalog_and_pages_are_followed() {
    let Some(fx) = fixtures("list_changed_refreshes_the_catalog_and_pages_are_followed") else {
        return;
    };
    let u = Upstreams::connect(vec![fx.dynamic()], options()).await;
    let s = status(&u, "dynamic");
    assert_eq!(s.state, ServerState::Ready, "{s:?}");
    // Four tools, two a page: all of them means nextCursor was followed.
    let catalog = u.catalog();
    for name in ["add_tool", "static_first", "static_second", "static_third"] {
        assert!(
            catalog.get(&format!("dynamic__{name}")).is_some(),
            "{name}: {catalog:?}"
        );
    }
    assert_eq!(catalog.tools.len(), 4);
    let before = catalog.version;
    let added = u
        .call(
            "dynamic__add_tool",
            args(json!({"name": "fresh-tool"})),
            CALL,
        )
        .await
        .unwrap();
    assert!(text(&added).contains("added"), "{added:?}");
    wait_until(&u, "the new tool is in the catalog", |u| {
        u.catalog().get("dynamic__fresh_tool").is_some()
    })
    .await;
    let catalog = u.catalog();
    assert!(catalog.version > before);
    assert_eq!(*u.subscribe().borrow(), catalog.version);
    assert_eq!(
        catalog.get("dynamic__fresh_tool").unwrap().tool,
        "fresh-tool"
    );
    assert_eq!(status(&u, "dynamic").tool_count, 5);
    let fresh = u.call("dynamic__fresh_tool", None, CALL).await.unwrap();
    assert_eq!(text(&fresh), "I am fresh-tool");
    shutdown_and_check(&u, &stdio_pids(&u)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dropping_the_last_handle_stops_the_servers() {
    let Some(fx) = fixtures("dropping_the_last_handle_stops_the_servers") else {
        return;
    };
    let u = Upstreams::connect(vec![fx.everything(), fx.time()], options()).await;
    let pgids = stdio_pids(&u);
    assert_eq!(pgids.len(), 2, "{:?}", u.servers());
    let clone = u.clone();
    drop(u);
    assert!(!group_members(pgids[0]).is_empty(), "a clone keeps them");
    drop(clone);
    let deadline = Instant::now() + PATIENCE;
    while pgids.iter().any(|&g| !group_members(g).is_empty()) {
        assert!(Instant::now() < deadline, "servers left after the drop");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reconnecting_server_keeps_its_tools_listed_and_calls_say_why() {
    let Some(fx) = fixtures("a_reconnecting_server_keeps_its_tools_listed_and_calls_say_why")
    else {
        return;
    };
    // A backoff long enough to look at the server while it waits to reconnect; calls
    // do not wait for it (see the next test for the wait).
    let options = UpstreamOptions {
        backoff_initial: Duration::from_secs(3),
        backoff_max: Duration::from_secs(60),
        call_wait: Duration::ZERO,
        ..options()
    };
    let u = Upstreams::connect(vec![fx.memory()], options).await;
    let first = status(&u, "memory");
    assert_eq!(first.state, ServerState::Ready, "{first:?}");
    let tools_before: Vec<String> = u.catalog().tools.iter().map(|t| t.name.clone()).collect();
    assert!(tools_before.contains(&"memory__read_graph".to_string()));

    let pid = kill_and_wait_for_loss(&u, "memory").await;
    let down = status(&u, "memory");
    assert_eq!(down.state, ServerState::Reconnecting, "{down:?}");
    assert_eq!(down.tool_count, tools_before.len(), "{down:?}");
    let tools_now: Vec<String> = u.catalog().tools.iter().map(|t| t.name.clone()).collect();
    assert_eq!(tools_now, tools_before, "the tools stay listed");
    let started = Instant::now();
    let e = u.call("memory__read_graph", None, CALL).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(2), "{e}");
    assert!(matches!(e, UpstreamError::Unavailable { .. }), "{e}");
    let message = e.to_string();
    assert!(
        message.contains("\"memory\" is reconnecting") && message.contains("connection lost"),
        "{message}"
    );
    // A name the server never had is still unknown.
    let e = u.call("memory__nope", None, CALL).await.unwrap_err();
    assert!(
        matches!(
            e,
            UpstreamError::Unavailable { .. } | UpstreamError::UnknownTool { .. }
        ),
        "{e}"
    );

    wait_until(&u, "the server is back", |u| {
        let s = status(u, "memory");
        s.state == ServerState::Ready && s.pid != Some(pid)
    })
    .await;
    let graph = u.call("memory__read_graph", None, CALL).await.unwrap();
    assert!(text(&graph).contains("entities"), "{graph:?}");
    let s = status(&u, "memory");
    shutdown_and_check(&u, &[pid, s.pid.unwrap()]).await;
    assert!(u.catalog().tools.is_empty(), "tools leave at shutdown");
}

/// A call while its server reconnects waits for it (up to `call_wait`), and one whose
/// server will not be back within the bound fails when the bound is over, saying so.
#[tokio::test(flavor = "multi_thread")]
async fn a_call_waits_for_a_reconnecting_server_up_to_the_bound() {
    let Some(fx) = fixtures("a_call_waits_for_a_reconnecting_server_up_to_the_bound") else {
        return;
    };
    let waiting = UpstreamOptions {
        backoff_initial: Duration::from_secs(2),
        backoff_max: Duration::from_secs(60),
        call_wait: Duration::from_secs(20),
        ..options()
    };
    let u = Upstreams::connect(vec![fx.memory()], waiting).await;
    let pid = kill_and_wait_for_loss(&u, "memory").await;
    let started = Instant::now();
    let graph = u.call("memory__read_graph", None, CALL).await.unwrap();
    eprintln!(
        "the call waited {:?} for the reconnection",
        started.elapsed()
    );
    assert!(text(&graph).contains("entities"), "{graph:?}");
    let second = status(&u, "memory").pid.unwrap();
    assert_ne!(second, pid);
    shutdown_and_check(&u, &[pid, second]).await;

    // Back off 30 s, wait at most 1 s: the call gives up at the bound and says why.
    let bounded = UpstreamOptions {
        backoff_initial: Duration::from_secs(30),
        backoff_max: Duration::from_secs(60),
        call_wait: Duration::from_secs(1),
        ..options()
    };
    let u = Upstreams::connect(vec![fx.memory()], bounded).await;
    let pid = kill_and_wait_for_loss(&u, "memory").await;
    let e = u.call("memory__read_graph", None, CALL).await.unwrap_err();
    let message = e.to_string();
    assert!(
        message.contains("\"memory\" is reconnecting (attempt 1, next in")
            && message.contains("retry"),
        "{message}"
    );
    shutdown_and_check(&u, &[pid]).await;
}
