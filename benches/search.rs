//! Tool search over synthetic catalogs of 100, 1,000 and 10,000 tools: the latency of a
//! search (summary detail, limit 10) for a few realistic queries, of listing (empty
//! query), of a second page, and the time to build the index.
//!
//! `cargo bench --bench search`; medians are in
//! `target/criterion/<group>/<id>/new/estimates.json`. Goal: a search over 10,000 tools
//! under 1 ms.

use std::hint::black_box;
use std::time::Duration;

use codebox::catalog::synthetic::synthetic_catalog;
use codebox::catalog::{Detail, SearchIndex, SearchQuery};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

const SIZES: [usize; 3] = [100, 1_000, 10_000];
const SEED: u64 = 1;

const QUERIES: &[(&str, &str)] = &[
    ("search_contacts", "search contacts by owner"),
    ("create_invoice", "create a new invoice"),
    ("open_tickets", "list open tickets sorted by priority"),
    ("export_csv", "export orders as csv"),
    ("list_all", ""),
];

fn query(text: &str) -> SearchQuery {
    SearchQuery {
        text: text.into(),
        server: None,
        detail: Detail::Summary,
        limit: 10,
        cursor: None,
    }
}

fn allowed(_: &str) -> bool {
    true
}

fn search(c: &mut Criterion) {
    let mut group = c.benchmark_group("search");
    group
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for n in SIZES {
        let index = SearchIndex::build(&synthetic_catalog(n, SEED));
        for (id, text) in QUERIES {
            let q = query(text);
            group.bench_with_input(BenchmarkId::new(*id, n), &q, |b, q| {
                b.iter(|| index.search(black_box(q), &allowed).expect("search"))
            });
        }
        let first = index.search(&query("update"), &allowed).expect("search");
        let second = SearchQuery {
            cursor: first.next_cursor,
            ..query("update")
        };
        group.bench_with_input(BenchmarkId::new("second_page", n), &second, |b, q| {
            b.iter(|| index.search(black_box(q), &allowed).expect("search"))
        });
    }
    group.finish();
}

fn build(c: &mut Criterion) {
    let mut group = c.benchmark_group("build");
    group.sample_size(10);
    for n in SIZES {
        let catalog = synthetic_catalog(n, SEED);
        group.bench_with_input(BenchmarkId::from_parameter(n), &catalog, |b, catalog| {
            b.iter(|| SearchIndex::build(black_box(catalog)))
        });
    }
    group.finish();
}

criterion_group!(benches, search, build);
criterion_main!(benches);
