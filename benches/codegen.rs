//! Rendering `/servers` for hostile tool schemas an upstream server could send: the time
//! must stay proportional to the schema, not to what it expands to.
//!
//! - `fan_out_literal/<bytes>`: 400 parameters each naming `A0`, where
//!   `A0 → list[A1] | dict[str, A1] → … → A11 → L` and `L` is an enum of one string of
//!   `<bytes>` bytes (expanded inline, `L` is reached 2^12 times per parameter);
//! - `wide_properties`: 20,000 properties and 40,000 required names (half unknown);
//! - `wide_any_of`: one parameter whose `anyOf` has 20,000 consts.
//!
//! `cargo bench --bench codegen`; medians in
//! `target/criterion/codegen/<id>/new/estimates.json`.

use std::hint::black_box;
use std::time::Duration;

use codebox::upstream::catalog::{tools_of, Catalog, CatalogServer};
use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::{json, Map, Value};

fn catalog(input_schema: Value) -> Catalog {
    let tool: rmcp::model::Tool =
        serde_json::from_value(json!({"name": "t", "inputSchema": input_schema})).expect("a tool");
    Catalog {
        version: 1,
        tools: tools_of("s", "s", vec![tool]),
        servers: vec![CatalogServer {
            name: "s".into(),
            ident: "s".into(),
        }],
    }
}

fn fan_out_literal(literal_bytes: usize) -> Value {
    let mut defs = Map::new();
    defs.insert("L".into(), json!({"enum": ["X".repeat(literal_bytes)]}));
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
    let props: Map<String, Value> = (0..400)
        .map(|p| (format!("p{p}"), json!({"$ref": "#/$defs/A0"})))
        .collect();
    json!({"type": "object", "properties": props, "$defs": defs})
}

fn wide_properties() -> Value {
    let props: Map<String, Value> = (0..20_000)
        .map(|p| (format!("p{p}"), json!({"type": "string"})))
        .collect();
    let required: Vec<String> = (0..20_000)
        .flat_map(|p| [format!("p{p}"), format!("q{p}")])
        .collect();
    json!({"type": "object", "properties": props, "required": required})
}

fn wide_any_of() -> Value {
    let consts: Vec<Value> = (0..20_000)
        .map(|i| json!({"const": format!("v{i}")}))
        .collect();
    json!({"type": "object", "properties": {"x": {"anyOf": consts}}})
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("codegen");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(5));
    let cases = [
        ("fan_out_literal/1000", fan_out_literal(1_000)),
        ("fan_out_literal/100000", fan_out_literal(100_000)),
        ("wide_properties", wide_properties()),
        ("wide_any_of", wide_any_of()),
    ];
    for (id, schema) in cases {
        let catalog = catalog(schema);
        group.bench_function(id, |b| {
            b.iter(|| codebox::codegen::render_tree(black_box(&catalog)).expect("renders"))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
