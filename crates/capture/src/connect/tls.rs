//! TLS for the observer's connection, with OpenSSL through
//! `postgres-openssl`: libpq itself uses OpenSSL, so certificates are
//! checked the same way psql checks them — notably a self-signed server
//! certificate given as `sslrootcert` verifies, which webpki (rustls)
//! rejects as a CA used as an end-entity certificate — and verify-ca (the
//! chain without the host name) is one OpenSSL flag. The cost is a build
//! dependency on libssl-dev (the runtime libssl3 is on every Debian).
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::Result;
use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslVerifyMode};
use postgres_openssl::MakeTlsConnector;

use super::SslMode;
use crate::error::fixable;

/// What the server's certificate is checked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verify {
    /// Encrypt only (sslmode prefer/require without a root certificate).
    None,
    /// Signed by the root certificate (verify-ca).
    Ca,
    /// Signed, and naming the host connected to (verify-full).
    Full,
}

/// The trusted roots: a PEM file, or the system's store (`sslrootcert=system`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RootCert {
    File(PathBuf),
    System,
}

/// The root certificate as libpq finds it: `sslrootcert`, else
/// `~/.postgresql/root.crt` when it exists. verify-ca and verify-full
/// need one.
pub fn root_cert(
    value: Option<String>,
    home: &Path,
    sslmode: SslMode,
    sslmode_origin: &str,
) -> Result<Option<RootCert>> {
    let verify = matches!(sslmode, SslMode::VerifyCa | SslMode::VerifyFull);
    if value.as_deref() == Some("system") {
        if sslmode != SslMode::VerifyFull {
            return Err(fixable(
                format!("{sslmode_origin} is too weak for sslrootcert=system (any certificate the system trusts can claim a host name)"),
                "use sslmode=verify-full with sslrootcert=system",
            ));
        }
        return Ok(Some(RootCert::System));
    }
    let path = value
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".postgresql/root.crt"));
    if path.is_file() {
        return Ok(Some(RootCert::File(path)));
    }
    if verify {
        return Err(fixable(
            format!(
                "root certificate file \"{}\" does not exist, and {sslmode_origin} checks the server's certificate against it",
                path.display()
            ),
            "pass sslrootcert= the CA certificate (PEM) that signed the server's, sslrootcert=system for the system's trusted roots, or sslmode=require to encrypt without checking",
        ));
    }
    Ok(None)
}

/// The client certificate and key, as libpq finds them: `sslcert`/`sslkey`,
/// else `~/.postgresql/postgresql.{crt,key}`; none when the certificate
/// does not exist.
pub fn client_cert(
    cert: Option<String>,
    key: Option<String>,
    home: &Path,
) -> Result<Option<(PathBuf, PathBuf)>> {
    let cert = cert
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".postgresql/postgresql.crt"));
    if !cert.is_file() {
        return Ok(None);
    }
    let key = key
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".postgresql/postgresql.key"));
    let Ok(meta) = std::fs::metadata(&key) else {
        return Err(fixable(
            format!(
                "certificate present, but not private key file \"{}\"",
                key.display()
            ),
            "pass sslkey= the key of sslcert=, or remove the client certificate",
        ));
    };
    // libpq: 0600 or less, or 0640 or less when root owns it.
    let mode = meta.mode() & 0o777;
    let loose = if meta.uid() == 0 {
        mode & 0o037 != 0
    } else {
        mode & 0o077 != 0
    };
    if !meta.is_file() || loose {
        return Err(fixable(
            format!(
                "private key file \"{}\" has group or world access",
                key.display()
            ),
            format!("chmod 600 {}", key.display()),
        ));
    }
    Ok(Some((cert, key)))
}

/// A connector checking the server's certificate as `verify` says.
pub fn connector(
    verify: Verify,
    root: Option<&RootCert>,
    client: Option<&(PathBuf, PathBuf)>,
) -> Result<MakeTlsConnector, String> {
    let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(|e| e.to_string())?;
    match verify {
        Verify::None => b.set_verify(SslVerifyMode::NONE),
        Verify::Ca | Verify::Full => {
            b.set_verify(SslVerifyMode::PEER);
            match root {
                Some(RootCert::File(p)) => b
                    .set_ca_file(p)
                    .map_err(|e| format!("cannot load root certificate {}: {e}", p.display()))?,
                Some(RootCert::System) => {
                    b.set_default_verify_paths().map_err(|e| e.to_string())?
                }
                None => return Err("no root certificate to check the server's against".into()),
            }
        }
    }
    if let Some((cert, key)) = client {
        b.set_certificate_chain_file(cert)
            .map_err(|e| format!("cannot load client certificate {}: {e}", cert.display()))?;
        b.set_private_key_file(key, SslFiletype::PEM)
            .map_err(|e| format!("cannot load private key {}: {e}", key.display()))?;
    }
    let mut c = MakeTlsConnector::new(b.build());
    if verify != Verify::Full {
        // verify-ca: the chain only, as libpq.
        c.set_callback(|cfg, _| {
            cfg.set_verify_hostname(false);
            Ok(())
        });
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn fix_of(e: anyhow::Error) -> String {
        crate::error::find_fixable(&e)
            .map(|f| f.to_string())
            .unwrap_or_else(|| format!("{e:#}"))
    }

    #[test]
    fn root_certificate_as_libpq_finds_it() {
        let d = tempfile::tempdir().unwrap();
        let home = d.path();
        // Nothing there: fine unless sslmode checks certificates.
        assert_eq!(root_cert(None, home, SslMode::Require, "x").unwrap(), None);
        let e = fix_of(root_cert(None, home, SslMode::VerifyCa, "sslmode=verify-ca").unwrap_err());
        assert!(
            e.contains(".postgresql/root.crt") && e.contains("verify-ca"),
            "{e}"
        );
        // The default file, when present, is used (require then checks the chain).
        std::fs::create_dir(home.join(".postgresql")).unwrap();
        std::fs::write(home.join(".postgresql/root.crt"), "x").unwrap();
        assert_eq!(
            root_cert(None, home, SslMode::Require, "x").unwrap(),
            Some(RootCert::File(home.join(".postgresql/root.crt")))
        );
        assert_eq!(
            root_cert(Some("system".into()), home, SslMode::VerifyFull, "x").unwrap(),
            Some(RootCert::System)
        );
    }

    #[test]
    fn client_key_must_exist_and_be_private() {
        let d = tempfile::tempdir().unwrap();
        let home = d.path();
        assert_eq!(client_cert(None, None, home).unwrap(), None);
        let cert = home.join("c.crt");
        let key = home.join("c.key");
        std::fs::write(&cert, "x").unwrap();
        let c = Some(cert.display().to_string());
        let k = Some(key.display().to_string());
        let e = fix_of(client_cert(c.clone(), k.clone(), home).unwrap_err());
        assert!(e.contains("not private key file"), "{e}");
        std::fs::write(&key, "x").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = fix_of(client_cert(c.clone(), k.clone(), home).unwrap_err());
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(client_cert(c, k, home).unwrap(), Some((cert, key)));
    }

    #[test]
    fn a_bad_root_certificate_is_an_error_not_a_panic() {
        let d = tempfile::tempdir().unwrap();
        let bad = d.path().join("bad.pem");
        std::fs::write(&bad, "not a certificate").unwrap();
        let e = connector(Verify::Ca, Some(&RootCert::File(bad)), None)
            .err()
            .expect("refused");
        assert!(e.contains("bad.pem"), "{e}");
        assert!(connector(Verify::Full, None, None).is_err());
        assert!(connector(Verify::None, None, None).is_ok());
    }
}
