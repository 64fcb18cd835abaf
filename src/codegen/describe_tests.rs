use std::fs;

use serde_json::{json, Value};

use super::*;
use crate::codegen::{generate, tool_names};
use crate::upstream::catalog::Catalog;

fn tool(
    server: &str,
    name: &str,
    input_schema: Value,
    output_schema: Option<Value>,
) -> CatalogTool {
    let ident = |s: &str| s.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
    CatalogTool {
        name: format!("{}__{}", ident(server), ident(name)),
        server: server.into(),
        tool: name.into(),
        server_ident: ident(server),
        tool_ident: ident(name),
        title: None,
        description: Some("Read a file.".into()),
        input_schema,
        output_schema,
        annotations: None,
    }
}

fn read_text_file() -> CatalogTool {
    tool(
        "filesystem",
        "read_text_file",
        json!({"type": "object", "required": ["path"], "properties": {
            "path": {"type": "string", "description": "Where the file is"},
            "head": {"type": "number"}}}),
        Some(json!({"type": "object", "required": ["content"],
                    "properties": {"content": {"type": "string"}}})),
    )
}

fn names_of(tools: &[CatalogTool], name: &str) -> ToolNames {
    let catalog = Catalog {
        version: 1,
        tools: tools.to_vec(),
        ..Default::default()
    };
    tool_names(&catalog).remove(name).expect("named")
}

#[test]
fn signatures_of_a_simple_tool() {
    let t = read_text_file();
    let n = names_of(std::slice::from_ref(&t), "filesystem__read_text_file");
    assert_eq!(
        ts_signature_line(&t, &n),
        "function readTextFile(input: { head?: number; path: string }): \
         Promise<{ content: string }>"
    );
    assert_eq!(
        py_def_line(&t, &n),
        "def read_text_file(path: str, *, head: float | None = None) -> Any"
    );
    let decl = ts_declaration(&t, &n);
    assert!(
        decl.starts_with(
            "/** The arguments of `readTextFile`. */\nexport interface ReadTextFileInput {\n"
        ),
        "{decl}"
    );
    assert!(
        decl.contains("  /** Where the file is */\n  path: string;\n"),
        "{decl}"
    );
    assert!(
        decl.contains("export interface ReadTextFileOutput {"),
        "{decl}"
    );
    assert!(
        decl.ends_with(
            "\nexport function readTextFile(input: ReadTextFileInput): \
             Promise<ReadTextFileOutput>;\n"
        ),
        "{decl}"
    );
    assert!(
        !decl.contains("callMCPTool") && !decl.contains("return"),
        "{decl}"
    );
}

#[test]
fn examples_use_required_parameters_with_placeholders() {
    let t = read_text_file();
    let n = names_of(std::slice::from_ref(&t), "filesystem__read_text_file");
    assert_eq!(
        example_python(&t, &n),
        "from servers.filesystem import read_text_file\nread_text_file(\"...\")"
    );
    assert_eq!(
        example_typescript(&t, &n),
        "import { readTextFile } from \"/servers/filesystem/index.ts\";\n\
         await readTextFile({ path: \"...\" });"
    );

    let schema = json!({
        "type": "object",
        "required": ["max-results", "n", "flag", "list", "obj", "mode", "node", "either", "any", "from"],
        "properties": {
            "max-results": {"type": "integer"},
            "n": {"type": ["null", "number"]},
            "flag": {"type": "boolean"},
            "list": {"type": "array", "items": {"type": "string"}},
            "obj": {"properties": {"a": {"type": "string"}}},
            "mode": {"enum": ["fast", "slow"]},
            "node": {"$ref": "#/$defs/Node"},
            "either": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "any": {},
            "from": {"type": "string"},
            "optional": {"type": "string"}},
        "$defs": {"Node": {"type": "object"}}});
    let t = tool("my server", "do-it", schema, None);
    let n = names_of(std::slice::from_ref(&t), "my_server__do_it");
    assert_eq!(
        example_python(&t, &n),
        "from servers.my_server import do_it\n\
         do_it(max_results=0, n=0, flag=False, list=[], obj={}, mode=\"fast\", node={}, \
         either=\"...\", any=None, from_=\"...\")"
    );
    assert_eq!(
        example_typescript(&t, &n),
        "import { doIt } from \"/servers/my_server/index.ts\";\n\
         await doIt({ \"max-results\": 0, n: 0, flag: false, list: [], obj: {}, \
         mode: \"fast\", node: {}, either: \"...\", any: null, from: \"...\" });"
    );
}

#[test]
fn optional_inputs_and_long_types() {
    let long: serde_json::Map<String, Value> = (0..30)
        .map(|i| (format!("field{i}"), json!({"type": "string"})))
        .collect();
    let t = tool(
        "s",
        "big",
        json!({"type": "object", "properties": long.clone()}),
        Some(json!({"type": "object", "properties": long})),
    );
    let n = names_of(std::slice::from_ref(&t), "s__big");
    assert_eq!(
        ts_signature_line(&t, &n),
        "function big(input?: BigInput): Promise<BigOutput>"
    );
    assert!(ts_declaration(&t, &n)
        .ends_with("export function big(input?: BigInput): Promise<BigOutput>;\n"));
    assert_eq!(
        example_typescript(&t, &n).lines().nth(1),
        Some("await big({});")
    );
    assert_eq!(example_python(&t, &n).lines().nth(1), Some("big()"));

    let t = tool("s", "none", json!({"type": "object"}), None);
    let n = names_of(std::slice::from_ref(&t), "s__none");
    assert_eq!(
        ts_signature_line(&t, &n),
        "function none(input?: { [key: string]: unknown }): Promise<unknown>"
    );
    assert_eq!(py_def_line(&t, &n), "def none() -> Any");
}

#[test]
fn nested_types_stay_on_one_line() {
    let t = tool(
        "s",
        "nested",
        json!({"type": "object", "required": ["items"], "properties": {
            "items": {"type": "array", "items": {"type": "object", "required": ["id"],
                "properties": {"id": {"type": "string", "description": "x\ny"},
                               "tags": {"type": "array", "items": {"type": "string"}}}}},
            "tree": {"$ref": "#/$defs/Tree"},
            "again": {"$ref": "#"}},
            "$defs": {"Tree": {"type": "object", "properties": {"kids": {"type": "array",
                "items": {"$ref": "#/$defs/Tree"}}}}}}),
        None,
    );
    let n = names_of(std::slice::from_ref(&t), "s__nested");
    assert_eq!(
        ts_signature_line(&t, &n),
        "function nested(input: { again?: NestedInput; items: { id: string; tags?: string[] }[]; \
         tree?: Tree }): Promise<unknown>"
    );
}

/// The names match the generated tree, collisions and reserved names included.
#[test]
fn names_match_the_generated_tree() {
    let schema = json!({"type": "object"});
    let tools = vec![
        tool("fs", "read-file", schema.clone(), None),
        tool("fs", "readFile", schema.clone(), None),
        tool("fs", "index", schema.clone(), None),
        tool("fs", "_codebox", schema.clone(), None),
        tool("class", "delete", schema.clone(), None),
    ];
    let catalog = Catalog {
        version: 1,
        tools: tools.clone(),
        ..Default::default()
    };
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("servers");
    generate(&catalog, &out).unwrap();
    let names = tool_names(&catalog);
    assert_eq!(names.len(), tools.len());
    let functions: Vec<&str> = {
        let mut f: Vec<&str> = names.values().map(|n| n.ts_function.as_str()).collect();
        f.sort();
        f
    };
    assert_eq!(
        functions,
        ["codebox", "delete_", "index", "readFile", "readFile2"]
    );
    for t in &tools {
        let n = &names[&t.name];
        let module = fs::read_to_string(out.join(&n.ts_dir).join(format!("{}.ts", n.ts_stem)))
            .unwrap_or_else(|e| panic!("{}: {e}", t.name));
        assert!(
            module.contains(&format!("export async function {}(", n.ts_function)),
            "{module}"
        );
        assert!(
            module.contains(&format!("{}Input", n.ts_type_base)),
            "{module}"
        );
        let index = fs::read_to_string(out.join(&n.ts_dir).join("index.ts")).unwrap();
        assert!(
            index.contains(&format!("export {{ {} }}", n.ts_function)),
            "{index}"
        );
        let py = fs::read_to_string(out.join(&n.py_module).join("__init__.py")).unwrap();
        assert!(py.contains(&format!("\ndef {}(", n.py_function)), "{py}");
        assert!(example_python(t, n).starts_with(&format!(
            "from servers.{} import {}\n",
            n.py_module, n.py_function
        )));
    }
    assert_eq!(names["class__delete"].py_module, "class_");
    assert_eq!(names["class__delete"].ts_dir, "class");
    assert_eq!(names["fs__index"].ts_stem, "index_2");
    assert_eq!(names["fs___codebox"].py_function, "_codebox_2");
}
