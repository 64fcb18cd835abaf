use std::collections::BTreeSet;

use serde_json::json;

use super::*;

fn tool(server: &str, name: &str, description: &str, input_schema: Value) -> CatalogTool {
    CatalogTool {
        name: format!("{server}__{name}"),
        server: server.into(),
        tool: name.into(),
        server_ident: server.into(),
        tool_ident: name.into(),
        title: None,
        description: Some(description.into()),
        input_schema,
        output_schema: None,
        annotations: None,
    }
}

fn catalog(version: u64) -> Catalog {
    let path = json!({"type": "object", "required": ["path"],
                      "properties": {"path": {"type": "string", "description": "Where"}}});
    Catalog {
        version,
        tools: vec![
            tool("fs", "read_file", "Read a file as text.", path.clone()),
            tool(
                "fs",
                "list_directory",
                "List the entries of a directory.",
                path.clone(),
            ),
            tool("fs", "write_file", "Write text into a file.", path),
            tool(
                "notes",
                "search",
                "Search the notes for a file name.",
                json!({
                "type": "object", "properties": {
                    "sortBy": {"enum": ["relevance", "modified"]},
                    "filter": {"type": "object", "properties": {"tagColour": {"type": "string"}}},
                    "ids": {"type": "array", "items": {"type": "object",
                            "properties": {"reviewer": {"type": "string"}}}}}}),
            ),
            tool(
                "time",
                "get_current_time",
                "The current time in a time zone.",
                json!({}),
            ),
        ],
        ..Default::default()
    }
}

fn query(text: &str) -> SearchQuery {
    SearchQuery {
        text: text.into(),
        server: None,
        detail: Detail::Name,
        limit: 10,
        cursor: None,
    }
}

fn names(page: &SearchPage) -> Vec<&str> {
    page.tools
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect()
}

fn all(_: &str) -> bool {
    true
}

#[test]
fn index_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<SearchIndex>();
}

#[test]
fn names_rank_above_descriptions() {
    let index = SearchIndex::build(&catalog(1));
    let page = index.search(&query("read a file"), &all).unwrap();
    assert_eq!(names(&page)[0], "fs__read_file");
    // "file" is in the names or descriptions of three tools; "read" only in one.
    assert_eq!(page.total, 3);
    assert!(!names(&page).contains(&"time__get_current_time"));
    let page = index.search(&query("file"), &all).unwrap();
    assert_eq!(&names(&page)[..2], ["fs__read_file", "fs__write_file"]);
    assert_eq!(names(&page)[2], "notes__search");
}

#[test]
fn parameters_enums_and_nested_properties_are_searched() {
    let index = SearchIndex::build(&catalog(1));
    for word in ["sort", "relevance", "tag colour", "reviewer"] {
        let page = index.search(&query(word), &all).unwrap();
        assert_eq!(names(&page), ["notes__search"], "{word}");
    }
    let page = index.search(&query("nothing matches this"), &all).unwrap();
    assert_eq!(
        (page.total, page.tools.len(), page.next_cursor),
        (0, 0, None)
    );
}

#[test]
fn empty_queries_list_everything_by_name() {
    let index = SearchIndex::build(&catalog(1));
    for text in ["", "  ", "the of"] {
        let page = index.search(&query(text), &all).unwrap();
        assert_eq!(
            names(&page),
            [
                "fs__list_directory",
                "fs__read_file",
                "fs__write_file",
                "notes__search",
                "time__get_current_time"
            ],
            "{text:?}"
        );
    }
}

#[test]
fn allowed_and_server_filters() {
    let index = SearchIndex::build(&catalog(1));
    let only_fs_read = |n: &str| n != "fs__read_file";
    let page = index.search(&query("read a file"), &only_fs_read).unwrap();
    assert!(!names(&page).contains(&"fs__read_file"));
    assert_eq!(page.total, 2);

    let mut q = query("file");
    q.server = Some("notes".into());
    let page = index.search(&q, &all).unwrap();
    assert_eq!(names(&page), ["notes__search"]);
    q.text.clear();
    q.server = Some("fs".into());
    assert_eq!(index.search(&q, &all).unwrap().total, 3);
    assert_eq!(index.search(&q, &|_| false).unwrap().total, 0);

    q.server = Some("nope".into());
    let err = index.search(&q, &all).unwrap_err();
    assert_eq!(
        err.to_string(),
        "unknown server \"nope\"; the servers are: fs, notes, time"
    );
}

#[test]
fn limits_outside_1_to_100_are_refused() {
    let index = SearchIndex::build(&catalog(1));
    for limit in [0, 101, usize::MAX] {
        let mut q = query("");
        q.limit = limit;
        assert_eq!(index.search(&q, &all), Err(SearchError::BadLimit(limit)));
    }
    let mut q = query("");
    q.limit = 100;
    assert_eq!(index.search(&q, &all).unwrap().tools.len(), 5);
}

fn walk(index: &SearchIndex, mut q: SearchQuery, allowed: &dyn Fn(&str) -> bool) -> Vec<String> {
    let mut seen = Vec::new();
    loop {
        let page = index.search(&q, allowed).unwrap();
        assert!(page.tools.len() <= q.limit);
        seen.extend(names(&page).iter().map(|n| n.to_string()));
        assert!(seen.len() <= page.total);
        match page.next_cursor {
            Some(c) => q.cursor = Some(c),
            None => {
                assert_eq!(seen.len(), page.total);
                return seen;
            }
        }
    }
}

#[test]
fn cursors_walk_every_result_once() {
    let index = SearchIndex::build(&catalog(1));
    for (text, limit) in [("", 2), ("file", 1), ("file", 3), ("file", 4), ("", 5)] {
        let mut q = query(text);
        q.limit = limit;
        let whole = index
            .search(
                &SearchQuery {
                    limit: 100,
                    ..q.clone()
                },
                &all,
            )
            .unwrap();
        let walked = walk(&index, q, &all);
        assert_eq!(walked, names(&whole), "{text:?} by {limit}");
        let unique: BTreeSet<&String> = walked.iter().collect();
        assert_eq!(unique.len(), walked.len());
    }
}

#[test]
fn foreign_cursors_are_refused() {
    let index = SearchIndex::build(&catalog(1));
    let mut q = query("file");
    q.limit = 1;
    let cursor = index.search(&q, &all).unwrap().next_cursor.unwrap();
    let message =
        |q: &SearchQuery, index: &SearchIndex| index.search(q, &all).unwrap_err().to_string();

    let other = SearchQuery {
        text: "read".into(),
        cursor: Some(cursor.clone()),
        ..q.clone()
    };
    assert!(
        message(&other, &index).contains("different query"),
        "{}",
        message(&other, &index)
    );
    let other = SearchQuery {
        server: Some("fs".into()),
        cursor: Some(cursor.clone()),
        ..q.clone()
    };
    assert!(message(&other, &index).contains("different query"));

    let newer = SearchIndex::build(&catalog(2));
    let same = SearchQuery {
        cursor: Some(cursor.clone()),
        ..q.clone()
    };
    assert!(message(&same, &newer).contains("catalog changed"));
    // The same query with other detail or limit may go on with it.
    let wider = SearchQuery {
        limit: 10,
        detail: Detail::Full,
        ..same.clone()
    };
    assert_eq!(index.search(&wider, &all).unwrap().tools.len(), 2);

    let garbage = SearchQuery {
        cursor: Some("abc".into()),
        ..q.clone()
    };
    assert!(message(&garbage, &index).starts_with("invalid cursor: it is not a cursor"));
    let past = Cursor::decode(&cursor).unwrap();
    let past = Cursor { offset: 99, ..past }.encode();
    let past = SearchQuery {
        cursor: Some(past),
        ..q.clone()
    };
    assert!(message(&past, &index).contains("past the last result"));
}

#[test]
fn detail_levels_have_exactly_their_fields() {
    let index = SearchIndex::build(&catalog(1));
    let keys = |detail: Detail| -> Vec<String> {
        let q = SearchQuery {
            detail,
            ..query("read file")
        };
        let page = index.search(&q, &all).unwrap();
        page.tools[0].as_object().unwrap().keys().cloned().collect()
    };
    assert_eq!(keys(Detail::Name), ["name"]);
    assert_eq!(
        keys(Detail::Summary),
        ["description", "name", "python", "server", "typescript"]
    );
    assert_eq!(
        keys(Detail::Full),
        [
            "description",
            "input_schema",
            "name",
            "output_schema",
            "python",
            "server",
            "title",
            "tool",
            "typescript"
        ]
    );
    let q = SearchQuery {
        detail: Detail::Summary,
        ..query("read file")
    };
    let top = &index.search(&q, &all).unwrap().tools[0];
    assert_eq!(
        top["typescript"],
        "function readFile(input: { path: string }): Promise<unknown>"
    );
    assert_eq!(top["python"], "def read_file(path: str) -> Any");
    assert_eq!(top["description"], "Read a file as text.");
    assert_eq!(
        crate::catalog::text_entry(top),
        "fs__read_file: Read a file as text.\n  \
         ts: function readFile(input: { path: string }): Promise<unknown>\n  \
         py: def read_file(path: str) -> Any\n"
    );
    let q = SearchQuery {
        detail: Detail::Full,
        ..query("read file")
    };
    let full = &index.search(&q, &all).unwrap().tools[0];
    let text = crate::catalog::text_entry(full);
    assert!(
        text.starts_with("fs__read_file: Read a file as text.\n  ts: /** The arguments of `readFile`. */\n    export interface ReadFileInput {\n"),
        "{text}"
    );
    assert!(
        text.ends_with("\n    export function readFile(input: ReadFileInput): Promise<unknown>;\n  py: def read_file(path: str) -> Any\n"),
        "{text}"
    );
    assert_eq!(
        crate::catalog::text_entry(&json!({"name": "a__b", "server_status": "reconnecting"})),
        "a__b (its server is reconnecting)\n"
    );
    assert_eq!(top["server"], "fs");
}

#[test]
fn get_returns_the_full_definition_with_examples() {
    let index = SearchIndex::build(&catalog(1));
    let t = index.get("fs__read_file").unwrap();
    let keys: Vec<&String> = t.as_object().unwrap().keys().collect();
    assert_eq!(
        keys,
        [
            "description",
            "example",
            "input_schema",
            "name",
            "output_schema",
            "python",
            "server",
            "title",
            "tool",
            "typescript"
        ]
    );
    assert_eq!(t["python"], "def read_file(path: str) -> Any");
    assert_eq!(
        t["example"],
        json!({"python": "from servers.fs import read_file\nread_file(\"...\")",
               "typescript": "import { readFile } from \"/servers/fs/index.ts\";\nawait readFile({ path: \"...\" });"})
    );
    assert!(t["typescript"]
        .as_str()
        .unwrap()
        .ends_with("export function readFile(input: ReadFileInput): Promise<unknown>;\n"));
    assert_eq!(t["title"], Value::Null);
    assert_eq!(index.get("fs__nope"), None);
    assert_eq!(index.version(), 1);
}

#[test]
fn an_empty_catalog() {
    let index = SearchIndex::build(&Catalog::default());
    let page = index.search(&query("anything"), &all).unwrap();
    assert_eq!((page.total, page.next_cursor), (0, None));
    assert_eq!(index.search(&query(""), &all).unwrap().total, 0);
    let q = SearchQuery {
        server: Some("x".into()),
        ..query("")
    };
    assert!(index
        .search(&q, &all)
        .unwrap_err()
        .to_string()
        .ends_with("no servers are connected"));
}
