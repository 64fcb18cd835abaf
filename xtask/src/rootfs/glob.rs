//! Shell-style wildcards for one path component: `*` matches any run of characters, `?`
//! exactly one. Used by the recipe's exclusion lists and by `include` lines of
//! `/etc/ld.so.conf`. Nothing else (no `[...]`, no `**`) is needed by either.

/// Does `name` match `pattern` as a whole?
pub fn matches(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    // Greedy matching with one backtrack point: the classic linear-time algorithm.
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ni));
                pi += 1;
            }
            Some(&c) if c == '?' || c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp + 1;
                    ni = sn + 1;
                    star = Some((sp, sn + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Does the relative path `rel` (components joined by `/`) match `pattern` component by
/// component? `lib-dynload/_test*` matches `lib-dynload/_testcapi.so` but not `a/lib-dynload/x`.
pub fn matches_path(pattern: &str, rel: &str) -> bool {
    let mut p = pattern.split('/');
    let mut r = rel.split('/');
    loop {
        match (p.next(), r.next()) {
            (None, None) => return true,
            (Some(pc), Some(rc)) if matches(pc, rc) => {}
            _ => return false,
        }
    }
}

/// Does `s` contain a wildcard character?
pub fn has_wildcard(s: &str) -> bool {
    s.contains(['*', '?'])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_and_wildcards() {
        assert!(matches("turtle.py", "turtle.py"));
        assert!(!matches("turtle.py", "turtle.pyc"));
        assert!(matches(
            "_test*",
            "_testcapi.cpython-311-x86_64-linux-gnu.so"
        ));
        assert!(matches("_test*", "_test"));
        assert!(!matches("_test*", "test_x"));
        assert!(matches("*.conf", "libc.conf"));
        assert!(!matches("*.conf", "libc.conf.bak"));
        assert!(matches("config-3.*", "config-3.11-x86_64-linux-gnu"));
        assert!(matches("a*b*c", "aXXbYYbc"));
        assert!(!matches("a*b*c", "aXXbYY"));
        assert!(matches("?", "x"));
        assert!(!matches("?", ""));
        assert!(matches("*", ""));
    }

    #[test]
    fn path_patterns_are_anchored_per_component() {
        assert!(matches_path(
            "lib-dynload/_xx*",
            "lib-dynload/_xxsubinterpreters.so"
        ));
        assert!(!matches_path("lib-dynload/_xx*", "x/lib-dynload/_xx.so"));
        assert!(!matches_path("test", "test/support"));
        assert!(matches_path("test", "test"));
        assert!(!matches_path("*", "a/b"));
    }
}
