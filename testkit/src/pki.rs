//! A throwaway certificate authority for the TLS tests: a CA, server certificates for
//! the addresses a test listens on, client certificates for mutual TLS, each with the
//! serial number the test chooses (so that a test can tell which certificate a
//! server presents), written as PEM files the agent and curl read.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate authority that signs with a fresh key.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM, and the certificate as DER.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: Vec<u8>,
    pub serial: u64,
}

impl TestCa {
    /// A new CA whose common name is `name`.
    pub fn new(name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("no names");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
        ];
        let key = KeyPair::generate().expect("a CA key");
        let issuer = CertifiedIssuer::self_signed(params, key).expect("a self-signed CA");
        TestCa { issuer }
    }

    /// The CA's certificate, PEM.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `names` (DNS names or IP addresses), with `serial`.
    pub fn server(&self, names: &[&str], serial: u64) -> Issued {
        self.issue(
            names,
            names.first().copied().unwrap_or("server"),
            serial,
            ExtendedKeyUsagePurpose::ServerAuth,
        )
    }

    /// A client certificate whose common name is `name`, with `serial`.
    pub fn client(&self, name: &str, serial: u64) -> Issued {
        self.issue(&[], name, serial, ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn issue(
        &self,
        names: &[&str],
        common_name: &str,
        serial: u64,
        usage: ExtendedKeyUsagePurpose,
    ) -> Issued {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).expect("valid names");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.serial_number = Some(serial.into());
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().expect("a key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("a signed certificate");
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
            serial,
        }
    }

    /// Writes the CA's certificate to `dir/NAME.pem`; returns the path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(format!("{name}.pem"));
        std::fs::write(&path, self.cert_pem()).expect("writing the CA certificate");
        path
    }
}

impl Issued {
    /// Writes `dir/NAME.crt` and `dir/NAME.key`; returns (certificate, key) paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, &self.cert_pem).expect("writing a certificate");
        std::fs::write(&key, &self.key_pem).expect("writing a key");
        (cert, key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issues_pem_certificates_with_the_serial_asked_for() {
        let ca = TestCa::new("test ca");
        let server = ca.server(&["198.18.0.1", "localhost"], 0x1234);
        assert!(server.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(server.key_pem.contains("PRIVATE KEY"));
        // DER INTEGER 0x1234 follows the version field.
        assert!(server
            .cert_der
            .windows(4)
            .any(|w| w == [0x02, 0x02, 0x12, 0x34]));
        let other = ca.server(&["198.18.0.1"], 0x1235);
        assert_ne!(server.cert_der, other.cert_der);
        assert!(ca.cert_pem().starts_with("-----BEGIN CERTIFICATE-----"));
    }
}
