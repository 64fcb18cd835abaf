//! `cargo xtask docs`: the book (`docs/`, mdBook) built into target/book, with its
//! configuration reference rendered again from the configuration types and every
//! internal link checked.
//!
//! 1. mdBook, pinned, installed into target/tools (`cargo install`) unless it is there;
//! 2. `docs/src/reference/configuration.md` written again from the types (the codebox
//!    crate's own test, `CODEBOX_UPDATE_DOCS=1`); with `--check` it is compared instead
//!    (CI: a stale page fails);
//! 3. `mdbook build docs`;
//! 4. every relative link of every chapter (`[text](path.md#anchor)`, images, and links
//!    out of the book into the repository, e.g. `../../src/`) must name a file that
//!    exists, and an anchor a heading of that page (mdBook's slugs). External links
//!    (`https:`) are not followed: nothing else is reachable here.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::test::{cargo_command, run_checked, workspace_root};

/// The mdBook `cargo xtask docs` installs (a new version is taken on purpose).
const MDBOOK_VERSION: &str = "0.5.4";

const HELP: &str = "\
cargo xtask docs [--check]

Builds the book (docs/, mdBook) into target/book: installs mdBook into target/tools if
needed, writes docs/src/reference/configuration.md from the configuration types, builds,
and checks every internal link and anchor.

  --check   compare the configuration reference with the types instead of writing it
            (what CI runs)
";

pub fn run(args: &[OsString]) -> Result<()> {
    let mut check = false;
    for a in args {
        match a.to_str() {
            Some("--check") => check = true,
            Some("-h" | "--help") => {
                print!("{HELP}");
                return Ok(());
            }
            _ => bail!("unknown option {a:?}; see `cargo xtask docs --help`"),
        }
    }
    let root = workspace_root();
    build(&root, check)
}

/// Steps 1–4 above.
pub fn build(root: &Path, check: bool) -> Result<()> {
    let mdbook = ensure_mdbook(root)?;
    let mut reference = cargo_command(
        root,
        &[
            "test",
            "--lib",
            "--quiet",
            "config::reference::tests::the_books_configuration_reference_is_current",
        ],
    );
    if !check {
        reference.env("CODEBOX_UPDATE_DOCS", "1");
    }
    run_checked(&mut reference, "the configuration reference")?;
    run_checked(
        Command::new(&mdbook)
            .arg("build")
            .arg(root.join("docs"))
            .arg("--dest-dir")
            .arg(root.join("target/book")),
        "mdbook build",
    )?;
    let broken = broken_links(&root.join("docs/src"), root)?;
    if !broken.is_empty() {
        bail!("broken links in the book:\n  {}", broken.join("\n  "));
    }
    println!("book: {}", root.join("target/book/index.html").display());
    Ok(())
}

/// target/tools/bin/mdbook, installed with `cargo install` when missing or another version.
fn ensure_mdbook(root: &Path) -> Result<PathBuf> {
    let tools = root.join("target/tools");
    let bin = tools.join("bin/mdbook");
    let installed = Command::new(&bin)
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
    if installed.is_some_and(|v| v.contains(MDBOOK_VERSION)) {
        return Ok(bin);
    }
    run_checked(
        Command::new("cargo")
            .args([
                "install",
                "mdbook",
                "--version",
                MDBOOK_VERSION,
                "--locked",
                "--no-default-features",
                "--features",
                "search",
                "--root",
            ])
            .arg(&tools),
        "cargo install mdbook",
    )?;
    Ok(bin)
}

/// Every relative link (and anchor) of the chapters under `src` that does not resolve.
pub fn broken_links(src: &Path, repo: &Path) -> Result<Vec<String>> {
    let mut pages = Vec::new();
    walk(src, &mut pages)?;
    let mut anchors: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    for page in &pages {
        let text = std::fs::read_to_string(page)
            .with_context(|| format!("cannot read {}", page.display()))?;
        anchors.insert(page.clone(), headings(&text));
    }
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page)?;
        for (line, target) in links(&text) {
            let shown = format!(
                "{}:{line}: {target}",
                page.strip_prefix(repo).unwrap_or(page).display()
            );
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let file = if path.is_empty() {
                page.clone()
            } else {
                page.parent().expect("a page has a directory").join(path)
            };
            let Ok(file) = file.canonicalize() else {
                broken.push(format!("{shown} (no such file)"));
                continue;
            };
            if !file.starts_with(repo) {
                broken.push(format!("{shown} (outside the repository)"));
                continue;
            }
            if let Some(anchor) = anchor {
                match anchors.get(&file) {
                    Some(known) if known.contains(anchor) => {}
                    Some(_) => broken.push(format!("{shown} (no heading with this anchor)")),
                    None => {
                        // A file outside the book: only a Markdown file's headings can
                        // be checked.
                        let text = std::fs::read_to_string(&file).unwrap_or_default();
                        if file.extension().is_some_and(|e| e == "md")
                            && !headings(&text).contains(anchor)
                        {
                            broken.push(format!("{shown} (no heading with this anchor)"));
                        }
                    }
                }
            }
        }
    }
    Ok(broken)
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            walk(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path.canonicalize()?);
        }
    }
    Ok(())
}

/// `(line, target)` of every inline link and image outside code, `[x](target "title")`.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code spans are not links.
        let mut plain = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                plain.push_str(part);
            }
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            if !target.is_empty() {
                out.push((n + 1, target.to_string()));
            }
            rest = &after[end.min(after.len())..];
        }
    }
    out
}

/// The anchors mdBook gives a page's headings: lower case, spaces to `-`, only
/// alphanumerics, `-` and `_` kept; repeated ones numbered `-1`, `-2`.
fn headings(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#').trim();
        let slug: String = title
            .chars()
            .filter_map(|c| {
                if c.is_alphanumeric() || c == '-' || c == '_' {
                    Some(c.to_lowercase().next().unwrap_or(c))
                } else if c == ' ' {
                    Some('-')
                } else {
                    None
                }
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        let id = if *n == 0 {
            slug.clone()
        } else {
            format!("{slug}-{n}")
        };
        *n += 1;
        out.insert(id);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_are_mdbooks_slugs() {
        let h = headings("# Quick start: code mode\n## `[http]`\n## Again\n## Again\n```\n# not a heading\n```\n");
        for want in ["quick-start-code-mode", "http", "again", "again-1"] {
            assert!(h.contains(want), "{want}: {h:?}");
        }
        assert!(!h.contains("not-a-heading"));
    }

    #[test]
    fn links_outside_code_are_found() {
        let l =
            links("see [a](a.md#x) and `[b](b.md)`\n```\n[c](c.md)\n```\n![img](i.png \"t\")\n");
        let targets: Vec<&str> = l.iter().map(|(_, t)| t.as_str()).collect();
        assert_eq!(targets, ["a.md#x", "i.png"]);
    }

    #[test]
    fn broken_links_and_anchors_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        std::fs::create_dir(&src).unwrap();
        std::fs::write(
            src.join("a.md"),
            "# A\n## Part one\n[ok](b.md#b) [self](#part-one)\n",
        )
        .unwrap();
        std::fs::write(
            src.join("b.md"),
            "# B\n[gone](c.md) [anchor](a.md#nope) [web](https://x.test/)\n",
        )
        .unwrap();
        let repo = dir.path().canonicalize().unwrap();
        let broken = broken_links(&src, &repo).unwrap();
        assert_eq!(broken.len(), 2, "{broken:?}");
        assert!(broken[0].contains("c.md (no such file)"), "{broken:?}");
        assert!(broken[1].contains("a.md#nope (no heading"), "{broken:?}");
    }
}
