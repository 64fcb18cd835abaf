//! The OCI image layout's JSON documents as data (image-spec v1.1): the image config, the
//! manifest, the index and `oci-layout`. Digests are computed by the caller from the bytes
//! written; nothing here touches the filesystem, so every document is unit-tested.

use serde_json::{json, Value};

pub const MEDIA_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const MEDIA_INDEX: &str = "application/vnd.oci.image.index.v1+json";

/// A blob as descriptors name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Blob {
    /// `sha256:<hex>` of the bytes as stored.
    pub digest: String,
    pub size: u64,
}

/// One layer: the compressed blob and the digest of its uncompressed tar (`diff_id`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layer {
    pub blob: Blob,
    pub diff_id: String,
    /// What it holds, for the config's history.
    pub created_by: String,
}

/// What the image runs and how.
#[derive(Debug, Clone)]
pub struct Runtime {
    /// `uid:gid`: never 0.
    pub user: String,
    pub entrypoint: Vec<String>,
    pub env: Vec<String>,
    pub working_dir: String,
    pub exposed_port: u16,
    pub labels: Vec<(String, String)>,
}

/// The image configuration (`application/vnd.oci.image.config.v1+json`).
pub fn config(arch: &str, runtime: &Runtime, layers: &[Layer]) -> Value {
    let labels: serde_json::Map<String, Value> = runtime
        .labels
        .iter()
        .map(|(k, v)| (k.clone(), Value::String(v.clone())))
        .collect();
    json!({
        // Fixed: the same inputs give the same image digest.
        "created": "1970-01-01T00:00:00Z",
        "architecture": arch,
        "os": "linux",
        "config": {
            "User": runtime.user,
            "Entrypoint": runtime.entrypoint,
            "Env": runtime.env,
            "WorkingDir": runtime.working_dir,
            "ExposedPorts": { format!("{}/tcp", runtime.exposed_port): {} },
            "Labels": labels,
            // serve drains running executions on SIGTERM.
            "StopSignal": "SIGTERM",
        },
        "rootfs": {
            "type": "layers",
            "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>(),
        },
        "history": layers.iter().map(|l| json!({
            "created": "1970-01-01T00:00:00Z",
            "created_by": l.created_by,
        })).collect::<Vec<_>>(),
    })
}

/// The image manifest for a config blob and its layers.
pub fn manifest(config: &Blob, layers: &[Layer], annotations: &[(String, String)]) -> Value {
    let mut m = json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_MANIFEST,
        "config": descriptor(MEDIA_CONFIG, config),
        "layers": layers.iter().map(|l| descriptor(MEDIA_LAYER_GZIP, &l.blob)).collect::<Vec<_>>(),
    });
    if !annotations.is_empty() {
        m["annotations"] = annotations
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
    m
}

/// `index.json`: the manifest under the reference name `tag`.
pub fn index(manifest: &Blob, tag: &str, arch: &str) -> Value {
    let mut d = descriptor(MEDIA_MANIFEST, manifest);
    d["platform"] = json!({ "architecture": arch, "os": "linux" });
    d["annotations"] = json!({ "org.opencontainers.image.ref.name": tag });
    json!({
        "schemaVersion": 2,
        "mediaType": MEDIA_INDEX,
        "manifests": [d],
    })
}

/// The `oci-layout` file.
pub fn layout_file() -> Value {
    json!({ "imageLayoutVersion": "1.0.0" })
}

fn descriptor(media_type: &str, blob: &Blob) -> Value {
    json!({ "mediaType": media_type, "digest": blob.digest, "size": blob.size })
}

/// OCI's architecture name for Rust's `arch`.
pub fn oci_arch(arch: &str) -> Option<&'static str> {
    match arch {
        "x86_64" => Some("amd64"),
        "aarch64" => Some("arm64"),
        _ => None,
    }
}

/// A reference name the layout may carry (image-spec: `[A-Za-z0-9._:@/+-]`, tag-like,
/// at most 128 characters, not starting with a separator).
pub fn valid_tag(tag: &str) -> bool {
    !tag.is_empty()
        && tag.len() <= 128
        && tag
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(n: u8) -> Blob {
        Blob {
            digest: format!("sha256:{}", format!("{n:02x}").repeat(32)),
            size: u64::from(n) * 100,
        }
    }

    fn runtime() -> Runtime {
        Runtime {
            user: "65532:65532".into(),
            entrypoint: vec!["codebox".into(), "serve".into(), "--http".into()],
            env: vec!["CODEBOX_HTTP_ADDR=0.0.0.0:8080".into()],
            working_dir: "/var/lib/codebox".into(),
            exposed_port: 8080,
            labels: vec![("org.opencontainers.image.version".into(), "0.1.0".into())],
        }
    }

    fn layers() -> Vec<Layer> {
        (1..=3)
            .map(|n| Layer {
                blob: blob(n),
                diff_id: blob(n + 10).digest,
                created_by: format!("layer {n}"),
            })
            .collect()
    }

    #[test]
    fn config_runs_serve_http_as_a_non_root_user_with_layers_in_order() {
        let c = config("amd64", &runtime(), &layers());
        assert_eq!(c["config"]["User"], "65532:65532");
        assert_eq!(
            c["config"]["Entrypoint"],
            json!(["codebox", "serve", "--http"])
        );
        assert!(c["config"]["ExposedPorts"]["8080/tcp"].is_object());
        assert_eq!(c["rootfs"]["diff_ids"][0], blob(11).digest);
        assert_eq!(c["rootfs"]["diff_ids"][2], blob(13).digest);
        assert_eq!(c["history"].as_array().unwrap().len(), 3);
        assert_eq!(c["os"], "linux");
    }

    #[test]
    fn manifest_and_index_point_at_their_blobs() {
        let m = manifest(&blob(9), &layers(), &[]);
        assert_eq!(m["schemaVersion"], 2);
        assert_eq!(m["config"]["digest"], blob(9).digest);
        assert_eq!(m["config"]["mediaType"], MEDIA_CONFIG);
        assert_eq!(m["layers"][1]["size"], 200);
        assert_eq!(m["layers"][1]["mediaType"], MEDIA_LAYER_GZIP);
        assert!(m.get("annotations").is_none());
        let i = index(&blob(7), "0.1.0", "amd64");
        assert_eq!(i["manifests"][0]["digest"], blob(7).digest);
        assert_eq!(
            i["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
            "0.1.0"
        );
        assert_eq!(i["manifests"][0]["mediaType"], MEDIA_MANIFEST);
    }

    #[test]
    fn tags_are_checked() {
        for good in ["0.1.0", "latest", "v1_2-rc.3"] {
            assert!(valid_tag(good), "{good}");
        }
        for bad in ["", "-x", ".x", "a/b", "a b", "a:b", &"x".repeat(129)] {
            assert!(!valid_tag(bad), "{bad}");
        }
        assert_eq!(oci_arch("x86_64"), Some("amd64"));
        assert_eq!(oci_arch("mips"), None);
    }
}
