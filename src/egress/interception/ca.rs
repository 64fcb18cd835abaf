//! The per-installation certificate authority that signs the leaf certificates the proxy
//! shows a sandbox when it terminates TLS to add credentials.
//!
//! `<state_dir>/egress-ca/` (mode 0700) holds `ca.key` (PKCS#8 PEM, 0600) and `ca.pem`.
//! It is made at first use, atomically: both files are written into a fresh temporary
//! directory beside it, which is then renamed into place; a process that loses that race
//! loads the winner's. A key file that others can read, or that another user owns, is
//! refused. The CA's name carries a digest of its public key, so it can be rebuilt from
//! the key alone (no certificate parser needed) and two installations never share a name.
//!
//! Only the certificate ever reaches a sandbox (in its CA bundle); the key stays here.
//! Leaf certificates (ECDSA P-256, 7 days, serverAuth) are made per host and cached for a
//! day.

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::sign::CertifiedKey;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use sha2::{Digest, Sha256};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("egress CA: cannot {action} {path}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("egress CA: {path} is unsafe: {why}")]
    Unsafe { path: PathBuf, why: String },
    #[error("egress CA: {path} is not a usable key or certificate: {why}")]
    Invalid { path: PathBuf, why: String },
    #[error("egress CA: cannot make a certificate for {host}")]
    Issue {
        host: String,
        #[source]
        source: rcgen::Error,
    },
    #[error("egress CA: cannot use the certificate for {host}: {why}")]
    Key { host: String, why: String },
}

type Result<T> = std::result::Result<T, Error>;

/// Cached leaf certificates are remade after this long (they are valid for 7 days).
const LEAF_REUSE: Duration = Duration::from_secs(24 * 3600);
/// Hosts whose leaf is cached at once; past it the cache starts over.
const LEAF_CACHE: usize = 1024;

/// The CA, able to issue leaf certificates.
pub struct CertAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
    leaves: Mutex<HashMap<String, (Instant, Arc<CertifiedKey>)>>,
}

impl std::fmt::Debug for CertAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertAuthority").finish_non_exhaustive()
    }
}

fn io(action: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Io {
        action,
        path,
        source,
    }
}

/// The CA's parameters, all derived from its key.
fn ca_params(key: &KeyPair) -> CertificateParams {
    let digest = Sha256::digest(key.public_key_raw());
    let id: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, format!("codebox egress CA {id}"));
    dn.push(DnType::OrganizationName, "codebox");
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = time::OffsetDateTime::now_utc() - time::Duration::days(1);
    params.not_after = time::OffsetDateTime::now_utc() + time::Duration::days(3650);
    params
}

impl CertAuthority {
    /// Loads `<state_dir>/egress-ca`, making it first if it does not exist.
    pub fn load_or_create(state_dir: &Path) -> Result<CertAuthority> {
        let dir = state_dir.join("egress-ca");
        if !dir.exists() {
            create(state_dir, &dir)?;
        }
        load(&dir)
    }

    /// The CA certificate, PEM.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A certificate and key for `host` (a DNS name or an IP address), from the cache when
    /// one was made in the last day.
    pub fn leaf(&self, host: &str) -> Result<Arc<CertifiedKey>> {
        {
            let leaves = self.leaves.lock().expect("leaf cache lock");
            if let Some((made, key)) = leaves.get(host) {
                if made.elapsed() < LEAF_REUSE {
                    return Ok(key.clone());
                }
            }
        }
        let key = Arc::new(self.issue(host)?);
        let mut leaves = self.leaves.lock().expect("leaf cache lock");
        if leaves.len() >= LEAF_CACHE {
            leaves.clear();
        }
        leaves.insert(host.to_string(), (Instant::now(), key.clone()));
        Ok(key)
    }

    fn issue(&self, host: &str) -> Result<CertifiedKey> {
        let fail = |source| Error::Issue {
            host: host.to_string(),
            source,
        };
        let key = KeyPair::generate().map_err(fail)?;
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![match host.parse() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(host.to_string().try_into().map_err(fail)?),
        }];
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        params.distinguished_name = dn;
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.use_authority_key_identifier_extension = true;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(7);
        let cert = params.signed_by(&key, &self.issuer).map_err(fail)?;
        let der_key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing =
            rustls::crypto::aws_lc_rs::sign::any_ecdsa_type(&der_key).map_err(|e| Error::Key {
                host: host.to_string(),
                why: e.to_string(),
            })?;
        Ok(CertifiedKey::new(vec![cert.der().clone()], signing))
    }
}

/// Makes the CA in a fresh temporary directory and renames it to `dir`.
fn create(state_dir: &Path, dir: &Path) -> Result<()> {
    // The state directory itself stays traversable (the sandbox trust bundle lives in
    // it); the CA directory is 0700 and the key 0600.
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(state_dir)
        .map_err(io("create", state_dir))?;
    let tmp = tempfile::Builder::new()
        .prefix(".egress-ca-")
        .tempdir_in(state_dir)
        .map_err(io("create a temporary directory in", state_dir))?;
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o700))
        .map_err(io("set the mode of", tmp.path()))?;
    let key = KeyPair::generate().map_err(|source| Error::Issue {
        host: "the CA".into(),
        source,
    })?;
    let cert = ca_params(&key)
        .self_signed(&key)
        .map_err(|source| Error::Issue {
            host: "the CA".into(),
            source,
        })?;
    write_new(
        &tmp.path().join("ca.key"),
        key.serialize_pem().as_bytes(),
        0o600,
    )?;
    write_new(&tmp.path().join("ca.pem"), cert.pem().as_bytes(), 0o644)?;
    let tmp_path = tmp.keep();
    match fs::rename(&tmp_path, dir) {
        Ok(()) => {
            tracing::info!(dir = %dir.display(), "made the egress CA");
            Ok(())
        }
        // Another process made it first: use theirs.
        Err(e) if dir.exists() => {
            tracing::debug!(err = %e, "egress CA made concurrently; using the other one");
            let _ = fs::remove_dir_all(&tmp_path);
            Ok(())
        }
        Err(e) => {
            let _ = fs::remove_dir_all(&tmp_path);
            tracing::error!(err = %e, dir = %dir.display(), "cannot put the egress CA in place");
            Err(io("rename a new CA to", dir)(e))
        }
    }
}

fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io("create", path))?;
    f.write_all(bytes).map_err(io("write", path))?;
    f.sync_all().map_err(io("sync", path))
}

fn load(dir: &Path) -> Result<CertAuthority> {
    let key_path = dir.join("ca.key");
    let meta = fs::metadata(&key_path).map_err(io("read", &key_path))?;
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(Error::Unsafe {
            path: key_path,
            why: format!("it belongs to uid {}, not to this user ({me})", meta.uid()),
        });
    }
    if meta.mode() & 0o077 != 0 {
        return Err(Error::Unsafe {
            path: key_path,
            why: format!(
                "its mode is {:o}; it must be readable by its owner only (0600)",
                meta.mode() & 0o777
            ),
        });
    }
    let key_pem = fs::read_to_string(&key_path).map_err(io("read", &key_path))?;
    let key = KeyPair::from_pem(&key_pem).map_err(|e| Error::Invalid {
        path: key_path.clone(),
        why: e.to_string(),
    })?;
    let cert_path = dir.join("ca.pem");
    let cert_pem = fs::read_to_string(&cert_path).map_err(io("read", &cert_path))?;
    let parsed = pem::parse(&cert_pem).map_err(|e| Error::Invalid {
        path: cert_path.clone(),
        why: e.to_string(),
    })?;
    let holds_key = parsed.tag() == "CERTIFICATE"
        && parsed
            .contents()
            .windows(key.public_key_raw().len())
            .any(|w| w == key.public_key_raw());
    if !holds_key {
        return Err(Error::Invalid {
            path: cert_path,
            why: "it is not the certificate of ca.key".into(),
        });
    }
    Ok(CertAuthority {
        issuer: Issuer::new(ca_params(&key), key),
        cert_pem,
        leaves: Mutex::new(HashMap::new()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn made_once_then_loaded_with_safe_modes() {
        let state = tempfile::tempdir().unwrap();
        let a = CertAuthority::load_or_create(state.path()).unwrap();
        let b = CertAuthority::load_or_create(state.path()).unwrap();
        assert_eq!(
            a.cert_pem(),
            b.cert_pem(),
            "the second start loads the first CA"
        );
        let dir = state.path().join("egress-ca");
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("ca.key")), 0o600);
        assert_eq!(mode(&dir.join("ca.pem")), 0o644);
        let leaf = a.leaf("api.example.com").unwrap();
        assert!(
            Arc::ptr_eq(&leaf, &a.leaf("api.example.com").unwrap()),
            "cached"
        );
        assert!(a.leaf("127.0.0.1").is_ok(), "IP addresses get an IP SAN");

        fs::set_permissions(dir.join("ca.key"), fs::Permissions::from_mode(0o644)).unwrap();
        let err = CertAuthority::load_or_create(state.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("readable by its owner only"), "{err}");
    }

    #[test]
    fn a_certificate_of_another_key_is_refused() {
        let one = tempfile::tempdir().unwrap();
        let two = tempfile::tempdir().unwrap();
        CertAuthority::load_or_create(one.path()).unwrap();
        CertAuthority::load_or_create(two.path()).unwrap();
        fs::copy(
            one.path().join("egress-ca/ca.pem"),
            two.path().join("egress-ca/ca.pem"),
        )
        .unwrap();
        let err = CertAuthority::load_or_create(two.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("not the certificate of ca.key"), "{err}");
    }
}
