//! The wrapper generator (`codebox::codegen`) against the tool lists of real MCP servers
//! (`tests/fixtures/tools/*.json`, refreshed by `tests/fixtures/tools/refresh.py`) plus a
//! made-up server with hostile names, descriptions and schemas:
//!
//! - every generated `.ts` file passes `deno check` (the rootfs's Deno), a program using
//!   the wrappers type-checks, and one misusing them does not;
//! - every generated Python module imports with `/usr/bin/python3` against a fake
//!   `codebox` module, its signatures are the expected ones, and calls send the right
//!   arguments.
//!
//! Without Deno or Python the test prints `SKIP` and passes, unless `CODEBOX_TEST_STRICT=1`.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use codebox::codegen::generate;
use codebox::upstream::catalog::{Catalog, CatalogServer};
use common::fixtures::{catalog_tool, fixture_catalog};
use serde_json::{json, Value};

/// Tools whose names, descriptions and schemas try to break the generated code.
fn hostile_tools() -> Vec<Value> {
    let evil = "Ends */ here \"\"\" and \\ then \u{2028} and \u{0} and `${x}` '''";
    vec![
        json!({"name": "weird-names", "description": evil, "title": "*/ title \"\"\"",
               "inputSchema": {"type": "object", "required": ["from"], "properties": {
                   "max-results": {"type": "integer", "description": evil},
                   "max_results": {"type": "integer"},
                   "from": {"type": "string"},
                   "class": {"type": ["boolean", "null"]},
                   "__proto__": {"type": "string"},
                   "_args": {"type": "string"},
                   "x\"\"\"*/": {"enum": ["a\"\"\"", "*/", "\\", 1, null]}}}}),
        // Required names in an order of their own, names that become the same Python
        // name, keywords, body names, a nullable one and one no property declares: the
        // positional order is `required`'s, each position sends its own key.
        json!({"name": "swap", "inputSchema": {"type": "object",
                   "required": ["b-a", "a.b", "class", "from", "_args", "undeclared", "b-a"],
                   "properties": {
                       "a.b": {"type": "integer"}, "b-a": {"type": "integer"},
                       "a_b": {"type": "integer"}, "b_a": {"type": "string"},
                       "class": {"type": "string"}, "from": {"type": "string"},
                       "_args": {"type": ["string", "null"]}}}}),
        many_parameters(),
        json!({"name": "index", "inputSchema": {"type": "object", "properties": {}}}),
        json!({"name": "delete", "inputSchema": {"type": "object", "properties": {
                   "anything": true, "nothing": false}}}),
        json!({"name": "class", "inputSchema": true}),
        json!({"name": "recursive", "description": "Schemas with references.",
               "inputSchema": {
                   "type": "object",
                   "properties": {
                       "tree": {"$ref": "#/$defs/Node"},
                       "loop": {"$ref": "#/$defs/A"},
                       "pair": {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
                                "items": false, "minItems": 1},
                       "map": {"type": "object", "additionalProperties": {"$ref": "#/definitions/Leaf"}},
                       "mixed": {"type": "object", "properties": {"a": {"type": "string"}},
                                 "additionalProperties": {"type": "number"}},
                       "choice": {"oneOf": [{"const": {"kind": "x", "n": [1, 2]}}, {"type": "null"}]},
                       "both": {"allOf": [{"$ref": "#/$defs/Node"}, {"type": "object", "required": ["id"]}]},
                       "self": {"$ref": "#"}},
                   "$defs": {
                       "Node": {"type": "object", "properties": {
                           "id": {"type": "string"},
                           "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}}},
                       "A": {"anyOf": [{"$ref": "#/$defs/B"}, {"type": "string"}]},
                       "B": {"allOf": [{"$ref": "#/$defs/A"}]},
                       "Promise": {"type": "string"}},
                   "definitions": {"Leaf": {"type": ["string", "number", "null"]}}},
               "outputSchema": {"anyOf": [{"$ref": "#"}, {"$ref": "#/$defs/Out"}],
                                "$defs": {"Out": {"type": "object", "properties": {
                                    "next": {"$ref": "#"}}}}}}),
    ]
}

/// 300 required parameters (listed in reverse order) and 300 optional ones: past
/// Python's old limit of 255 arguments.
fn many_parameters() -> Value {
    let mut properties = serde_json::Map::new();
    for i in 0..600 {
        properties.insert(format!("p{i:03}"), json!({"type": "integer"}));
    }
    let required: Vec<String> = (0..300).rev().map(|i| format!("p{i:03}")).collect();
    json!({"name": "many", "inputSchema": {"type": "object", "properties": properties,
                                           "required": required}})
}

/// Configured servers whose tools are not known (connecting, or failed): a name that
/// tries to break out of the generated comments and strings, and a Python keyword.
fn servers_without_tools() -> Vec<CatalogServer> {
    vec![
        CatalogServer {
            name: "not \"ready\" */ \n\"\"\" \\ ${x} `y`".into(),
            ident: "not_ready".into(),
        },
        CatalogServer {
            name: "class".into(),
            ident: "class".into(),
        },
    ]
}

fn catalog() -> Catalog {
    let mut catalog = fixture_catalog(1);
    catalog
        .tools
        .extend(hostile_tools().iter().map(|t| catalog_tool("edge case", t)));
    catalog.servers = servers_without_tools();
    catalog
}

/// The generated tree in a fresh temporary directory.
fn generated() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("servers");
    let stats = generate(&catalog(), &out).expect("generate");
    assert_eq!(stats.tools, catalog().tools.len());
    (tmp, out)
}

fn skip_or_panic(test: &str, reason: &str) {
    if common::strict() {
        panic!("{test}: {reason}");
    }
    eprintln!("SKIP {test}: {reason}");
}

fn files_with_extension(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(files_with_extension(&path, ext));
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
    out.sort();
    out
}

fn deno_check(deno: &Path, deno_dir: &Path, files: &[PathBuf]) -> Output {
    Command::new(deno)
        .arg("check")
        .args(files)
        .env("DENO_DIR", deno_dir)
        .env("DENO_NO_UPDATE_CHECK", "1")
        .env("NO_COLOR", "1")
        .output()
        .expect("deno runs")
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn every_tool_gets_a_typescript_and_a_python_wrapper() {
    let (_tmp, out) = generated();
    for tool in catalog().tools {
        let file = out
            .join(&tool.server_ident)
            .join(format!("{}.ts", tool.tool_ident));
        if tool.tool_ident != "index" {
            let ts =
                fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
            assert!(
                ts.contains("callMCPTool<")
                    && ts.contains(&serde_json::to_string(&tool.name).unwrap()),
                "{ts}"
            );
        }
    }
    let index = fs::read_to_string(out.join("filesystem/index.ts")).unwrap();
    assert!(
        index.contains("export { readTextFile } from \"./read_text_file.ts\";\n"),
        "{index}"
    );
    let edge = fs::read_to_string(out.join("edge_case/index.ts")).unwrap();
    assert!(
        edge.contains("export { index } from \"./index_2.ts\";\n"),
        "{edge}"
    );
    let py = fs::read_to_string(out.join("filesystem/__init__.py")).unwrap();
    assert!(py.contains("\ndef read_text_file(path: str, *, head: float | None = None, tail: float | None = None) -> Any:\n")
        || py.contains("\ndef read_text_file(\n    path: str,\n    *,\n"), "{py}");
}

#[test]
fn generated_typescript_type_checks() {
    const TEST: &str = "generated_typescript_type_checks";
    let deno = common::rootfs_dir().join("usr/bin/deno");
    if !deno.exists() {
        return skip_or_panic(TEST, &format!("no deno at {}", deno.display()));
    }
    let (tmp, out) = generated();
    let deno_dir = tmp.path().join("deno");
    let files = files_with_extension(&out, "ts");
    assert!(files.len() > 40, "{files:?}");
    let result = deno_check(&deno, &deno_dir, &files);
    assert!(
        result.status.success(),
        "deno check failed:\n{}",
        text(&result)
    );

    // Code using the wrappers the way an agent would, with the types flowing through.
    let base = out.display();
    let usage = tmp.path().join("usage.ts");
    fs::write(&usage, format!(r#"
import {{ readTextFile, type ReadTextFileInput }} from "{base}/filesystem/index.ts";
import {{ getEnv, getSum }} from "{base}/everything/index.ts";
import {{ convertTime }} from "{base}/time/index.ts";
import {{ createEntities }} from "{base}/memory/index.ts";
import {{ weirdNames, recursive }} from "{base}/edge_case/index.ts";
import notReady, {{ call, server }} from "{base}/not_ready/index.ts";
import keyword from "{base}/class/index.ts";
import filesystem from "{base}/filesystem/index.ts";
export async function use() {{
  const viaDefault: unknown = await notReady.someTool({{ a: 1 }});
  const viaCall: number = await call<number>("some_tool", {{}});
  const name: string = server;
  await keyword.anything();
  // Calls by tool name, as the module of a server whose tools were not known yet
  // offers them: the same code keeps working once they are.
  const dirs: unknown = await filesystem.list_allowed_directories();
  const input: ReadTextFileInput = {{ path: "/a", head: 2 }};
  const text: string = (await readTextFile(input)).content;
  const env: unknown = await getEnv();
  const sum: unknown = await getSum({{ a: 1, b: 2 }});
  const t = await convertTime({{ source_timezone: "UTC", target_timezone: "UTC", time: "12:00" }});
  const dst: boolean = t.target.is_dst;
  const made = await createEntities({{ entities: [{{ name: "n", entityType: "t", observations: [] }}] }});
  const first: string = made.entities[0].name;
  await weirdNames({{ from: "x", "max-results": 3, "x\"\"\"*/": "*/" }});
  await recursive({{ tree: {{ id: "r", children: [{{ children: [] }}] }}, pair: ["a"], map: {{ k: null }} }});
  return [text, env, sum, dst, first, viaDefault, viaCall, name, dirs];
}}
"#)).unwrap();
    let result = deno_check(&deno, &deno_dir, &[usage]);
    assert!(
        result.status.success(),
        "usage does not type-check:\n{}",
        text(&result)
    );

    // Misuse is a type error: the types are real, not `unknown`. One file per misuse,
    // checked together: each file must be named in an error.
    let misuses = [
        "await readTextFile({ path: 1 });",
        "const n: number = (await readTextFile({ path: \"a\" })).content;",
        "await convertTime({ time: \"12:00\" });",
        "await weirdNames({ from: \"x\", \"x\\\"\\\"\\\"*/\": \"b\" });",
        "const id: number = (await recursive()).next;",
    ];
    let mut bad_files = Vec::new();
    for (i, misuse) in misuses.iter().enumerate() {
        let bad = tmp.path().join(format!("misuse{i}.ts"));
        fs::write(
            &bad,
            format!(
                "import {{ readTextFile }} from \"{base}/filesystem/index.ts\";\n\
             import {{ convertTime }} from \"{base}/time/index.ts\";\n\
             import {{ weirdNames, recursive }} from \"{base}/edge_case/index.ts\";\n\
             export async function misuse() {{ {misuse} }}\n"
            ),
        )
        .unwrap();
        bad_files.push(bad);
    }
    let result = deno_check(&deno, &deno_dir, &bad_files);
    assert!(!result.status.success(), "misuse type-checked");
    let report = text(&result);
    for (i, misuse) in misuses.iter().enumerate() {
        assert!(
            report.contains(&format!("misuse{i}.ts:")),
            "no error for {misuse}:\n{report}"
        );
    }
}

/// The Python side: a fake `codebox` records calls; the script checks imports,
/// signatures, evaluable type hints, docstrings and the arguments sent.
const PYTHON_CHECK: &str = r#"
import importlib, inspect, sys, typing
import codebox
import servers

assert servers.__all__ == ["class_", "edge_case", "everything", "filesystem", "memory", "not_ready", "time"], servers.__all__
count = 0
for module_name in servers.__all__:
    module = importlib.import_module("servers." + module_name)
    assert module.__doc__, module_name
    for name in module.__all__:
        fn = getattr(module, name)
        sig = inspect.signature(fn)
        # Required parameters (no default) by position or name, then optional ones by name.
        kinds = [(p.default is p.empty, p.kind) for p in sig.parameters.values()]
        assert kinds == sorted(kinds, key=lambda k: not k[0]), (name, sig)
        assert all(k is (inspect.Parameter.POSITIONAL_OR_KEYWORD if req else inspect.Parameter.KEYWORD_ONLY)
                   for req, k in kinds), (name, sig)
        typing.get_type_hints(fn)
        assert "Calls the tool" in fn.__doc__, name
        count += 1
assert count == int(sys.argv[1]), count

from servers.filesystem import read_text_file, list_allowed_directories
from servers.time import convert_time
from servers.everything import get_annotated_message, get_sum
from servers.memory import read_graph
from servers import edge_case

def sig(fn):
    s = inspect.signature(fn)
    params = []
    for n, p in s.parameters.items():
        if p.kind is p.KEYWORD_ONLY and "*" not in params:
            params.append("*")
        params.append(f"{n}: {p.annotation}" + (" = None" if p.default is None else ""))
    return "(" + ", ".join(params) + f") -> {s.return_annotation}"

expected = {
    read_text_file: "(path: str, *, head: float | None = None, tail: float | None = None) -> Any",
    convert_time: "(source_timezone: str, time: str, target_timezone: str) -> Any",
    get_sum: "(a: float, b: float) -> Any",
    read_graph: "() -> Any",
    # (annotations are unparsed from the AST: string literals come back in single quotes)
    get_annotated_message: "(messageType: Literal['error', 'success', 'debug'], *, includeImage: bool | None = None) -> Any",
    edge_case.weird_names: "(from_: str, *, __proto__: str | None = None, _args_2: str | None = None, "
        "class_: bool | None = None, max_results_2: int | None = None, max_results: int | None = None, "
        "x_____: Literal['a\"\"\"', '*/', '\\\\', 1] | None = None) -> Any",
    edge_case.swap: "(b_a_2: int, a_b_2: int, class_: str, from_: str, _args_2: str | None, undeclared: Any, "
        "*, a_b: int | None = None, b_a: str | None = None) -> Any",
}
for fn, want in expected.items():
    assert sig(fn) == want, (fn.__name__, sig(fn), want)

def last_call(fn, *args, **kwargs):
    codebox.calls.clear()
    result = fn(*args, **kwargs)
    assert result == "result", result
    assert len(codebox.calls) == 1, codebox.calls
    return codebox.calls[0]

assert last_call(read_text_file, path="/a", head=3) == ("filesystem__read_text_file", {"path": "/a", "head": 3})
assert last_call(read_text_file, path="/a", head=None, tail=0) == ("filesystem__read_text_file", {"path": "/a", "tail": 0})
assert last_call(list_allowed_directories) == ("filesystem__list_allowed_directories", {})
assert last_call(get_annotated_message, messageType="error") == ("everything__get_annotated_message", {"messageType": "error"})
assert last_call(edge_case.weird_names, from_="f", max_results_2=5, max_results=6, class_=False, x_____="*/") == (
    "edge_case__weird_names", {"from": "f", "max-results": 5, "max_results": 6, "class": False, 'x"""*/': "*/"})
assert last_call(edge_case.class_) == ("edge_case__class", {})
assert last_call(edge_case.index) == ("edge_case__index", {})
assert last_call(edge_case.delete, anything=[1]) == ("edge_case__delete", {"anything": [1]})
assert 'Ends */ here """ and \\ then' in edge_case.weird_names.__doc__, edge_case.weird_names.__doc__
# Required arguments by position or by name; optional ones only by name.
assert last_call(read_text_file, "/a") == ("filesystem__read_text_file", {"path": "/a"})
assert last_call(read_text_file, "/a", tail=2) == ("filesystem__read_text_file", {"path": "/a", "tail": 2})
assert last_call(convert_time, "UTC", "12:00", "Asia/Tokyo") == ("time__convert_time",
    {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"})
assert last_call(convert_time, "UTC", target_timezone="Asia/Tokyo", time="12:00")[1]["time"] == "12:00"
def type_error(call):
    try:
        call()
    except TypeError as e:
        return str(e)
    raise AssertionError("no TypeError")
assert type_error(lambda: read_text_file("/a", 3)) == "read_text_file() takes 1 positional argument but 2 were given"
assert type_error(lambda: read_text_file()) == "read_text_file() missing 1 required positional argument: 'path'"
assert type_error(lambda: convert_time("UTC", time="1")) == "convert_time() missing 1 required positional argument: 'target_timezone'"
assert type_error(lambda: read_text_file("/a", path="/b")) == "read_text_file() got multiple values for argument 'path'"
assert "unexpected keyword argument 'nope'" in type_error(lambda: read_text_file("/a", nope=1))
# Names that collide, keywords, body names: each position sends its own key.
assert last_call(edge_case.swap, 1, 2, "c", "f", None, [6], b_a="s") == ("edge_case__swap",
    {"b-a": 1, "a.b": 2, "class": "c", "from": "f", "_args": None, "undeclared": [6], "b_a": "s"})
assert last_call(edge_case.swap, undeclared=6, _args_2="x", from_="f", class_="c", a_b_2=2, b_a_2=1)[1] == {
    "b-a": 1, "a.b": 2, "class": "c", "from": "f", "_args": "x", "undeclared": 6}
assert type_error(lambda: edge_case.swap(1, 2, "c", "f", None)) == "swap() missing 1 required positional argument: 'undeclared'"
# 300 required parameters by position in the order of `required` (p299 first), 300 by name.
many = list(inspect.signature(edge_case.many).parameters)
assert many[:3] == ["p299", "p298", "p297"] and many[299] == "p000" and many[300] == "p300" and len(many) == 600, many[:5]
sent = last_call(edge_case.many, *range(300), p599=-1)[1]
assert sent == {**{"p%03d" % (299 - i): i for i in range(300)}, "p599": -1}, sent
assert "missing 1 required positional argument: 'p000'" in type_error(lambda: edge_case.many(*range(299)))

# Servers whose tools were not known: any name is a function that calls by name.
from servers.not_ready import some_tool, aio as not_ready_aio
assert last_call(some_tool, a=1) == ("not_ready__some_tool", {"a": 1})
import asyncio
codebox.calls.clear()
async def via_aio():
    return await not_ready_aio.other(b=2)
codebox.to_thread = lambda f, /, *a, **k: asyncio.sleep(0, f(*a, **k))
assert asyncio.run(via_aio()) == "result" and codebox.calls == [("not_ready__other", {"b": 2})], codebox.calls
# The coroutine forms take the same arguments, and say so.
codebox.calls.clear()
assert asyncio.run(edge_case.aio.swap(1, 2, "c", "f", None, 6)) == "result", codebox.calls
assert codebox.calls == [("edge_case__swap", {"b-a": 1, "a.b": 2, "class": "c", "from": "f", "_args": None, "undeclared": 6})], codebox.calls
codebox.calls.clear()
from servers.filesystem import aio as fs_aio
assert asyncio.run(fs_aio.read_text_file("/a", head=1)) == "result" and codebox.calls == [("filesystem__read_text_file", {"path": "/a", "head": 1})]
assert str(inspect.signature(fs_aio.read_text_file)) == str(inspect.signature(read_text_file))
assert "missing 1 required positional argument: 'path'" in type_error(lambda: asyncio.run(fs_aio.read_text_file()))
# A server whose tools were not known cannot know their parameters' order.
assert "keyword arguments only" in type_error(lambda: some_tool(1)), type_error(lambda: some_tool(1))
keyword = importlib.import_module("servers.class_")
assert last_call(keyword.anything) == ("class__anything", {})
assert "not connected" not in keyword.__doc__ and "were not known" in keyword.__doc__, keyword.__doc__
try:
    from servers.not_ready import __wrapped__
    raise AssertionError("dunder names are not tools")
except ImportError:
    pass
print("python ok")
"#;

const FAKE_CODEBOX: &str = r#"
calls = []

def call_tool(name, args=None):
    calls.append((name, args))
    return "result"
"#;

#[test]
fn generated_python_imports_and_calls() {
    const TEST: &str = "generated_python_imports_and_calls";
    let python = Path::new("/usr/bin/python3");
    if !python.exists() {
        return skip_or_panic(TEST, "no /usr/bin/python3");
    }
    let (tmp, out) = generated();
    let path = tmp.path().join("pypath");
    fs::create_dir(&path).unwrap();
    fs::write(path.join("codebox.py"), FAKE_CODEBOX).unwrap();
    std::os::unix::fs::symlink(&out, path.join("servers")).unwrap();
    let result = Command::new(python)
        .args(["-B", "-I", "-c"])
        .arg(format!(
            "import sys; sys.path.insert(0, {:?})\n{PYTHON_CHECK}",
            path.display().to_string()
        ))
        .arg(catalog().tools.len().to_string())
        .output()
        .expect("python runs");
    assert!(
        result.status.success() && text(&result).contains("python ok"),
        "{}",
        text(&result)
    );
}

/// Servers configured with hostile names whose tools are not known yet (connecting, or
/// failed): each gets a module that calls by name. Their names reach the generated text
/// (doc strings, comments, a literal): nothing may break out, and the modules must work.
fn unknown_servers() -> Catalog {
    let names = [
        "evil\"\"\"\nimport os\n#",
        "a*/b\u{2028}c // d\u{2029}",
        "\u{0}nul\\x\\u{41}",
        "émoji 🎉 '''",
        "${x}`${y}`\r\n",
        "class",
    ];
    let idents = codebox::upstream::naming::server_idents(&names);
    Catalog {
        version: 1,
        tools: Vec::new(),
        servers: names
            .iter()
            .zip(idents)
            .map(|(name, ident)| codebox::upstream::catalog::CatalogServer {
                name: name.to_string(),
                ident,
            })
            .collect(),
    }
}

const PYTHON_UNKNOWN_CHECK: &str = r#"
import asyncio, importlib, sys
import codebox
import servers

assert len(servers.__all__) == int(sys.argv[1]), servers.__all__
for module_name in servers.__all__:
    module = importlib.import_module("servers." + module_name)
    assert "generated by codebox" in module.__doc__, module.__doc__
    prefix = module._PREFIX
    assert prefix.endswith("__"), prefix
    codebox.calls.clear()
    assert module.get_thing(a=1) == "result"
    assert codebox.calls == [(prefix + "get_thing", {"a": 1})], codebox.calls
    exec("from servers.%s import other_thing" % module_name)
    codebox.calls.clear()
    assert asyncio.run(module.aio.get_thing(b=2)) == "result"
    assert codebox.calls == [(prefix + "get_thing", {"b": 2})], codebox.calls
    try:
        module.__missing__
        raise AssertionError("dunder names are not tools")
    except AttributeError:
        pass
assert not hasattr(sys.modules.get("os"), "evil_was_here")
print("python ok")
"#;

const FAKE_CODEBOX_ASYNC: &str = r#"
import asyncio
calls = []

def call_tool(name, args=None):
    calls.append((name, args))
    return "result"

async def to_thread(fn, *args, **kwargs):
    return fn(*args, **kwargs)
"#;

#[test]
fn servers_without_known_tools_get_modules_whatever_their_names() {
    const TEST: &str = "servers_without_known_tools_get_modules_whatever_their_names";
    let catalog = unknown_servers();
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("servers");
    generate(&catalog, &out).expect("generate");
    let python = Path::new("/usr/bin/python3");
    if python.exists() {
        let path = tmp.path().join("pypath");
        fs::create_dir(&path).unwrap();
        fs::write(path.join("codebox.py"), FAKE_CODEBOX_ASYNC).unwrap();
        std::os::unix::fs::symlink(&out, path.join("servers")).unwrap();
        let result = Command::new(python)
            .args(["-B", "-I", "-c"])
            .arg(format!(
                "import sys; sys.path.insert(0, {:?})\n{PYTHON_UNKNOWN_CHECK}",
                path.display().to_string()
            ))
            .arg(catalog.servers.len().to_string())
            .output()
            .expect("python runs");
        assert!(
            result.status.success() && text(&result).contains("python ok"),
            "{}",
            text(&result)
        );
    } else {
        skip_or_panic(TEST, "no /usr/bin/python3");
    }
    let deno = common::rootfs_dir().join("usr/bin/deno");
    if !deno.exists() {
        return skip_or_panic(TEST, &format!("no deno at {}", deno.display()));
    }
    let base = out.display();
    let mut usage = String::new();
    for (i, server) in catalog.servers.iter().enumerate() {
        usage.push_str(&format!(
            "import s{i}, {{ call as call{i}, server as name{i} }} from \"{base}/{}/index.ts\";\n",
            server.ident
        ));
    }
    usage.push_str("export async function use() {\n");
    for (i, server) in catalog.servers.iter().enumerate() {
        usage.push_str(&format!(
            "  const a{i}: unknown = await s{i}.getThing({{ a: 1 }});\n  \
             const b{i}: number = await call{i}<number>(\"get_thing\");\n  \
             const n{i}: string = name{i};\n  \
             if (n{i} !== {}) throw new Error(\"name\");\n  \
             console.log(a{i}, b{i});\n",
            serde_json::to_string(&server.name).unwrap()
        ));
    }
    usage.push_str("}\n");
    let file = tmp.path().join("usage.ts");
    fs::write(&file, usage).unwrap();
    let mut files = files_with_extension(&out, "ts");
    files.push(file);
    let result = deno_check(&deno, &tmp.path().join("deno"), &files);
    assert!(
        result.status.success(),
        "deno check failed:\n{}",
        text(&result)
    );
}
