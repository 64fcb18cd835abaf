//! TLS configuration of the proxy: the verified client it uses upstream, the server it
//! shows a sandbox when intercepting, and the CA bundle the sandbox trusts.
//!
//! One crypto provider throughout: aws-lc-rs, the one reqwest already builds.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::ResolvesServerCert;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("egress: cannot read extra root {path}: {why}")]
    ExtraRoot { path: PathBuf, why: String },
    #[error("egress: cannot {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("egress: TLS configuration failed")]
    Config(#[source] rustls::Error),
}

type Result<T> = std::result::Result<T, Error>;

/// The crypto provider of every TLS configuration here.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The roots the proxy trusts upstream.
pub struct Roots {
    /// The host's roots (as rustls-native-certs finds them).
    pub system: Vec<CertificateDer<'static>>,
    /// `extra_roots` of the policy.
    pub extra: Vec<CertificateDer<'static>>,
}

impl Roots {
    /// The host's roots and the PEM files in `extra`. The host having none is logged, not
    /// an error (a test machine may trust only extra roots); an unreadable extra root is.
    pub fn load(extra: &[PathBuf]) -> Result<Roots> {
        let found = rustls_native_certs::load_native_certs();
        for err in found.errors.iter().take(3) {
            tracing::warn!(err = %err, "egress: a system trust root could not be loaded");
        }
        if found.certs.is_empty() {
            tracing::warn!(
                "egress: no system trust roots found; only extra_roots are trusted upstream"
            );
        }
        let mut extra_certs = Vec::new();
        for path in extra {
            let bad = |why: String| Error::ExtraRoot {
                path: path.clone(),
                why,
            };
            let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                .map_err(|e| bad(e.to_string()))?
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| bad(e.to_string()))?;
            if certs.is_empty() {
                return Err(bad("it holds no PEM certificate".into()));
            }
            extra_certs.extend(certs);
        }
        Ok(Roots {
            system: found.certs,
            extra: extra_certs,
        })
    }

    /// The client configuration for upstream connections: these roots, HTTP/1.1 only.
    pub fn client_config(&self) -> Result<Arc<ClientConfig>> {
        let mut store = RootCertStore::empty();
        let (added, ignored) = store.add_parsable_certificates(self.system.iter().cloned());
        if ignored > 0 {
            tracing::debug!(added, ignored, "egress: some system roots were not usable");
        }
        for cert in &self.extra {
            store.add(cert.clone()).map_err(Error::Config)?;
        }
        let mut config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(Error::Config)?
            .with_root_certificates(store)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

/// Always the same certificate: the leaf for the CONNECT target, whatever SNI says.
#[derive(Debug)]
struct FixedCert(Arc<CertifiedKey>);

impl ResolvesServerCert for FixedCert {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// The server configuration shown to a sandbox for one intercepted host (HTTP/1.1 only).
pub fn intercept_config(leaf: Arc<CertifiedKey>) -> Result<Arc<ServerConfig>> {
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(Error::Config)?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(FixedCert(leaf)));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Writes `<state_dir>/egress-trust/ca-bundle.pem` (directory 0755, file 0644): the
/// host's roots, the extra roots and the codebox CA, atomically replaced.
pub fn write_trust_bundle(
    state_dir: &Path,
    roots: &Roots,
    ca_pem: Option<&str>,
) -> Result<PathBuf> {
    let dir = state_dir.join("egress-trust");
    let io = |action, path: &Path| {
        let path = path.to_path_buf();
        move |source| Error::Io {
            action,
            path,
            source,
        }
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&dir)
        .map_err(io("create", &dir))?;
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755))
        .map_err(io("set the mode of", &dir))?;
    let mut text = String::new();
    for der in roots.system.iter().chain(&roots.extra) {
        let config = pem::EncodeConfig::new().set_line_ending(pem::LineEnding::LF);
        text.push_str(&pem::encode_config(
            &pem::Pem::new("CERTIFICATE", der.to_vec()),
            config,
        ));
    }
    if let Some(ca) = ca_pem {
        text.push_str(
            "# codebox egress CA: TLS to hosts with credentials is terminated by the proxy\n",
        );
        text.push_str(ca);
        if !ca.ends_with('\n') {
            text.push('\n');
        }
    }
    let mut tmp = tempfile::Builder::new()
        .prefix(".ca-bundle-")
        .tempfile_in(&dir)
        .map_err(io("create a temporary file in", &dir))?;
    tmp.write_all(text.as_bytes())
        .map_err(io("write", tmp.path()))?;
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o644))
        .map_err(io("set the mode of", tmp.path()))?;
    let bundle = dir.join("ca-bundle.pem");
    tmp.persist(&bundle).map_err(|e| {
        tracing::error!(err = %e.error, path = %bundle.display(), "cannot write the sandbox CA bundle");
        Error::Io {
            action: "write",
            path: bundle.clone(),
            source: e.error,
        }
    })?;
    Ok(dir)
}
