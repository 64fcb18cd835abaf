//! What the rootfs already holds for TypeScript: the npm packages cached into its Deno
//! cache (`rootfs/recipe.toml [deno] packages`). A specifier it satisfies needs no
//! install: the runtime resolves it from that cache (`--cached-only`). Only simple
//! ranges are read (`4`, `4.x`, `4.18`, `^4.17.0`, `~4.18.0`, `4.18.1`, none); anything
//! else is installed.

use std::path::{Path, PathBuf};

use super::spec::Spec;

/// The rootfs's Deno cache, seen from the host.
#[derive(Debug, Clone)]
pub struct Preinstalled {
    npm: PathBuf,
}

impl Preinstalled {
    /// `deno_cache` is the host path of the rootfs's Deno cache directory.
    pub fn new(deno_cache: &Path) -> Preinstalled {
        Preinstalled {
            npm: deno_cache.join("npm"),
        }
    }

    /// Whether `spec` (an `npm:` specifier) is satisfied by a cached version.
    pub fn satisfies(&self, spec: &Spec) -> bool {
        let Some(rest) = spec.text.strip_prefix("npm:") else {
            return false;
        };
        let (name, range) = match rest.strip_prefix('@') {
            Some(r) => match r.split_once('@') {
                Some((n, v)) => (format!("@{n}"), v),
                None => (rest.to_string(), ""),
            },
            None => match rest.split_once('@') {
                Some((n, v)) => (n.to_string(), v),
                None => (rest.to_string(), ""),
            },
        };
        let Ok(registries) = std::fs::read_dir(&self.npm) else {
            return false;
        };
        for registry in registries.flatten() {
            let Ok(versions) = std::fs::read_dir(registry.path().join(&name)) else {
                continue;
            };
            for v in versions.flatten() {
                if !v.path().is_dir() {
                    continue;
                }
                if let Some(version) = parse(&v.file_name().to_string_lossy()) {
                    if matches(range, version) {
                        return true;
                    }
                }
            }
        }
        false
    }
}

/// `1.2.3` (no pre-release or build).
fn parse(v: &str) -> Option<(u64, u64, u64)> {
    let mut it = v.split('.').map(|p| p.parse::<u64>());
    let (a, b, c) = (it.next()?.ok()?, it.next()?.ok()?, it.next()?.ok()?);
    it.next().is_none().then_some((a, b, c))
}

fn matches(range: &str, (ma, mi, pa): (u64, u64, u64)) -> bool {
    let range = range.trim();
    if range.is_empty() || range == "*" || range == "latest" {
        return true;
    }
    let num = |s: &str| s.parse::<u64>().ok();
    if let Some(r) = range.strip_prefix('^') {
        return match parse(r) {
            Some((a, b, c)) if a > 0 => ma == a && (mi, pa) >= (b, c),
            Some((0, b, c)) if b > 0 => ma == 0 && mi == b && pa >= c,
            Some((0, 0, c)) => (ma, mi, pa) == (0, 0, c),
            _ => false,
        };
    }
    if let Some(r) = range.strip_prefix('~') {
        return parse(r).is_some_and(|(a, b, c)| ma == a && mi == b && pa >= c);
    }
    let parts: Vec<&str> = range.split('.').collect();
    match parts.as_slice() {
        [a] => num(a) == Some(ma),
        [a, x] if *x == "x" || *x == "*" => num(a) == Some(ma),
        [a, b] => num(a) == Some(ma) && num(b) == Some(mi),
        [a, b, x] if *x == "x" || *x == "*" => num(a) == Some(ma) && num(b) == Some(mi),
        [a, b, c] => (num(a), num(b), num(c)) == (Some(ma), Some(mi), Some(pa)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(text: &str) -> Spec {
        let set = super::super::PackageSet::parse(
            crate::runtime::Language::TypeScript,
            &[text.to_string()],
            "",
        )
        .unwrap()
        .unwrap();
        set.specs[0].clone()
    }

    #[test]
    fn simple_ranges() {
        let v = (4, 18, 1);
        for yes in [
            "", "4", "4.x", "4.18", "4.18.x", "^4.17.0", "^4.18.1", "~4.18.0", "4.18.1",
        ] {
            assert!(matches(yes, v), "{yes}");
        }
        for no in [
            "3", "5.x", "4.17", "^4.19.0", "~4.17.0", "4.18.2", ">=4", "4 || 5",
        ] {
            assert!(!matches(no, v), "{no}");
        }
        assert!(matches("^0.2.1", (0, 2, 5)) && !matches("^0.2.1", (0, 3, 0)));
    }

    #[test]
    fn a_cached_package_satisfies_its_specifiers() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("npm/registry.example/lodash/4.18.1")).unwrap();
        std::fs::create_dir_all(dir.path().join("npm/registry.example/@std/x/1.0.0")).unwrap();
        let p = Preinstalled::new(dir.path());
        assert!(p.satisfies(&spec("npm:lodash")));
        assert!(p.satisfies(&spec("npm:lodash@4")));
        assert!(!p.satisfies(&spec("npm:lodash@5")));
        assert!(p.satisfies(&spec("npm:@std/x@^1.0.0")));
        assert!(!p.satisfies(&spec("npm:zod")));
        assert!(!p.satisfies(&spec("jsr:@std/x@1")));
    }
}
