//! The generated TypeScript wrappers as MCP resources, `codebox://servers/<server>/<tool>.ts`,
//! for clients that browse resources: the same files sandboxed code sees at `/servers`.

use std::path::Path;

use rmcp::model::Resource;

/// The answer to a read of `uri` that names nothing readable: `why` as the message and
/// the URI in `data` (SEP-2164; rmcp sends `-32002` to 2025-11-25 peers, `-32602` to
/// later ones).
pub fn not_found(why: impl Into<String>, uri: &str) -> rmcp::ErrorData {
    rmcp::ErrorData::resource_not_found(why.into(), Some(serde_json::json!({ "uri": uri })))
}

/// URI prefix of the wrapper files.
pub const PREFIX: &str = "codebox://servers/";

/// Every `.ts` file of the wrapper tree at `dir`, sorted.
pub fn list(dir: &Path) -> Vec<Resource> {
    let mut files = Vec::new();
    collect(dir, "", 0, &mut files);
    files.sort();
    files
        .into_iter()
        .map(|(rel, size)| {
            let mut r = Resource::new(format!("{PREFIX}{rel}"), rel.clone());
            r.mime_type = Some("text/x-typescript".into());
            r.size = Some(size);
            r
        })
        .collect()
}

fn collect(dir: &Path, prefix: &str, depth: usize, out: &mut Vec<(String, u64)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(name) = e.file_name().into_string() else {
            continue;
        };
        let Ok(meta) = e.metadata() else { continue };
        if meta.is_dir() && depth == 0 {
            collect(&e.path(), &format!("{prefix}{name}/"), depth + 1, out);
        } else if meta.is_file() && name.ends_with(".ts") {
            out.push((format!("{prefix}{name}"), meta.len()));
        }
    }
}

/// The text of the wrapper file `uri` names, or why there is none.
pub fn read(dir: &Path, uri: &str) -> Result<String, String> {
    let rel = uri.strip_prefix(PREFIX).ok_or_else(|| {
        format!("unknown resource {uri:?}: codebox's resources start with {PREFIX}")
    })?;
    let parts: Vec<&str> = rel.split('/').collect();
    let plain = |p: &&str| {
        !p.is_empty()
            && *p != "."
            && *p != ".."
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
    };
    if parts.is_empty() || parts.len() > 2 || !parts.iter().all(plain) || !rel.ends_with(".ts") {
        return Err(format!("unknown resource {uri:?}"));
    }
    let text =
        std::fs::read_to_string(dir.join(rel)).map_err(|_| format!("unknown resource {uri:?}"))?;
    crate::server::tools::render::fits_wire(&text, &format!("{uri:?}"))?;
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_and_reads_only_wrapper_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("time")).unwrap();
        std::fs::write(dir.path().join("client.ts"), "export {}").unwrap();
        std::fs::write(dir.path().join("time/index.ts"), "export * from './x.ts'").unwrap();
        std::fs::write(dir.path().join("time/__init__.py"), "").unwrap();
        std::fs::write(dir.path().join("secret.txt"), "no").unwrap();
        let uris: Vec<String> = list(dir.path()).into_iter().map(|r| r.uri).collect();
        assert_eq!(
            uris,
            [
                "codebox://servers/client.ts",
                "codebox://servers/time/index.ts"
            ]
        );
        assert_eq!(
            read(dir.path(), "codebox://servers/time/index.ts").unwrap(),
            "export * from './x.ts'"
        );
        for bad in [
            "codebox://servers/../etc/passwd",
            "codebox://servers/time/../../x.ts",
            "codebox://servers/secret.txt",
            "codebox://servers/time/__init__.py",
            "file:///etc/passwd",
            "codebox://servers/a/b/c.ts",
            "codebox://servers/nope.ts",
        ] {
            assert!(read(dir.path(), bad).is_err(), "{bad}");
        }
    }
}
