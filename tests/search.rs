//! Tool search (`codebox::catalog`) over the tool lists of real MCP servers
//! (`tests/fixtures/tools/*.json`, 38 tools): ranking of everyday queries, filters, the
//! fields of each detail level, pagination and errors.

mod common;

use std::collections::BTreeSet;

use codebox::catalog::{Detail, SearchError, SearchIndex, SearchPage, SearchQuery};
use codebox::upstream::catalog::Catalog;
use common::fixtures::fixture_catalog;
use serde_json::Value;

fn catalog(version: u64) -> Catalog {
    fixture_catalog(version)
}

fn index() -> SearchIndex {
    SearchIndex::build(&catalog(3))
}

fn query(text: &str) -> SearchQuery {
    SearchQuery {
        text: text.into(),
        server: None,
        detail: Detail::Summary,
        limit: 10,
        cursor: None,
    }
}

fn all(_: &str) -> bool {
    true
}

fn names(page: &SearchPage) -> Vec<&str> {
    page.tools
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect()
}

fn top(text: &str) -> String {
    let page = index().search(&query(text), &all).expect("search");
    names(&page).first().expect("a result").to_string()
}

#[test]
fn everyday_queries_find_the_right_tool_first() {
    let first = top("read a file");
    assert!(
        ["filesystem__read_text_file", "filesystem__read_file"].contains(&first.as_str()),
        "{first}"
    );
    assert_eq!(top("current time in a timezone"), "time__get_current_time");
    assert_eq!(
        top("create entities in the knowledge graph"),
        "memory__create_entities"
    );
    assert_eq!(
        top("convert a time between timezones"),
        "time__convert_time"
    );
    assert_eq!(top("list a directory"), "filesystem__list_directory");
    assert_eq!(top("add two numbers"), "everything__get_sum");
    assert_eq!(top("readMultipleFiles"), "filesystem__read_multiple_files");
}

#[test]
fn read_a_file_ranks_read_tools_above_the_rest() {
    let page = index().search(&query("read a file"), &all).unwrap();
    let found = names(&page);
    let reads = found
        .iter()
        .take_while(|n| n.starts_with("filesystem__read_"))
        .count();
    assert!(reads >= 3, "{found:?}");
}

#[test]
fn the_server_filter() {
    let index = index();
    let mut q = query("file");
    q.server = Some("memory".into());
    let page = index.search(&q, &all).unwrap();
    assert!(names(&page).iter().all(|n| n.starts_with("memory__")));
    q.text.clear();
    q.server = Some("time".into());
    let page = index.search(&q, &all).unwrap();
    assert_eq!(
        names(&page),
        ["time__convert_time", "time__get_current_time"]
    );
    assert_eq!(page.total, 2);

    q.server = Some("fs".into());
    let err = index.search(&q, &all).unwrap_err();
    assert!(
        matches!(&err, SearchError::UnknownServer { server, .. } if server == "fs"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "unknown server \"fs\"; the servers are: everything, filesystem, memory, time"
    );
}

fn keys(value: &Value) -> BTreeSet<&str> {
    value
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect()
}

#[test]
fn each_detail_level_has_exactly_its_fields() {
    let index = index();
    let expected: [(Detail, &[&str]); 3] = [
        (Detail::Name, &["name"]),
        (
            Detail::Summary,
            &["name", "server", "description", "typescript", "python"],
        ),
        (
            Detail::Full,
            &[
                "name",
                "server",
                "tool",
                "title",
                "description",
                "input_schema",
                "output_schema",
                "typescript",
                "python",
            ],
        ),
    ];
    for (detail, fields) in expected {
        let q = SearchQuery {
            detail,
            limit: 100,
            ..query("")
        };
        let page = index.search(&q, &all).unwrap();
        assert_eq!(page.tools.len(), 38);
        let fields: BTreeSet<&str> = fields.iter().copied().collect();
        for tool in &page.tools {
            assert_eq!(keys(tool), fields, "{detail:?}: {tool}");
        }
    }
    let mut get_fields: BTreeSet<&str> = expected[2].1.iter().copied().collect();
    get_fields.insert("example");
    for tool in &catalog(3).tools {
        let full = index.get(&tool.name).expect("get");
        assert_eq!(keys(&full), get_fields, "{}", tool.name);
        assert_eq!(
            keys(&full["example"]),
            BTreeSet::from(["python", "typescript"])
        );
    }
}

#[test]
fn summaries_and_definitions_of_a_real_tool() {
    let index = index();
    let q = SearchQuery {
        server: Some("filesystem".into()),
        ..query("read text file")
    };
    let page = index.search(&q, &all).unwrap();
    let t = &page.tools[0];
    assert_eq!(t["name"], "filesystem__read_text_file");
    assert_eq!(
        t["description"],
        "Read the complete contents of a file from the file system as text."
    );
    assert_eq!(
        t["typescript"],
        "function readTextFile(input: { head?: number; path: string; tail?: number }): \
         Promise<{ content: string }>"
    );
    assert_eq!(
        t["python"],
        "def read_text_file(path: str, *, head: float | None = None, \
         tail: float | None = None) -> Any"
    );
    for t in &index
        .search(
            &SearchQuery {
                limit: 100,
                ..query("")
            },
            &all,
        )
        .unwrap()
        .tools
    {
        let d = t["description"].as_str().unwrap();
        assert!(d.chars().count() <= 200 && !d.contains('\n'), "{d}");
        let ts = t["typescript"].as_str().unwrap();
        assert!(ts.starts_with("function ") && !ts.contains('\n'), "{ts}");
        let py = t["python"].as_str().unwrap();
        assert!(
            py.starts_with("def ") && py.ends_with(") -> Any") && !py.contains('\n'),
            "{py}"
        );
    }
    // Required parameters by position, in the order of the schema's `required`.
    let page = index.search(&query("convert time"), &all).unwrap();
    let convert = page
        .tools
        .iter()
        .find(|t| t["name"] == "time__convert_time")
        .unwrap();
    assert_eq!(
        convert["python"],
        "def convert_time(source_timezone: str, time: str, target_timezone: str) -> Any"
    );

    let full = index.get("filesystem__read_text_file").unwrap();
    assert_eq!(full["tool"], "read_text_file");
    assert_eq!(full["server"], "filesystem");
    assert_eq!(
        full["python"],
        "def read_text_file(path: str, *, head: float | None = None, \
         tail: float | None = None) -> Any"
    );
    let ts = full["typescript"].as_str().unwrap();
    assert!(ts.contains("export interface ReadTextFileInput {"), "{ts}");
    assert!(ts.ends_with(
        "export function readTextFile(input: ReadTextFileInput): Promise<ReadTextFileOutput>;\n"
    ));
    assert_eq!(
        full["example"]["python"],
        "from servers.filesystem import read_text_file\nread_text_file(\"...\")"
    );
    assert_eq!(
        full["example"]["typescript"],
        "import { readTextFile } from \"/servers/filesystem/index.ts\";\n\
         await readTextFile({ path: \"...\" });"
    );
    let sum = index.get("everything__get_sum").unwrap();
    assert_eq!(
        sum["example"]["typescript"],
        "import { getSum } from \"/servers/everything/index.ts\";\nawait getSum({ a: 0, b: 0 });"
    );
    assert_eq!(index.get("filesystem__nope"), None);
}

/// Follows `next_cursor` to the end; every page within the limit.
fn walk(index: &SearchIndex, mut q: SearchQuery, allowed: &dyn Fn(&str) -> bool) -> Vec<String> {
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = index.search(&q, allowed).unwrap();
        pages += 1;
        assert!(page.tools.len() <= q.limit && pages <= 100);
        seen.extend(names(&page).into_iter().map(String::from));
        match page.next_cursor {
            Some(cursor) => {
                assert_eq!(page.tools.len(), q.limit, "only the last page is short");
                q.cursor = Some(cursor);
            }
            None => {
                assert_eq!(seen.len(), page.total);
                return seen;
            }
        }
    }
}

#[test]
fn pagination_visits_every_tool_exactly_once() {
    let index = index();
    let every: BTreeSet<String> = catalog(3).tools.into_iter().map(|t| t.name).collect();
    assert_eq!(every.len(), 38);
    let walked = walk(
        &index,
        SearchQuery {
            limit: 5,
            ..query("")
        },
        &all,
    );
    assert_eq!(walked.len(), 38);
    assert_eq!(walked.iter().cloned().collect::<BTreeSet<_>>(), every);
    let mut sorted = walked.clone();
    sorted.sort();
    assert_eq!(walked, sorted, "an empty query lists by name");

    // A ranked query: the walk equals the single large page.
    let q = SearchQuery {
        limit: 5,
        ..query("file directory")
    };
    let walked = walk(&index, q.clone(), &all);
    let whole = index
        .search(&SearchQuery { limit: 100, ..q }, &all)
        .unwrap();
    assert!(whole.total > 10, "{}", whole.total);
    assert_eq!(walked, names(&whole));
}

#[test]
fn the_allowlist_is_respected() {
    let index = index();
    let allowed = |n: &str| n.starts_with("memory__") || n == "filesystem__read_file";
    let walked = walk(
        &index,
        SearchQuery {
            limit: 5,
            ..query("")
        },
        &allowed,
    );
    assert_eq!(walked.len(), 10);
    assert!(walked.iter().all(|n| allowed(n)));
    let page = index.search(&query("read a file"), &allowed).unwrap();
    assert_eq!(names(&page)[0], "filesystem__read_file");
    assert!(names(&page).iter().all(|n| allowed(n)));
    assert_eq!(
        index
            .search(&query("read a file"), &|_| false)
            .unwrap()
            .total,
        0
    );
}

#[test]
fn bad_requests_are_explained() {
    let index = index();
    for limit in [0, 101] {
        let err = index
            .search(&SearchQuery { limit, ..query("") }, &all)
            .unwrap_err();
        assert_eq!(err, SearchError::BadLimit(limit));
        assert!(err.to_string().contains("from 1 to 100"), "{err}");
    }
    let first = index
        .search(
            &SearchQuery {
                limit: 5,
                ..query("file")
            },
            &all,
        )
        .unwrap();
    let cursor = first.next_cursor.expect("more than one page");

    let err = |q: SearchQuery, index: &SearchIndex| index.search(&q, &all).unwrap_err();
    let other_query = SearchQuery {
        limit: 5,
        cursor: Some(cursor.clone()),
        ..query("time")
    };
    assert!(matches!(
        err(other_query, &index),
        SearchError::BadCursor(_)
    ));
    let newer = SearchIndex::build(&catalog(4));
    assert_eq!(newer.version(), 4);
    let same = SearchQuery {
        limit: 5,
        cursor: Some(cursor.clone()),
        ..query("file")
    };
    let e = err(same.clone(), &newer);
    assert!(matches!(e, SearchError::BadCursor(_)), "{e:?}");
    assert!(e.to_string().contains("catalog changed"), "{e}");
    assert!(e.to_string().contains("without a cursor"), "{e}");
    let garbage = SearchQuery {
        cursor: Some("not a cursor".into()),
        ..query("file")
    };
    assert!(matches!(err(garbage, &index), SearchError::BadCursor(_)));
    // The right cursor goes on.
    assert_eq!(index.search(&same, &all).unwrap().tools.len(), 5);
    assert_eq!(
        "everything".parse::<Detail>().unwrap_err().to_string(),
        "detail \"everything\" is not one of \"name\", \"summary\", \"full\""
    );
}
