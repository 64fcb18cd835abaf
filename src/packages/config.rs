//! `[packages]` in `codebox.toml`: packages on request — where the installer may fetch
//! from, which packages may be asked for, and the sizes and time it may take.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::units::{parse_duration, parse_size};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("packages.{key}: {why}")]
    Invalid { key: &'static str, why: String },
}

/// The section as written.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PackagesSection {
    /// Packages on request (`packages`, and a TypeScript program's `npm:`/`jsr:`
    /// imports): on unless `false`.
    pub enabled: Option<bool>,
    /// The Python index's simple API (`https://host/simple`); default: the index of the
    /// rootfs's own pip.
    pub python_index: Option<String>,
    /// Further `https://host` origins the Python installer may fetch from (where the index
    /// keeps its files); default: the rootfs pip's file host, when the index is its
    /// default.
    pub python_files: Option<Vec<String>>,
    /// The npm registry (`https://host/`); default: the host's `npm config get registry`.
    pub npm_registry: Option<String>,
    /// The JSR registry (`https://host/`); no default: `jsr:` packages need it set.
    pub jsr_registry: Option<String>,
    /// Non-public addresses of a private index or registry (as `[network] allow_private`).
    #[serde(default)]
    pub allow_private: Vec<String>,
    /// CA certificates (PEM files) the installer trusts for the index and registries
    /// besides the system's, e.g. a private mirror's; `[network] extra_roots` are trusted
    /// too.
    #[serde(default)]
    pub extra_roots: Vec<PathBuf>,
    /// Package names (globs with `*`) that may be asked for; empty: any.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Package names (globs) refused whatever `allow` says.
    #[serde(default)]
    pub deny: Vec<String>,
    /// The most one installed set may take on disk (default 512M).
    pub max_layer_size: Option<String>,
    /// The most all kept sets may take together; the least recently used are removed
    /// past it (default 4G).
    pub cache_size: Option<String>,
    /// How long one install may take (default 3m).
    pub install_timeout: Option<String>,
    /// How long a request that is not fully pinned (`rich`, `pandas>=2`) keeps the set it
    /// resolved to before the next such request resolves it again (default 24h; exact
    /// pins never need it).
    pub refresh_unpinned: Option<String>,
    /// Where installed sets are kept (default `<state_dir>/layers`).
    pub cache_dir: Option<PathBuf>,
}

/// The limits of packages on request, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub max_layer_bytes: u64,
    pub cache_bytes: u64,
    pub install_timeout: Duration,
    pub refresh_unpinned: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_layer_bytes: 512 << 20,
            cache_bytes: 4 << 30,
            install_timeout: Duration::from_secs(180),
            refresh_unpinned: Duration::from_secs(24 * 3600),
        }
    }
}

impl PackagesSection {
    pub fn enabled(&self) -> bool {
        self.enabled != Some(false)
    }

    pub fn limits(&self) -> Result<Limits, Error> {
        let mut l = Limits::default();
        let size = |key: &'static str, v: &str| {
            parse_size(v).map_err(|e| Error::Invalid {
                key,
                why: e.to_string(),
            })
        };
        if let Some(v) = &self.max_layer_size {
            l.max_layer_bytes = size("max_layer_size", v)?;
        }
        if let Some(v) = &self.cache_size {
            l.cache_bytes = size("cache_size", v)?;
        }
        if let Some(v) = &self.install_timeout {
            l.install_timeout = parse_duration(v).map_err(|e| Error::Invalid {
                key: "install_timeout",
                why: e.to_string(),
            })?;
        }
        if let Some(v) = &self.refresh_unpinned {
            l.refresh_unpinned = parse_duration(v).map_err(|e| Error::Invalid {
                key: "refresh_unpinned",
                why: e.to_string(),
            })?;
        }
        if l.max_layer_bytes < 1 << 20 {
            return Err(Error::Invalid {
                key: "max_layer_size",
                why: "must be at least 1M".into(),
            });
        }
        if l.cache_bytes < l.max_layer_bytes {
            return Err(Error::Invalid {
                key: "cache_size",
                why: "must hold at least one layer (max_layer_size)".into(),
            });
        }
        if l.install_timeout.is_zero() {
            return Err(Error::Invalid {
                key: "install_timeout",
                why: "must be more than 0".into(),
            });
        }
        Ok(l)
    }
}

/// Which names may be asked for: `deny` first, then `allow` (empty: any).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NamePolicy {
    allow: Vec<String>,
    deny: Vec<String>,
}

impl NamePolicy {
    pub fn new(allow: &[String], deny: &[String]) -> Result<NamePolicy, Error> {
        let check = |key: &'static str, list: &[String]| -> Result<Vec<String>, Error> {
            list.iter()
                .map(|p| {
                    let p = p.trim().to_ascii_lowercase();
                    if p.is_empty()
                        || p.len() > 200
                        || !p.chars().all(|c| {
                            c.is_ascii_alphanumeric()
                                || matches!(c, '-' | '_' | '.' | '*' | '@' | '/')
                        })
                    {
                        return Err(Error::Invalid {
                            key,
                            why: format!("{p:?} is not a package name or glob"),
                        });
                    }
                    Ok(p)
                })
                .collect()
        };
        Ok(NamePolicy {
            allow: check("allow", allow)?,
            deny: check("deny", deny)?,
        })
    }

    /// `None` when `name` may be installed, else why not.
    pub fn refuses(&self, name: &str) -> Option<String> {
        let name = name.to_ascii_lowercase();
        if let Some(d) = self.deny.iter().find(|d| glob(d, &name)) {
            return Some(format!("denied by packages.deny rule {d}"));
        }
        if !self.allow.is_empty() && !self.allow.iter().any(|a| glob(a, &name)) {
            return Some("not in packages.allow".into());
        }
        None
    }
}

/// `*` matches any run of characters; everything else itself.
fn glob(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || !text[first.len()..].ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_bad_values() {
        let s: PackagesSection = toml::from_str("").unwrap();
        assert!(s.enabled());
        assert_eq!(s.limits().unwrap(), Limits::default());
        let s: PackagesSection =
            toml::from_str("max_layer_size = \"2G\"\ncache_size = \"1G\"").unwrap();
        assert!(s.limits().unwrap_err().to_string().contains("cache_size"));
        let s: PackagesSection = toml::from_str("install_timeout = \"soon\"").unwrap();
        assert!(s.limits().is_err());
        let s: PackagesSection = toml::from_str("refresh_unpinned = \"2h\"").unwrap();
        assert_eq!(
            s.limits().unwrap().refresh_unpinned,
            Duration::from_secs(7200)
        );
        let s: PackagesSection = toml::from_str("refresh_unpinned = \"-1\"").unwrap();
        assert!(s
            .limits()
            .unwrap_err()
            .to_string()
            .contains("refresh_unpinned"));
        assert!(toml::from_str::<PackagesSection>("alow = []").is_err());
        let s: PackagesSection = toml::from_str("enabled = false").unwrap();
        assert!(!s.enabled());
    }

    #[test]
    fn deny_wins_and_an_empty_allow_allows_any() {
        let p = NamePolicy::new(&[], &["evil-*".into(), "@bad/*".into()]).unwrap();
        assert!(p.refuses("pandas").is_none());
        assert!(p.refuses("Evil-Pkg").unwrap().contains("evil-*"));
        assert!(p.refuses("@bad/thing").is_some());
        let p =
            NamePolicy::new(&["pandas".into(), "numpy*".into()], &["numpy-evil".into()]).unwrap();
        assert!(p.refuses("pandas").is_none());
        assert!(p.refuses("numpy-financial").is_none());
        assert!(p.refuses("numpy-evil").is_some());
        assert!(p.refuses("rich").unwrap().contains("packages.allow"));
        assert!(NamePolicy::new(&["a b".into()], &[]).is_err());
    }

    #[test]
    fn globs() {
        assert!(glob("a*c", "abc") && glob("a*c", "ac") && !glob("a*c", "ab"));
        assert!(glob("*", "anything") && glob("*x*", "axb") && !glob("*x*", "ab"));
        assert!(glob("a*b*c", "a1b2c") && !glob("a*b*c", "a1c2b"));
    }
}
