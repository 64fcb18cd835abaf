//! The book (`docs/src`) and the README say what `codebox.toml` accepts: every ```toml
//! block in them (one whose info string is exactly `toml`) is parsed by the real loader,
//! unknown keys and wrong types refused as they would be at start-up. A block of another
//! file says so in its info string (```toml,recipe: `rootfs/recipe.toml`) and is left out.

use std::path::{Path, PathBuf};

fn pages(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            pages(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// `(first line, text)` of each fenced block whose info string is `info`.
fn blocks(text: &str, info: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut open: Option<(usize, bool, String)> = None;
    for (n, line) in text.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        match (&mut open, fence) {
            (None, Some(rest)) => open = Some((n + 1, rest.trim() == info, String::new())),
            (Some(_), Some(_)) => {
                let (start, wanted, body) = open.take().unwrap();
                if wanted {
                    out.push((start, body));
                }
            }
            (Some((_, _, body)), None) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {}
        }
    }
    out
}

#[test]
fn every_codebox_toml_snippet_parses() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    pages(&root.join("docs/src"), &mut files);
    let mut checked = 0;
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (line, body) in blocks(&text, "toml") {
            checked += 1;
            let shown = format!("{}:{line}", file.strip_prefix(root).unwrap().display());
            if let Err(e) = codebox::config::Config::parse(&body, Path::new(&shown)) {
                failures.push(format!("{shown}: {e}"));
            }
        }
    }
    assert!(
        checked >= 10,
        "only {checked} snippets found: is the book there?"
    );
    assert!(
        failures.is_empty(),
        "snippets the loader refuses:\n{}",
        failures.join("\n")
    );
}

#[test]
fn a_wrong_snippet_would_be_caught() {
    let text = "x\n```toml\nno_such_key = 1\n```\n```toml,recipe\n[python]\n```\n";
    let found = blocks(text, "toml");
    assert_eq!(found.len(), 1);
    assert!(codebox::config::Config::parse(&found[0].1, Path::new("t")).is_err());
}
