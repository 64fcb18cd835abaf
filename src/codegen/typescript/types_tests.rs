use serde_json::{json, Value};

use super::*;

/// The declarations for `schema` declared as `T`, concatenated.
fn declare_one(schema: &Value) -> String {
    let mut namer = Namer::new("", &["Promise", "Record", "Array"]);
    let name = namer.claim("T");
    let roots = [Root {
        schema,
        name,
        doc: String::new(),
    }];
    declare(&roots, &mut namer)
        .into_iter()
        .map(|d| d.text)
        .collect()
}

/// The type of property `x` of an object whose only property is `x`.
fn type_of(schema: Value) -> String {
    let text =
        declare_one(&json!({"type": "object", "properties": {"x": schema}, "required": ["x"]}));
    let start = text.find("  x: ").expect("member x") + 5;
    let end = text.rfind(";\n}").expect("end");
    text[start..end].to_string()
}

#[test]
fn primitive_types() {
    assert_eq!(type_of(json!({"type": "string"})), "string");
    assert_eq!(type_of(json!({"type": "integer"})), "number");
    assert_eq!(type_of(json!({"type": "number"})), "number");
    assert_eq!(type_of(json!({"type": "boolean"})), "boolean");
    assert_eq!(type_of(json!({"type": "null"})), "null");
    assert_eq!(
        type_of(json!({"type": ["string", "null"]})),
        "string | null"
    );
    assert_eq!(type_of(json!({"type": ["integer", "number"]})), "number");
}

#[test]
fn missing_unknown_and_boolean_schemas() {
    assert_eq!(type_of(json!({})), "unknown");
    assert_eq!(
        type_of(json!({"description": "x", "format": "uri"})),
        "unknown"
    );
    assert_eq!(type_of(json!({"type": "bigint"})), "unknown");
    assert_eq!(type_of(json!({"type": 7})), "unknown");
    assert_eq!(type_of(json!(true)), "unknown");
    assert_eq!(type_of(json!(false)), "never");
    assert_eq!(type_of(json!("nonsense")), "unknown");
    assert_eq!(
        type_of(json!({"type": "string", "not": {}, "if": 1})),
        "string"
    );
}

#[test]
fn required_optional_docs_and_quoted_names() {
    let schema = json!({
        "type": "object",
        "description": "Top */ level",
        "properties": {
            "path": {"type": "string", "description": "Where */ evil"},
            "max-results": {"type": "integer", "default": 10},
            "__proto__": {"type": "string"},
            "class": {"type": "boolean"},
        },
        "required": ["path", "class", "extra"],
    });
    assert_eq!(
        declare_one(&schema),
        "/** Top *\\/ level */\nexport interface T {\n  \
         __proto__?: string;\n  class: boolean;\n  \
         /** @default 10 */\n  \"max-results\"?: number;\n  \
         /** Where *\\/ evil */\n  path: string;\n  extra: unknown;\n}\n"
    );
}

#[test]
fn nested_objects_are_inline_type_literals() {
    let t = type_of(
        json!({"type": "object", "properties": {"a": {"type": "object",
        "properties": {"b": {"type": "string"}}}}}),
    );
    assert_eq!(t, "{\n    a?: {\n      b?: string;\n    };\n  }");
}

#[test]
fn arrays_and_tuples() {
    assert_eq!(
        type_of(json!({"type": "array", "items": {"type": "string"}})),
        "string[]"
    );
    assert_eq!(type_of(json!({"type": "array"})), "unknown[]");
    assert_eq!(
        type_of(json!({"items": {"type": ["string", "null"]}})),
        "(string | null)[]"
    );
    assert_eq!(type_of(json!({"type": "array", "items": false})), "[]");
    assert_eq!(
        type_of(
            json!({"type": "array", "prefixItems": [{"type": "string"}, {"type": "number"}],
                       "minItems": 1, "items": false})
        ),
        "[string, number?]"
    );
    assert_eq!(
        type_of(json!({"type": "array", "prefixItems": [{"type": "string"}],
                       "items": {"type": "boolean"}, "minItems": 1})),
        "[string, ...boolean[]]"
    );
    assert_eq!(
        type_of(json!({"type": "array", "items": [{"type": "string"}], "minItems": 1})),
        "[string, ...unknown[]]"
    );
    assert_eq!(
        type_of(json!({"items": {"items": {"const": -1}}})),
        "(-1)[][]"
    );
}

#[test]
fn enums_and_consts_are_literal_unions() {
    assert_eq!(
        type_of(json!({"type": "string", "enum": ["a", "b\"c"]})),
        "\"a\" | \"b\\\"c\""
    );
    assert_eq!(
        type_of(json!({"enum": [1, 2.5, true, null, "x", "x"]})),
        "1 | 2.5 | true | null | \"x\""
    );
    assert_eq!(type_of(json!({"const": "only"})), "\"only\"");
    assert_eq!(type_of(json!({"enum": []})), "never");
    assert_eq!(
        type_of(json!({"enum": [{"k-1": [1, "a"]}]})),
        "{ \"k-1\": [1, \"a\"]; }"
    );
}

#[test]
fn combinators() {
    assert_eq!(
        type_of(json!({"anyOf": [{"type": "string"}, {"type": "number"}]})),
        "string | number"
    );
    assert_eq!(
        type_of(json!({"oneOf": [{"type": "string"}, {}]})),
        "unknown"
    );
    assert_eq!(
        type_of(json!({"anyOf": [{"type": "string"}, false]})),
        "string"
    );
    assert_eq!(
        type_of(
            json!({"allOf": [{"anyOf": [{"type": "string"}, {"type": "null"}]}, {"type": "string"}]})
        ),
        "(string | null) & string"
    );
    assert_eq!(
        type_of(json!({"allOf": [{}, {"type": "string"}]})),
        "string"
    );
    assert_eq!(
        type_of(json!({"allOf": [false, {"type": "string"}]})),
        "never"
    );
    assert_eq!(
        type_of(json!({"type": "string", "anyOf": [{"const": "a"}, {"const": "b"}]})),
        "string & (\"a\" | \"b\")"
    );
}

#[test]
fn additional_properties() {
    assert_eq!(
        type_of(json!({"type": "object", "additionalProperties": {"type": "number"}})),
        "{\n    [key: string]: number;\n  }"
    );
    assert_eq!(
        type_of(json!({"type": "object"})),
        "{\n    [key: string]: unknown;\n  }"
    );
    assert_eq!(
        type_of(json!({"type": "object", "additionalProperties": false})),
        "{\n    [key: string]: never;\n  }"
    );
    assert_eq!(
        type_of(
            json!({"type": "object", "properties": {"a": {"type": "string"}},
                       "additionalProperties": {"type": "number"}})
        ),
        "{\n    a?: string;\n    [key: string]: unknown;\n  }"
    );
    assert_eq!(
        type_of(json!({"type": "object", "properties": {"a": {}}, "additionalProperties": false})),
        "{\n    a?: unknown;\n  }"
    );
}

#[test]
fn references_become_named_types() {
    let schema = json!({
        "type": "object",
        "properties": {
            "a": {"$ref": "#/$defs/Entity"},
            "b": {"$ref": "#/definitions/entity-list", "description": "siblings are fine"},
            "c": {"$ref": "#/$defs/Missing"},
            "d": {"$ref": "https://example.com/x.json"},
            "e": {"$ref": "#/%24defs/Entity"},
        },
        "$defs": {"Entity": {"type": "object", "description": "An entity",
                             "properties": {"name": {"type": "string"}}, "required": ["name"]},
                  "T": {"type": "string"}},
        "definitions": {"entity-list": {"type": "array", "items": {"$ref": "#/$defs/Entity"}},
                        "unused": {"type": "number"}},
    });
    assert_eq!(
        declare_one(&schema),
        "export interface T {\n  a?: Entity;\n  /** siblings are fine */\n  b?: EntityList;\n  c?: unknown;\n  d?: unknown;\n  \
         e?: Entity;\n}\n\
         /** An entity */\nexport interface Entity {\n  name: string;\n}\n\
         export type EntityList = Entity[];\n"
    );
}

#[test]
fn defs_named_like_the_root_or_globals_get_other_names() {
    let schema = json!({"anyOf": [{"$ref": "#/$defs/T"}, {"$ref": "#/$defs/Record"}],
                        "$defs": {"T": {"type": "string"}, "Record": {"type": "number"}}});
    assert_eq!(
        declare_one(&schema),
        "export type T = T2 | Record2;\nexport type Record2 = number;\nexport type T2 = string;\n"
    );
}

#[test]
fn recursion_through_members_is_kept() {
    let schema = json!({
        "$ref": "#/$defs/Node",
        "$defs": {"Node": {"type": "object", "properties": {
            "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}},
            "parent": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]},
            "root": {"$ref": "#"}}}},
    });
    assert_eq!(
        declare_one(&schema),
        "export type T = Node;\nexport interface Node {\n  children?: Node[];\n  \
         parent?: Node | null;\n  root?: T;\n}\n"
    );
}

#[test]
fn circular_aliases_are_broken_with_unknown() {
    let schema = json!({
        "anyOf": [{"$ref": "#"}, {"type": "string"}, {"$ref": "#/$defs/A"}],
        "$defs": {
            "A": {"anyOf": [{"$ref": "#/$defs/B"}, {"type": "null"}]},
            "B": {"allOf": [{"$ref": "#/$defs/A"}, {"type": "array", "items": {"$ref": "#/$defs/B"}}]},
            "Self": {"$ref": "#/$defs/Self"},
        },
    });
    let text = declare_one(&schema);
    // T → T is cut (T = unknown | ...); of A → B → A, the reference back to A is.
    assert_eq!(
        text,
        "export type T = unknown;\nexport type A = B | null;\nexport type B = B[];\n"
    );
    let schema = json!({"type": "object", "properties": {"s": {"$ref": "#/$defs/Self"}},
                        "$defs": {"Self": {"$ref": "#/$defs/Self"}}});
    assert!(declare_one(&schema).ends_with("export type Self = unknown;\n"));
}

#[test]
fn deep_schemas_stop_at_the_depth_limit() {
    let mut schema = json!({"type": "string"});
    for _ in 0..200 {
        schema = json!({"type": "array", "items": schema});
    }
    let text = type_of(schema);
    assert!(text.starts_with("unknown[][]"), "{text}");
    assert!(!text.contains("string"));
}

#[test]
fn output_is_deterministic_and_roots_accept_empty_only_without_required() {
    let schema = json!({"properties": {"b": {"$ref": "#/$defs/Z"}, "a": {"$ref": "#/$defs/Y"}},
                        "$defs": {"Z": {}, "Y": {}}});
    let text = declare_one(&schema);
    assert_eq!(text, declare_one(&schema));
    assert!(text.find("type Y").unwrap() < text.find("type Z").unwrap());

    let mut namer = Namer::new("", &[]);
    let empty = json!({"type": "object", "properties": {}});
    let needs = json!({"type": "object", "required": ["a"]});
    let other = json!({"type": "string"});
    let anything = json!(true);
    for (schema, accepts) in [
        (&empty, true),
        (&needs, false),
        (&other, false),
        (&anything, true),
    ] {
        let roots = [Root {
            schema,
            name: namer.claim("In"),
            doc: String::new(),
        }];
        assert_eq!(
            declare(&roots, &mut namer)[0].accepts_empty,
            accepts,
            "{schema}"
        );
    }
}
