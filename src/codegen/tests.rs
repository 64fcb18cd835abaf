use std::os::unix::fs::PermissionsExt;

use serde_json::json;

use super::*;

fn tool(server: &str, name: &str) -> CatalogTool {
    let ident = |s: &str| s.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    CatalogTool {
        name: format!("{}__{}", ident(server), ident(name)),
        server: server.into(),
        tool: name.into(),
        server_ident: ident(server),
        tool_ident: ident(name),
        title: None,
        description: Some(format!("The {name} tool.")),
        input_schema: json!({"type": "object", "properties": {"path": {"type": "string"}},
                             "required": ["path"]}),
        output_schema: None,
        annotations: None,
    }
}

fn catalog(tools: Vec<CatalogTool>) -> Catalog {
    Catalog {
        version: 1,
        tools,
        ..Default::default()
    }
}

fn listing(dir: &Path) -> Vec<(String, u32)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
            let rel = path
                .strip_prefix(dir)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.push((rel, mode));
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn writes_the_layout_with_readable_modes() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("servers");
    let cat = catalog(vec![
        tool("filesystem", "read_text_file"),
        tool("weather", "get-weather"),
    ]);
    let stats = generate(&cat, &out).unwrap();
    let files = listing(&out);
    let expected = [
        ("__init__.py", 0o644),
        ("client.ts", 0o644),
        ("filesystem", 0o755),
        ("filesystem/__init__.py", 0o644),
        ("filesystem/index.ts", 0o644),
        ("filesystem/read_text_file.ts", 0o644),
        ("weather", 0o755),
        ("weather/__init__.py", 0o644),
        ("weather/get_weather.ts", 0o644),
        ("weather/index.ts", 0o644),
    ];
    let expected: Vec<(String, u32)> = expected.iter().map(|(p, m)| (p.to_string(), *m)).collect();
    assert_eq!(files, expected);
    assert_eq!(
        fs::metadata(&out).unwrap().permissions().mode() & 0o777,
        0o755
    );
    assert_eq!(stats.servers, 2);
    assert_eq!(stats.tools, 2);
    assert_eq!(stats.files, 8);
    assert_eq!(
        fs::read_to_string(out.join("client.ts")).unwrap(),
        CLIENT_TS
    );
    let weather = fs::read_to_string(out.join("weather/get_weather.ts")).unwrap();
    assert!(weather.contains("export async function getWeather(input: GetWeatherInput)"));
    assert!(weather.contains("callMCPTool<unknown>(\"weather__get_weather\", "));
    let index = fs::read_to_string(out.join("weather/index.ts")).unwrap();
    assert!(index.contains("export { getWeather } from \"./get_weather.ts\";\n"));
    let py = fs::read_to_string(out.join("weather/__init__.py")).unwrap();
    assert!(py.contains("def get_weather(path: str) -> Any:\n"));
}

#[test]
fn output_must_be_empty_or_missing() {
    let tmp = tempfile::tempdir().unwrap();
    fs::write(tmp.path().join("stale"), "x").unwrap();
    let err = generate(&catalog(vec![]), tmp.path()).unwrap_err();
    assert!(matches!(err, Error::NotEmpty { .. }), "{err}");

    let empty = tempfile::tempdir().unwrap();
    let stats = generate(&catalog(vec![]), empty.path()).unwrap();
    assert_eq!(stats.files, 2, "client.ts and __init__.py");
    let init = fs::read_to_string(empty.path().join("__init__.py")).unwrap();
    assert!(init.contains("__all__ = [\n]\n"));

    let file = tmp.path().join("stale");
    let err = generate(&catalog(vec![]), &file).unwrap_err();
    assert!(matches!(err, Error::ReadOutput { .. }), "{err}");
}

#[test]
fn identifiers_that_could_escape_the_tree_are_refused() {
    for (server_ident, tool_ident) in [
        ("..", "x"),
        ("a", "../x"),
        ("a/b", "x"),
        ("", "x"),
        ("a", "x.ts"),
    ] {
        let mut t = tool("a", "x");
        t.server_ident = server_ident.into();
        t.tool_ident = tool_ident.into();
        let tmp = tempfile::tempdir().unwrap();
        let err = generate(&catalog(vec![t]), tmp.path()).unwrap_err();
        assert!(matches!(err, Error::InvalidIdent { .. }), "{err}");
        assert_eq!(
            fs::read_dir(tmp.path()).unwrap().count(),
            0,
            "nothing written"
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let err = generate(&catalog(vec![tool("a", "x"), tool("a", "x")]), tmp.path()).unwrap_err();
    assert!(matches!(err, Error::Duplicate { .. }), "{err}");
}

#[test]
fn name_collisions_are_resolved() {
    let tmp = tempfile::tempdir().unwrap();
    let cat = catalog(vec![
        tool("class", "index"),
        tool("class", "get_x"),
        tool("class", "getX"),
        tool("class", "delete"),
        tool("class", "call_m_c_p_tool"),
        tool("class", "Any"),
        tool("class", "import"),
        tool("class_", "x"),
    ]);
    generate(&cat, tmp.path()).unwrap();
    let dir = tmp.path().join("class");
    let index = fs::read_to_string(dir.join("index.ts")).unwrap();
    assert!(
        index.contains("export { index } from \"./index_2.ts\";"),
        "{index}"
    );
    assert!(
        index.contains("export { getX } from \"./getX.ts\";"),
        "{index}"
    );
    assert!(
        index.contains("export { getX2 } from \"./get_x.ts\";"),
        "{index}"
    );
    assert!(
        index.contains("export type { GetX2Input } from \"./get_x.ts\";"),
        "{index}"
    );
    assert!(
        index.contains("export { delete_ } from \"./delete.ts\";"),
        "{index}"
    );
    assert!(index.contains("export { callMCPTool2 } from"), "{index}");
    // The Python package of server `class` cannot be `class`, nor `class_` (another server).
    let py = fs::read_to_string(tmp.path().join("class__2/__init__.py")).unwrap();
    for def in [
        "def index(",
        "def get_x(",
        "def getX(",
        "def delete(",
        "def Any_2(",
        "def import_(",
    ] {
        assert!(py.contains(def), "{def} in {py}");
    }
    assert!(tmp.path().join("class_/__init__.py").exists());
    assert!(tmp.path().join("class_/x.ts").exists());
    let init = fs::read_to_string(tmp.path().join("__init__.py")).unwrap();
    assert!(
        init.contains("    \"class__2\",\n    \"class_\",\n"),
        "{init}"
    );
}

#[test]
fn generation_is_deterministic() {
    let mut tools = vec![tool("b", "two"), tool("a", "one"), tool("b", "one")];
    tools[0].input_schema = json!({"properties": {"z": {"$ref": "#/$defs/Z"}, "y": {"$ref": "#/$defs/Y"}},
                                   "$defs": {"Z": {"type": "string"}, "Y": {"type": "number"}}});
    let first = render(&catalog(tools.clone())).unwrap().0;
    tools.reverse();
    let second = render(&catalog(tools)).unwrap().0;
    assert_eq!(first, second);
}
