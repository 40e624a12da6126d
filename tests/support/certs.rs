//! Certificates for TLS tests, generated with rcgen.

use std::path::PathBuf;

use tempfile::TempDir;

/// Certificates for a TLS etcd: a CA, a server certificate for 127.0.0.1 and
/// localhost, a client certificate, and a second, unrelated CA.
pub struct Certs {
    pub dir: TempDir,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub other_ca: PathBuf,
}

impl Certs {
    pub fn generate() -> Certs {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, ExtendedKeyUsagePurpose, IsCa,
            KeyPair,
        };
        let dir = TempDir::new().unwrap();
        let write = |name: &str, text: String| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let make_ca = || {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            // Its own name, distinct from the leaves' (OpenSSL clients such
            // as curl take a leaf named like its issuer for self-signed).
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, "leader-elector test CA");
            CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
        };
        let ca = make_ca();
        let other = make_ca();
        let leaf = |sans: Vec<String>, usage: ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::new(sans.clone()).unwrap();
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, sans[0].as_str());
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_cert, client_key) = leaf(
            vec!["leader-elector".into()],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        Certs {
            ca: write("ca.pem", ca.pem()),
            other_ca: write("other-ca.pem", other.pem()),
            server_cert: write("server.pem", server_cert),
            server_key: write("server-key.pem", server_key),
            client_cert: write("client.pem", client_cert),
            client_key: write("client-key.pem", client_key),
            dir,
        }
    }
}
