use serde_json::{json, Value};

use super::*;

fn tool(input_schema: Value, description: &str) -> CatalogTool {
    CatalogTool {
        name: "srv__do_it".into(),
        server: "srv".into(),
        tool: "do-it".into(),
        server_ident: "srv".into(),
        tool_ident: "do_it".into(),
        title: None,
        description: Some(description.into()),
        input_schema,
        output_schema: None,
        annotations: None,
    }
}

fn hint_of(schema: Value) -> String {
    let schema = json!({"properties": {"x": schema}, "required": ["x"],
                        "$defs": {"S": {"type": "string"}, "Loop": {"$ref": "#/$defs/Loop"}}});
    params(&schema)[0].hint.join(" | ")
}

#[test]
fn type_hints() {
    assert_eq!(hint_of(json!({"type": "string"})), "str");
    assert_eq!(hint_of(json!({"type": "integer"})), "int");
    assert_eq!(hint_of(json!({"type": "number"})), "float");
    assert_eq!(hint_of(json!({"type": "boolean"})), "bool");
    assert_eq!(hint_of(json!({"type": ["null", "string"]})), "str | None");
    assert_eq!(
        hint_of(json!({"type": "array", "items": {"type": "integer"}})),
        "list[int]"
    );
    assert_eq!(
        hint_of(json!({"type": "array", "prefixItems": [{}]})),
        "list[Any]"
    );
    assert_eq!(
        hint_of(json!({"type": "object", "properties": {}})),
        "dict[str, Any]"
    );
    assert_eq!(
        hint_of(json!({"type": "object", "additionalProperties": {"type": ["number", "null"]}})),
        "dict[str, float | None]"
    );
    assert_eq!(
        hint_of(json!({"enum": ["a | None", 2, true, null]})),
        "Literal[\"a | None\", 2, True] | None"
    );
    assert_eq!(hint_of(json!({"enum": [1.5]})), "Any");
    assert_eq!(hint_of(json!({"const": "x\"y"})), "Literal[\"x\\\"y\"]");
    assert_eq!(
        hint_of(json!({"anyOf": [{"type": "string"}, {"type": "null"}, {"type": "string"}]})),
        "str | None"
    );
    assert_eq!(hint_of(json!({"oneOf": [{"type": "string"}, {}]})), "Any");
    assert_eq!(hint_of(json!({"allOf": [{"type": "string"}]})), "str");
    assert_eq!(
        hint_of(json!({"allOf": [{"type": "string"}, {"minLength": 1}]})),
        "Any"
    );
    assert_eq!(hint_of(json!({"$ref": "#/$defs/S"})), "str");
    assert_eq!(hint_of(json!({"$ref": "#/$defs/Loop"})), "Any");
    assert_eq!(hint_of(json!({"$ref": "#/$defs/Nope"})), "Any");
    assert_eq!(hint_of(json!({})), "Any");
    assert_eq!(hint_of(json!(false)), "Any");
}

#[test]
fn parameters_are_sanitised_and_ordered() {
    let schema = json!({
        "type": "object",
        "properties": {
            "max-results": {"type": "integer"},
            "max_results": {"type": "integer"},
            "from": {"type": "string", "description": "Start"},
            "class": {"type": "string"},
            "_args": {"type": "string"},
            "_codebox": {},
            "__proto__": {"type": "string"},
        },
        "required": ["from", "undeclared"],
    });
    let ps = params(&schema);
    let got: Vec<(&str, &str, bool)> = ps
        .iter()
        .map(|p| (p.name.as_str(), p.key.as_str(), p.required))
        .collect();
    assert_eq!(
        got,
        [
            ("from_", "from", true),
            ("undeclared", "undeclared", true),
            ("__proto__", "__proto__", false),
            ("_args_2", "_args", false),
            ("_codebox_2", "_codebox", false),
            ("class_", "class", false),
            ("max_results_2", "max-results", false),
            ("max_results", "max_results", false),
        ]
    );
    assert_eq!(ps[0].doc, "Start (sent as \"from\")");
    assert_eq!(
        signature("f", &ps),
        "def f(\n    from_: str,\n    undeclared: Any,\n    *,\n    __proto__: str | None = None,\n    \
         _args_2: str | None = None,\n    _codebox_2: Any = None,\n    class_: str | None = None,\n    \
         max_results_2: int | None = None,\n    max_results: int | None = None,\n) -> Any:"
    );
}

#[test]
fn signatures() {
    assert_eq!(signature("f", &[]), "def f() -> Any:");
    let ps = params(
        &json!({"properties": {"a": {"type": ["string", "null"]}, "b": {"type": "string"}},
                            "required": ["b"]}),
    );
    assert_eq!(
        signature("f", &ps),
        "def f(b: str, *, a: str | None = None) -> Any:"
    );
    let ps = params(&json!({"properties": {"a": {"type": "string"}}, "required": ["a"]}));
    assert_eq!(signature("f", &ps), "def f(a: str) -> Any:");
    let ps = params(&json!({"properties": {"a": {"type": "string"}}}));
    assert_eq!(
        signature("f", &ps),
        "def f(*, a: str | None = None) -> Any:"
    );
}

/// Required parameters take the order of `required`, whatever their names become; the
/// names themselves do not depend on that order.
#[test]
fn required_parameters_in_the_order_of_required() {
    let schema = |required: Value| {
        json!({"properties": {
            "a-b": {"type": "string"}, "a.b": {"type": "integer"}, "a_b": {"type": "boolean"},
            "zeta": {"type": ["string", "null"]}, "opt": {}, "class": {"type": "string"}},
            "required": required})
    };
    let order = |ps: &[Param]| -> Vec<(String, String, bool)> {
        ps.iter()
            .map(|p| (p.name.clone(), p.key.clone(), p.required))
            .collect()
    };
    let ps = params(&schema(json!([
        "zeta", "a.b", "class", "a-b", "missing", "zeta", 3
    ])));
    let row = |n: &str, k: &str, r: bool| (n.to_string(), k.to_string(), r);
    assert_eq!(
        order(&ps),
        [
            row("zeta", "zeta", true),
            row("a_b_3", "a.b", true),
            row("class_", "class", true),
            row("a_b_2", "a-b", true),
            row("missing", "missing", true),
            row("a_b", "a_b", false),
            row("opt", "opt", false),
        ]
    );
    assert_eq!(
        ps[0].hint,
        ["str", "None"],
        "required and nullable: no default"
    );
    assert_eq!(
        signature("f", &ps),
        "def f(\n    zeta: str | None,\n    a_b_3: int,\n    class_: str,\n    a_b_2: str,\n    \
         missing: Any,\n    *,\n    a_b: bool | None = None,\n    opt: Any = None,\n) -> Any:"
    );
    // Another order of `required`: the same names for the same keys.
    let again = params(&schema(json!(["a-b", "a.b", "zeta"])));
    let names: std::collections::HashMap<String, String> = again
        .iter()
        .map(|p| (p.key.clone(), p.name.clone()))
        .collect();
    for p in &ps {
        if let Some(name) = names.get(&p.key) {
            assert_eq!(name, &p.name, "{}", p.key);
        }
    }
    assert_eq!(
        again.iter().map(|p| p.key.as_str()).collect::<Vec<_>>(),
        ["a-b", "a.b", "zeta", "a_b", "class", "opt"]
    );
}

#[test]
fn function_body_maps_names_back_and_omits_none() {
    let t = tool(
        json!({"properties": {"max-results": {"type": "integer"}, "q": {"type": "string"}},
               "required": ["q"]}),
        "Search.",
    );
    let text = function(&t, "do_it");
    assert!(text.starts_with(
        "def do_it(q: str, *, max_results: int | None = None) -> Any:\n    \"\"\"Search.\n\n    Args:\n"
    ), "{text}");
    assert!(text.ends_with(
        "    _args = {\"q\": q}\n    if max_results is not None:\n        \
         _args[\"max-results\"] = max_results\n    return _codebox.call_tool(\"srv__do_it\", _args)\n"
    ), "{text}");
}

#[test]
fn hostile_descriptions_stay_inside_the_docstring() {
    let t = tool(
        json!({"properties": {"x\"\"\"": {"type": "string", "description": "\"\"\" + evil() + \"\"\"\\"}}}),
        "Ends with a quote \"\"\"\nimport os; os.system('x')\n\"\"\"",
    );
    let text = function(&t, "do_it");
    let doc_start = text.find("\"\"\"").unwrap();
    let doc_end = text.rfind("\"\"\"").unwrap();
    let body = &text[doc_start + 3..doc_end];
    assert!(!body.contains("\"\"\""), "{body}");
    assert!(text.contains("_args[\"x\\\"\\\"\\\"\"] = x___"), "{text}");
    assert!(
        text[doc_end..].starts_with("\"\"\"\n    _args = {}\n"),
        "{text}"
    );
}

#[test]
fn modules_list_their_functions() {
    let t = tool(json!({"type": "object"}), "First line.\nSecond.");
    let module = server_module("srv", &[(&t, "do_it".to_string())]);
    assert!(module.starts_with("\"\"\"Tools of the MCP server \"srv\", generated by codebox.\n"));
    assert!(module.contains("    do_it: First line.\n"));
    assert!(module.contains("from __future__ import annotations\n"));
    assert!(module.contains("import codebox as _codebox\n"));
    assert!(module.contains("__all__ = [\n    \"do_it\",\n]\n"));
    assert!(module.contains("\n\ndef do_it() -> Any:\n"));
    let init = package_init(&[("srv".into(), "s\"rv".into(), 1)]);
    assert!(
        init.contains("    srv: 1 tools of the MCP server \"s\\\\\"rv\"\n"),
        "{init}"
    );
    assert!(init.ends_with("__all__ = [\n    \"srv\",\n]\n"));
}

#[test]
fn fanning_out_references_stay_cheap() {
    // D0 → 8 × D1 → 8 × D2 ...: expanded naively, 8^30 visits.
    let mut defs = serde_json::Map::new();
    for i in 0..30 {
        let next = json!({"type": "array", "items": {"$ref": format!("#/$defs/D{}", i + 1)}});
        defs.insert(format!("D{i}"), json!({"anyOf": vec![next; 8]}));
    }
    defs.insert("D30".into(), json!({"type": "string"}));
    let schema = json!({"properties": {"x": {"$ref": "#/$defs/D0"}}, "$defs": defs});
    let started = std::time::Instant::now();
    let ps = params(&schema);
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    assert_eq!(ps[0].hint, ["Any"], "the budget ran out: anything goes");
}

/// `A0 → list[A1] | dict[str, A1] → … → L`, `L` one long literal: expanded inline, every
/// parameter naming `A0` reaches `L` 2^12 times.
fn fanned_out_literal(params: usize) -> Value {
    let mut defs = serde_json::Map::new();
    defs.insert("L".into(), json!({"enum": ["X".repeat(1000)]}));
    for i in 0..12 {
        let next = match i {
            11 => "#/$defs/L".to_string(),
            _ => format!("#/$defs/A{}", i + 1),
        };
        defs.insert(
            format!("A{i}"),
            json!({"anyOf": [
                {"type": "array", "items": {"$ref": next}},
                {"type": "object", "additionalProperties": {"$ref": next}}
            ]}),
        );
    }
    let mut props = serde_json::Map::new();
    props.insert("a_first".into(), json!({"enum": ["x", "y"]}));
    for p in 0..params {
        props.insert(format!("p{p:03}"), json!({"$ref": "#/$defs/A0"}));
    }
    json!({"type": "object", "properties": props, "$defs": defs})
}

#[test]
fn a_long_literal_behind_fanned_out_references_is_escaped_once_within_one_budget() {
    let schema = fanned_out_literal(400);
    let mut hinter = Hinter::new(&schema);
    let hints: Vec<Hint> = properties(&schema)
        .iter()
        .map(|(_, s)| hinter.hint(s, 0))
        .collect();
    assert_eq!(
        hints[0],
        [r#"Literal["x", "y"]"#],
        "a parameter before the budget ran out"
    );
    assert!(
        hints[1..].iter().all(|h| h == &any()),
        "the rest: anything goes"
    );
    // The budget is the tool's, not each parameter's: 400 parameters do not get 400.
    assert_eq!(hinter.nodes_left, 0);
    // Reached thousands of times, the long literal was escaped once.
    assert_eq!(hinter.literals.len(), 2, "a_first's and L's");
    // And the generated code says the same.
    let ps = params(&schema);
    assert_eq!(ps.len(), 401);
    assert!(ps[1..].iter().all(|p| p.hint == ["Any"]));
}

#[test]
fn thousands_of_properties_and_required_names_keep_their_order() {
    let props: serde_json::Map<String, Value> = (0..5000)
        .map(|i| (format!("k{i:05}"), json!({"type": "string"})))
        .collect();
    // Every even property required, twice, and names no property has.
    let required: Vec<String> = (0..5000)
        .step_by(2)
        .flat_map(|i| [format!("k{i:05}"), format!("k{i:05}"), format!("r{i:05}")])
        .collect();
    let ps = params(&json!({"properties": props, "required": required}));
    assert_eq!(ps.len(), 7500);
    let (req, opt): (Vec<&Param>, Vec<&Param>) = ps.iter().partition(|p| p.required);
    assert_eq!((req.len(), opt.len()), (5000, 2500));
    // Required ones in the order of `required` (first mentions), optional ones sorted.
    let listed: Vec<String> = (0..5000)
        .step_by(2)
        .flat_map(|i| [format!("k{i:05}"), format!("r{i:05}")])
        .collect();
    assert!(req.iter().map(|p| &p.key).eq(listed.iter()));
    assert!(opt.windows(2).all(|w| w[0].key < w[1].key));
    assert_eq!(req[1].key, "r00000");
    assert_eq!(req[2].key, "k00002");
    assert_eq!(req[1].hint, ["Any"], "required but not a property");
    assert_eq!(opt[0].key, "k00001");
}
