//! Streaming redaction of credentials in responses from credentialed hosts: every secret
//! raw and in every encoding an echoing host writes ([`codebox::egress::Secrets`]), on
//! 4 MiB bodies a hostile origin might send, in 64 KiB chunks, side by side with a
//! matcher of the raw values only (what redaction was before encodings were covered).
//!
//! `cargo bench --bench redaction`; throughput per input in
//! `target/criterion/redaction/<id>/new/estimates.json`. What to look at: the ratio of
//! `encoded` to `raw-only` on each input, and that the adversarial inputs (percent, JSON
//! and HTML escape soup, near misses of every secret) run at the speed of plain text,
//! not slower: matching is linear in the body.

use std::hint::black_box;

use codebox::egress::{Redactor, Secrets};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

const BODY: usize = 4 << 20;
const CHUNK: usize = 64 << 10;

fn repeat_to(unit: &str) -> Vec<u8> {
    unit.as_bytes().iter().copied().cycle().take(BODY).collect()
}

/// The secret sets: a realistic one, many short ones, and two 4 KiB bearer tokens (with
/// their `Bearer ` forms, the most the policy allows: 16 KiB in all).
fn secrets(set: &str) -> Vec<String> {
    let token = "eyJhbGciOi/JIUzI1+NiIsInR5cCI6IkpXVCJ9.payload/part+==";
    let mut v = vec![
        token.to_string(),
        format!("Bearer {token}"),
        "k3y with space/and+plus=equals&amp\"quote".to_string(),
        "q v/al+ue=x&y%z~".to_string(),
        "q+v%2Fal%2Bue%3Dx%26y%25z%7E".to_string(),
    ];
    match set {
        "many" => {
            // 32 more credentials of 128 bytes each.
            for i in 0..32 {
                v.push(format!("{i:02}{}", "aZ9/+=-_.~".repeat(13))[..128].to_string());
            }
        }
        "at-the-bound" => {
            v.clear();
            for i in 0..2 {
                let t = format!("{i}{}", "eyJ0eXAiOiJKV1Qi/+=".repeat(216))[..4090].to_string();
                v.push(format!("Bearer {t}"));
                v.push(t);
            }
            assert!(v.iter().map(String::len).sum::<usize>() <= 16 << 10);
        }
        _ => {}
    }
    v
}

/// The raw values only, as one alternation (the matcher before encodings), replacing
/// over the whole body at once (no chunks: a lower bound of what streaming costs).
struct RawOnly(regex::bytes::Regex);

impl RawOnly {
    fn new(values: &[String]) -> RawOnly {
        let alts: Vec<String> = values.iter().map(|v| regex::escape(v)).collect();
        RawOnly(
            regex::bytes::RegexBuilder::new(&alts.join("|"))
                .unicode(false)
                .build()
                .unwrap(),
        )
    }
}

fn bench(c: &mut Criterion) {
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        (
            "json-text",
            repeat_to(
                r#"{"id": 12345, "name": "a user", "tags": ["x", "y"], "note": "nothing secret here at all"}, "#,
            ),
        ),
        ("percent-soup", repeat_to("%2F%2B%3D%20+%25%7e%41")),
        ("escape-soup", repeat_to("\\u002f\\/&#x2F;&#47;&amp;&quot;")),
        // The encoded token without its last byte, again and again: every position
        // starts a match that fails only at its end.
        (
            "near-miss",
            repeat_to("eyJhbGciOi%2FJIUzI1%2BNiIsInR5cCI6IkpXVCJ9.payload%2Fpart%2B%3D "),
        ),
        ("same-byte", repeat_to("a")),
    ];
    for set in ["5-secrets", "many", "at-the-bound"] {
        let values = secrets(set);
        let encoded = Secrets::new(&values).unwrap();
        let raw = RawOnly::new(&values);
        let mut g = c.benchmark_group(format!("redaction/{set}"));
        g.sample_size(10);
        // Building the automaton (once, at start-up).
        g.bench_function("build", |b| {
            b.iter(|| Secrets::new(black_box(&values)).unwrap())
        });
        g.throughput(Throughput::Bytes(BODY as u64));
        for (name, body) in &inputs {
            g.bench_function(format!("{name}/encoded"), |b| {
                b.iter(|| {
                    let mut r = Redactor::new(encoded.clone());
                    let mut n = 0;
                    for chunk in body.chunks(CHUNK) {
                        n += r.push(black_box(chunk)).len();
                    }
                    n + r.finish().len()
                })
            });
            g.bench_function(format!("{name}/raw-only"), |b| {
                b.iter(|| raw.0.replace_all(black_box(body), &b"[REDACTED]"[..]).len())
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
