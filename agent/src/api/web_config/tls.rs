//! `tls_server_config`: the server's certificate and key, who may connect (client
//! certificates), the protocol versions, cipher suites and curves, as a rustls
//! `ServerConfig` on the ring provider.
//!
//! What exporter-toolkit accepts and rustls cannot do is refused with the reason:
//! TLS 1.0 and 1.1, CBC and RSA-key-exchange cipher suites, the P-521 curve.
//! Where this is stricter than exporter-toolkit, it refuses a file that would silently
//! not do what it says: TLS settings without a certificate (exporter-toolkit serves
//! plain HTTP), a verifying `client_auth_type` without a CA (Go would verify against
//! the system's roots), `client_allowed_sans` with a `client_auth_type` that verifies
//! nothing (or an empty list, which no client passes), `cert` and `cert_file` both set.
//! `cipher_suites` restricts TLS 1.3 too when it names TLS 1.3 suites (Go's TLS 1.3
//! suites cannot be configured); naming none leaves all of them.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, SupportedKxGroup};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{
    DigitallySignedStruct, DistinguishedName, NamedGroup, RootCertStore, ServerConfig,
    SignatureScheme, SupportedCipherSuite, SupportedProtocolVersion,
};
use serde::Deserialize;

use super::{io_cause, WebConfigError};

/// `tls_server_config` as written (exporter-toolkit's keys; an empty string is unset).
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping (cert_file, key_file, ...)"
)]
pub(super) struct TlsSection {
    cert: Option<String>,
    key: Option<String>,
    client_ca: Option<String>,
    cert_file: Option<String>,
    key_file: Option<String>,
    client_auth_type: Option<String>,
    client_ca_file: Option<String>,
    cipher_suites: Option<Vec<String>>,
    curve_preferences: Option<Vec<String>>,
    min_version: Option<String>,
    max_version: Option<String>,
    prefer_server_cipher_suites: Option<bool>,
    client_allowed_sans: Option<Vec<String>>,
}

/// The built configuration and what it does, for the start log.
pub(super) struct Tls {
    pub config: Arc<ServerConfig>,
    /// E.g. "1.2 or newer, client certificates required".
    pub summary: String,
    /// Whether every client must present a certificate the CA signed.
    pub authenticates: bool,
}

/// `client_auth_type`: Go's `tls.ClientAuthType` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ClientAuth {
    NoClientCert,
    RequestClientCert,
    RequireAnyClientCert,
    VerifyClientCertIfGiven,
    RequireAndVerifyClientCert,
}

impl ClientAuth {
    fn parse(name: &str) -> Option<ClientAuth> {
        Some(match name {
            "" | "NoClientCert" => ClientAuth::NoClientCert,
            "RequestClientCert" => ClientAuth::RequestClientCert,
            // exporter-toolkit keeps the old name.
            "RequireAnyClientCert" | "RequireClientCert" => ClientAuth::RequireAnyClientCert,
            "VerifyClientCertIfGiven" => ClientAuth::VerifyClientCertIfGiven,
            "RequireAndVerifyClientCert" => ClientAuth::RequireAndVerifyClientCert,
            _ => return None,
        })
    }

    fn verifies(self) -> bool {
        matches!(
            self,
            ClientAuth::VerifyClientCertIfGiven | ClientAuth::RequireAndVerifyClientCert
        )
    }

    fn describe(self, sans: usize) -> &'static str {
        match (self, sans) {
            (ClientAuth::NoClientCert, _) => "",
            (ClientAuth::RequestClientCert, _) => ", client certificates requested, not verified",
            (ClientAuth::RequireAnyClientCert, _) => ", client certificates required, not verified",
            (ClientAuth::VerifyClientCertIfGiven, 0) => ", client certificates verified if given",
            (ClientAuth::RequireAndVerifyClientCert, 0) => ", client certificates required",
            (_, _) => ", client certificates required, with an allowed SAN",
        }
    }
}

/// Go's names of the cipher suites (`tls.CipherSuites()`) that rustls's ring provider
/// has, with their IANA numbers.
const CIPHER_SUITES: [(&str, u16); 9] = [
    ("TLS_AES_128_GCM_SHA256", 0x1301),
    ("TLS_AES_256_GCM_SHA384", 0x1302),
    ("TLS_CHACHA20_POLY1305_SHA256", 0x1303),
    ("TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", 0xc02b),
    ("TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384", 0xc02c),
    ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", 0xc02f),
    ("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", 0xc030),
    ("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256", 0xcca8),
    ("TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256", 0xcca9),
];

/// Go's names of the curves (exporter-toolkit's list, less P-521, which ring lacks).
const CURVES: [(&str, NamedGroup); 3] = [
    ("CurveP256", NamedGroup::secp256r1),
    ("CurveP384", NamedGroup::secp384r1),
    ("X25519", NamedGroup::X25519),
];

/// Where the file names a path, and how its refusals name the key.
struct Source<'a> {
    path: &'a Path,
    dir: &'a Path,
}

impl Source<'_> {
    fn invalid(&self, key: &str, message: impl Into<String>) -> WebConfigError {
        WebConfigError::invalid(self.path, format!("tls_server_config.{key}"), message)
    }

    /// The PEM text of the file `file_key` names (relative to the web config file's
    /// directory) or of the inline `inline_key`; None when neither is set.
    fn pem(
        &self,
        file_key: &'static str,
        file: Option<String>,
        inline_key: &'static str,
        inline: Option<String>,
    ) -> Result<Option<Pem>, WebConfigError> {
        match (file, inline) {
            (Some(_), Some(_)) => Err(self.invalid(
                short(file_key),
                format!("set {} or {inline_key}, not both", short(file_key)),
            )),
            (Some(file), None) => {
                let full = self.dir.join(&file);
                let bytes = std::fs::read(&full)
                    .map_err(|e| WebConfigError::file(self.path, file_key, &full, io_cause(&e)))?;
                Ok(Some(Pem {
                    bytes,
                    origin: Origin::File(file_key, full),
                }))
            }
            (None, Some(text)) => Ok(Some(Pem {
                bytes: text.into_bytes(),
                origin: Origin::Inline(inline_key),
            })),
            (None, None) => Ok(None),
        }
    }

    fn refuse(&self, pem: &Pem, message: impl Into<String>) -> WebConfigError {
        match &pem.origin {
            Origin::File(key, file) => WebConfigError::file(self.path, key, file, message),
            Origin::Inline(key) => self.invalid(key, message),
        }
    }
}

/// PEM text and where it came from.
struct Pem {
    bytes: Vec<u8>,
    origin: Origin,
}

enum Origin {
    /// The full key (`tls_server_config.cert_file`) and the file.
    File(&'static str, PathBuf),
    /// The inline key (`cert`).
    Inline(&'static str),
}

impl Origin {
    fn name(&self) -> String {
        match self {
            Origin::File(key, file) => format!("{} {}", short(key), file.display()),
            Origin::Inline(key) => key.to_string(),
        }
    }
}

fn short(key: &'static str) -> &'static str {
    key.trim_start_matches("tls_server_config.")
}

/// The TLS configuration `section` asks for; None when it asks for none (no
/// certificate, key, CA or client authentication set).
pub(super) fn build(
    path: &Path,
    dir: &Path,
    section: TlsSection,
) -> Result<Option<Tls>, WebConfigError> {
    let src = Source { path, dir };
    let set = |s: Option<String>| s.filter(|s| !s.is_empty());
    let cert_file = set(section.cert_file);
    let cert = set(section.cert);
    let key_file = set(section.key_file);
    let key = set(section.key);
    let ca_file = set(section.client_ca_file);
    let ca = set(section.client_ca);
    let auth_name = set(section.client_auth_type);
    let enabled = [
        &cert_file, &cert, &key_file, &key, &ca_file, &ca, &auth_name,
    ]
    .iter()
    .any(|v| v.is_some());
    if !enabled {
        let other = section.cipher_suites.is_some()
            || section.curve_preferences.is_some()
            || section.min_version.is_some()
            || section.max_version.is_some()
            || section.prefer_server_cipher_suites.is_some()
            || section.client_allowed_sans.is_some();
        if other {
            return Err(WebConfigError::invalid(
                path,
                "tls_server_config",
                "TLS settings without a certificate: set cert_file and key_file (or remove tls_server_config to serve plain HTTP)",
            ));
        }
        return Ok(None);
    }

    let sans = section.client_allowed_sans;
    let provider = Arc::new(provider(
        &src,
        section.cipher_suites,
        section.curve_preferences,
    )?);
    let certified = certified_key(&src, cert_file, cert, key_file, key, &provider)?;
    let auth = match auth_name.as_deref() {
        None => ClientAuth::NoClientCert,
        Some(name) => ClientAuth::parse(name).ok_or_else(|| {
            src.invalid(
                "client_auth_type",
                format!("unknown value {name:?} (use NoClientCert, RequestClientCert, RequireAnyClientCert, VerifyClientCertIfGiven or RequireAndVerifyClientCert)"),
            )
        })?,
    };
    let ca = src.pem("tls_server_config.client_ca_file", ca_file, "client_ca", ca)?;
    let verifier = client_verifier(&src, auth, ca, sans.clone(), &provider)?;

    let min = version(&src, "min_version", section.min_version.as_deref(), 12)?;
    let max = version(&src, "max_version", section.max_version.as_deref(), 13)?;
    if min > max {
        return Err(src.invalid(
            "min_version",
            format!("TLS{min} is newer than max_version TLS{max}"),
        ));
    }
    let versions: Vec<&'static SupportedProtocolVersion> =
        [(13, &rustls::version::TLS13), (12, &rustls::version::TLS12)]
            .into_iter()
            .filter(|(v, _)| (min..=max).contains(v))
            .map(|(_, v)| v)
            .collect();

    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions)
        .map_err(|e| {
            src.invalid(
                "cipher_suites",
                format!("no cipher suite for the TLS versions allowed: {e}"),
            )
        })?;
    let builder = match verifier {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.ignore_client_order = section.prefer_server_cipher_suites.unwrap_or(true);

    let versions = match (min, max) {
        (12, 13) => "1.2 or newer",
        (12, _) => "1.2 only",
        _ => "1.3 only",
    };
    let sans = sans.map_or(0, |s| s.len());
    Ok(Some(Tls {
        config: Arc::new(config),
        summary: format!("{versions}{}", auth.describe(sans)),
        authenticates: auth == ClientAuth::RequireAndVerifyClientCert || sans > 0,
    }))
}

/// The server's certificate chain (`cert_file` or `cert`) and its key (`key_file` or
/// `key`), checked to match.
fn certified_key(
    src: &Source,
    cert_file: Option<String>,
    cert: Option<String>,
    key_file: Option<String>,
    key: Option<String>,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, WebConfigError> {
    let cert = src
        .pem("tls_server_config.cert_file", cert_file, "cert", cert)?
        .ok_or_else(|| {
            src.invalid(
                "cert_file",
                "missing: TLS needs cert_file (or cert) and key_file (or key)",
            )
        })?;
    let key = src
        .pem("tls_server_config.key_file", key_file, "key", key)?
        .ok_or_else(|| {
            src.invalid(
                "key_file",
                "missing: TLS needs cert_file (or cert) and key_file (or key)",
            )
        })?;
    let chain = certificates(src, &cert)?;
    let private_key = PrivateKeyDer::from_pem_slice(&key.bytes).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => {
            src.refuse(&key, "holds no private key (PKCS#8, PKCS#1 or SEC1 PEM)")
        }
        e => src.refuse(&key, format!("not a PEM private key: {e}")),
    })?;

    CertifiedKey::from_der(chain, private_key, provider).map_err(|e| match e {
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => src.invalid(
            key_key(&key),
            format!(
                "the certificate ({}) and the key ({}) do not match",
                cert.origin.name(),
                key.origin.name()
            ),
        ),
        e => src.refuse(&key, format!("not a usable private key: {e}")),
    })
}

fn key_key(key: &Pem) -> &'static str {
    match &key.origin {
        Origin::File(key, _) => short(key),
        Origin::Inline(key) => key,
    }
}

/// The certificates of `pem`, the server's first.
fn certificates(src: &Source, pem: &Pem) -> Result<Vec<CertificateDer<'static>>, WebConfigError> {
    let chain = CertificateDer::pem_slice_iter(&pem.bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| src.refuse(pem, format!("not PEM: {e}")))?;
    if chain.is_empty() {
        return Err(src.refuse(pem, "holds no certificate (a PEM CERTIFICATE block)"));
    }
    Ok(chain)
}

/// `min_version`/`max_version`: 12 or 13.
fn version(src: &Source, key: &str, name: Option<&str>, default: u8) -> Result<u8, WebConfigError> {
    match name {
        None => Ok(default),
        Some("TLS12") => Ok(12),
        Some("TLS13") => Ok(13),
        Some(old @ ("TLS10" | "TLS11")) => Err(src.invalid(
            key,
            format!("{old} is not supported: rustls implements TLS 1.2 and 1.3 only (use TLS12 or TLS13)"),
        )),
        Some(other) => Err(src.invalid(
            key,
            format!("unknown TLS version {other:?} (use TLS12 or TLS13)"),
        )),
    }
}

/// rustls's ring provider, all its suites and groups. The agent builds on ring (no
/// aws-lc); rustls 0.23.48 deprecates it for lacking post-quantum key exchange (Go
/// clients that offer X25519MLKEM768 fall back to X25519).
fn ring_provider() -> CryptoProvider {
    #[allow(deprecated)]
    rustls::crypto::ring::default_provider()
}

/// The ring provider restricted to the cipher suites and curves named, in their order.
fn provider(
    src: &Source,
    suites: Option<Vec<String>>,
    curves: Option<Vec<String>>,
) -> Result<CryptoProvider, WebConfigError> {
    let mut provider = ring_provider();
    if let Some(names) = suites.filter(|n| !n.is_empty()) {
        let mut chosen: Vec<SupportedCipherSuite> = Vec::new();
        for name in &names {
            let id = CIPHER_SUITES
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, id)| *id)
                .ok_or_else(|| {
                    let known: Vec<&str> = CIPHER_SUITES.iter().map(|(n, _)| *n).collect();
                    src.invalid(
                        "cipher_suites",
                        format!("{name} is not a cipher suite rustls offers (CBC and RSA key exchange suites are not); use: {}", known.join(", ")),
                    )
                })?;
            let suite = provider
                .cipher_suites
                .iter()
                .find(|s| u16::from(s.suite()) == id)
                .copied();
            if let Some(suite) = suite.filter(|s| !chosen.contains(s)) {
                chosen.push(suite);
            }
        }
        if !chosen.iter().any(|s| s.tls13().is_some()) {
            let tls13 = provider
                .cipher_suites
                .iter()
                .filter(|s| s.tls13().is_some());
            chosen.splice(0..0, tls13.copied().collect::<Vec<_>>());
        }
        provider.cipher_suites = chosen;
    }
    if let Some(names) = curves.filter(|n| !n.is_empty()) {
        let mut chosen: Vec<&'static dyn SupportedKxGroup> = Vec::new();
        for name in &names {
            let group = CURVES.iter().find(|(n, _)| n == name).map(|(_, g)| *g);
            let Some(group) = group else {
                let why = match name.as_str() {
                    "CurveP521" => "rustls's ring provider has no P-521",
                    _ => "unknown curve",
                };
                return Err(src.invalid(
                    "curve_preferences",
                    format!("{name}: {why} (use X25519, CurveP256 or CurveP384)"),
                ));
            };
            let kx = provider
                .kx_groups
                .iter()
                .find(|g| g.name() == group)
                .copied();
            if let Some(kx) = kx.filter(|k| !chosen.iter().any(|c| c.name() == k.name())) {
                chosen.push(kx);
            }
        }
        provider.kx_groups = chosen;
    }
    Ok(provider)
}

/// The client certificate verifier `client_auth_type` asks for (None: no client
/// certificates).
fn client_verifier(
    src: &Source,
    auth: ClientAuth,
    ca: Option<Pem>,
    sans: Option<Vec<String>>,
    provider: &Arc<CryptoProvider>,
) -> Result<Option<Arc<dyn ClientCertVerifier>>, WebConfigError> {
    let roots = match &ca {
        Some(pem) => {
            let mut roots = RootCertStore::empty();
            for cert in certificates(src, pem)? {
                roots
                    .add(cert)
                    .map_err(|e| src.refuse(pem, format!("not a usable CA certificate: {e}")))?;
            }
            Some(Arc::new(roots))
        }
        None => None,
    };
    if let Some(sans) = &sans {
        if !auth.verifies() {
            return Err(src.invalid(
                "client_allowed_sans",
                "needs client_auth_type RequireAndVerifyClientCert or VerifyClientCertIfGiven (the SANs of a certificate nobody verified prove nothing)",
            ));
        }
        if sans.is_empty() {
            return Err(src.invalid(
                "client_allowed_sans",
                "empty: no client certificate could pass",
            ));
        }
    }
    match (auth, roots) {
        (ClientAuth::NoClientCert, None) => Ok(None),
        (ClientAuth::NoClientCert, Some(_)) => Err(src.invalid(
            "client_auth_type",
            "a client CA is set but client_auth_type is NoClientCert (set RequireAndVerifyClientCert)",
        )),
        (ClientAuth::RequestClientCert | ClientAuth::RequireAnyClientCert, roots) => {
            Ok(Some(Arc::new(AnyClientCert {
                mandatory: auth == ClientAuth::RequireAnyClientCert,
                hints: roots.map(|r| r.subjects()).unwrap_or_default(),
                provider: provider.clone(),
            })))
        }
        (_, None) => Err(src.invalid(
            "client_ca_file",
            "missing: client_auth_type VerifyClientCertIfGiven and RequireAndVerifyClientCert verify client certificates against it (or an inline client_ca)",
        )),
        (_, Some(roots)) => {
            let builder = WebPkiClientVerifier::builder_with_provider(roots, provider.clone());
            let builder = match (auth, &sans) {
                (ClientAuth::VerifyClientCertIfGiven, None) => builder.allow_unauthenticated(),
                _ => builder,
            };
            let webpki = builder
                .build()
                .map_err(|e| src.invalid("client_ca_file", format!("cannot verify with it: {e}")))?;
            Ok(Some(match sans {
                Some(allowed) => Arc::new(AllowedSans { inner: webpki, allowed }),
                None => webpki,
            }))
        }
    }
}

/// `RequestClientCert`, `RequireAnyClientCert`: any certificate, verified by no one
/// (the client still proves it holds the key). As Go does, for those who want it.
#[derive(Debug)]
struct AnyClientCert {
    mandatory: bool,
    hints: Vec<DistinguishedName>,
    provider: Arc<CryptoProvider>,
}

impl ClientCertVerifier for AnyClientCert {
    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.hints
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls12_signature(message, cert, dss, algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        let algs = &self.provider.signature_verification_algorithms;
        rustls::crypto::verify_tls13_signature(message, cert, dss, algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// `client_allowed_sans`: a verified client certificate must also carry one of these
/// names (DNS, e-mail, IP or URI), exactly as written. A certificate is then required.
#[derive(Debug)]
struct AllowedSans {
    inner: Arc<dyn ClientCertVerifier>,
    allowed: Vec<String>,
}

impl ClientCertVerifier for AllowedSans {
    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        let names = subject_alt_names(end_entity).ok_or_else(|| {
            rustls::Error::General("cannot read the client certificate's SANs".to_string())
        })?;
        if names.iter().any(|n| self.allowed.contains(n)) {
            Ok(verified)
        } else {
            Err(rustls::Error::General(format!(
                "the client certificate has none of the allowed SANs (it has: {})",
                names.join(", ")
            )))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// The subject alternative names of a DER certificate as Go's crypto/x509 lists them
/// (DNS names, e-mail addresses, IP addresses printed as Go prints them, URIs); None if
/// the DER cannot be read.
fn subject_alt_names(cert: &[u8]) -> Option<Vec<String>> {
    const SAN: &[u8] = &[0x55, 0x1d, 0x11]; // 2.5.29.17
    let mut tbs = Der(cert).expect(0x30)?.expect(0x30)?;
    while !tbs.0.is_empty() {
        let (tag, mut body) = tbs.next()?;
        if tag != 0xa3 {
            continue; // not [3] extensions
        }
        let mut extensions = body.expect(0x30)?;
        while !extensions.0.is_empty() {
            let mut extension = extensions.expect(0x30)?;
            let oid = extension.expect(0x06)?;
            let (mut tag, mut value) = extension.next()?;
            if tag == 0x01 {
                (tag, value) = extension.next()?; // past `critical`
            }
            if tag != 0x04 || oid.0 != SAN {
                continue;
            }
            let mut general_names = value.expect(0x30)?;
            let mut names = Vec::new();
            while !general_names.0.is_empty() {
                let (tag, name) = general_names.next()?;
                match tag {
                    // rfc822Name, dNSName, uniformResourceIdentifier
                    0x81 | 0x82 | 0x86 => names.push(String::from_utf8(name.0.to_vec()).ok()?),
                    0x87 => names.push(ip_text(name.0)?),
                    _ => {}
                }
            }
            return Some(names);
        }
    }
    Some(Vec::new())
}

/// An iPAddress SAN as Go prints it (an IPv4-mapped IPv6 address as IPv4).
fn ip_text(bytes: &[u8]) -> Option<String> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        return Some(Ipv4Addr::from(v4).to_string());
    }
    let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?);
    Some(match v6.to_ipv4_mapped() {
        Some(v4) => v4.to_string(),
        None => v6.to_string(),
    })
}

/// A DER reader over one level of TLV items (single-byte tags, definite lengths).
struct Der<'a>(&'a [u8]);

impl<'a> Der<'a> {
    fn next(&mut self) -> Option<(u8, Der<'a>)> {
        let (&tag, rest) = self.0.split_first()?;
        let (&first, rest) = rest.split_first()?;
        let (len, rest) = if first < 0x80 {
            (usize::from(first), rest)
        } else {
            let n = usize::from(first & 0x7f);
            if n == 0 || n > 4 || rest.len() < n {
                return None;
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |l, &b| l << 8 | usize::from(b));
            (len, &rest[n..])
        };
        if tag & 0x1f == 0x1f || rest.len() < len {
            return None;
        }
        let (body, rest) = rest.split_at(len);
        self.0 = rest;
        Some((tag, Der(body)))
    }

    fn expect(&mut self, tag: u8) -> Option<Der<'a>> {
        self.next().filter(|(t, _)| *t == tag).map(|(_, d)| d)
    }
}

#[cfg(test)]
mod tests {
    use super::super::WebConfig;
    use super::*;
    use roce_testkit::pki::{Issued, TestCa};
    use roce_testkit::temp::TempDir;
    use rustls::pki_types::ServerName;
    use rustls::{ClientConfig, ClientConnection, ServerConnection};

    /// A server certificate for 198.18.0.1 from `ca`, written as server.crt/.key.
    fn server_files(dir: &TempDir, ca: &TestCa) {
        ca.server(&["198.18.0.1"], 1).write(dir.path(), "server");
    }

    fn load(dir: &TempDir, text: &str) -> Result<WebConfig, String> {
        let path = dir.path().join("web.yml");
        std::fs::write(&path, text).unwrap();
        WebConfig::load(&path).map_err(|e| e.to_string())
    }

    fn refusal(dir: &TempDir, text: &str) -> String {
        match load(dir, text) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e,
        }
    }

    const CERT: &str = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n";

    /// A client of `server_ca`'s server, presenting `client` if given.
    fn client(server_ca: &TestCa, client: Option<&Issued>) -> Arc<ClientConfig> {
        let provider = Arc::new(ring_provider());
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_slice_iter(server_ca.cert_pem().as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let mut config = match client {
            Some(c) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from(c.cert_der.clone())],
                    PrivateKeyDer::from_pem_slice(c.key_pem.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }

    /// Runs a handshake in memory; Err carries the side and rustls's error.
    fn handshake(server: Arc<ServerConfig>, client: Arc<ClientConfig>) -> Result<(), String> {
        let mut s = ServerConnection::new(server).unwrap();
        let name = ServerName::try_from("198.18.0.1").unwrap();
        let mut c = ClientConnection::new(client, name).unwrap();
        for _ in 0..20 {
            let mut wire = Vec::new();
            while c.wants_write() {
                c.write_tls(&mut wire).unwrap();
            }
            let mut rd = &wire[..];
            while !rd.is_empty() {
                s.read_tls(&mut rd).unwrap();
                s.process_new_packets()
                    .map_err(|e| format!("server: {e}"))?;
            }
            let mut wire = Vec::new();
            while s.wants_write() {
                s.write_tls(&mut wire).unwrap();
            }
            let mut rd = &wire[..];
            while !rd.is_empty() {
                c.read_tls(&mut rd).unwrap();
                c.process_new_packets()
                    .map_err(|e| format!("client: {e}"))?;
            }
            if !c.is_handshaking() && !s.is_handshaking() && !c.wants_write() && !s.wants_write() {
                assert_eq!(s.alpn_protocol(), Some(&b"http/1.1"[..]));
                return Ok(());
            }
        }
        Err("no progress".to_string())
    }

    #[test]
    fn require_and_verify_refuses_a_client_without_certificate_and_accepts_one_of_the_ca() {
        let dir = TempDir::new("web-config-mtls");
        let server_ca = TestCa::new("server ca");
        server_files(&dir, &server_ca);
        let clients = TestCa::new("clients");
        clients.write(dir.path(), "clients");
        let text = format!(
            "{CERT}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: clients.pem\n"
        );
        let config = load(&dir, &text).unwrap();
        assert_eq!(
            config.summary(),
            "TLS (1.2 or newer, client certificates required), no basic auth"
        );
        let server = config.tls.unwrap();

        let e = handshake(server.clone(), client(&server_ca, None)).unwrap_err();
        assert!(e == "server: peer sent no certificates", "{e}");
        let good = clients.client("scraper", 2);
        handshake(server.clone(), client(&server_ca, Some(&good))).unwrap();
        let stranger = TestCa::new("other").client("scraper", 3);
        let e = handshake(server, client(&server_ca, Some(&stranger))).unwrap_err();
        assert!(e.contains("UnknownIssuer"), "{e}");
    }

    #[test]
    fn verify_if_given_accepts_no_certificate_but_refuses_a_stranger() {
        let dir = TempDir::new("web-config-ifgiven");
        let server_ca = TestCa::new("server ca");
        server_files(&dir, &server_ca);
        let clients = TestCa::new("clients");
        let text = format!(
            "{CERT}  client_auth_type: VerifyClientCertIfGiven\n  client_ca: |\n{}",
            clients
                .cert_pem()
                .lines()
                .map(|l| format!("    {l}\n"))
                .collect::<String>()
        );
        let server = load(&dir, &text).unwrap().tls.unwrap();
        handshake(server.clone(), client(&server_ca, None)).unwrap();
        handshake(
            server.clone(),
            client(&server_ca, Some(&clients.client("a", 4))),
        )
        .unwrap();
        let stranger = TestCa::new("other").client("b", 5);
        assert!(handshake(server, client(&server_ca, Some(&stranger))).is_err());
    }

    #[test]
    fn require_any_accepts_any_certificate_but_requires_one() {
        let dir = TempDir::new("web-config-any");
        let server_ca = TestCa::new("server ca");
        server_files(&dir, &server_ca);
        let config = load(
            &dir,
            &format!("{CERT}  client_auth_type: RequireAnyClientCert\n"),
        )
        .unwrap();
        assert_eq!(
            config.summary(),
            "TLS (1.2 or newer, client certificates required, not verified), no authentication"
        );
        let server = config.tls.unwrap();
        assert!(handshake(server.clone(), client(&server_ca, None)).is_err());
        let anyone = TestCa::new("anyone").client("x", 6);
        handshake(server, client(&server_ca, Some(&anyone))).unwrap();
    }

    #[test]
    fn client_allowed_sans_refuses_a_verified_certificate_without_them() {
        let dir = TempDir::new("web-config-sans");
        let server_ca = TestCa::new("server ca");
        server_files(&dir, &server_ca);
        let clients = TestCa::new("clients");
        clients.write(dir.path(), "clients");
        let text = format!(
            "{CERT}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: clients.pem\n  client_allowed_sans: [prometheus.example]\n"
        );
        let server = load(&dir, &text).unwrap().tls.unwrap();
        let e = handshake(server, client(&server_ca, Some(&clients.client("c", 7)))).unwrap_err();
        assert!(e.contains("none of the allowed SANs"), "{e}");
    }

    #[test]
    fn subject_alt_names_are_read_as_go_prints_them() {
        let issued = TestCa::new("ca").server(&["198.18.0.1", "localhost", "::1", "fd00::a:1"], 9);
        assert_eq!(
            subject_alt_names(&issued.cert_der).unwrap(),
            vec!["198.18.0.1", "localhost", "::1", "fd00::a:1"]
        );
        assert_eq!(
            subject_alt_names(&TestCa::new("ca").client("c", 1).cert_der).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(subject_alt_names(b"\x30\x05\x30"), None);
        assert_eq!(
            ip_text(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]).unwrap(),
            "10.0.0.1"
        );
    }

    #[test]
    fn inline_cert_and_key_are_accepted() {
        let dir = TempDir::new("web-config-inline");
        let issued = TestCa::new("ca").server(&["198.18.0.1"], 1);
        let indent = |pem: &str| {
            pem.lines()
                .map(|l| format!("    {l}\n"))
                .collect::<String>()
        };
        let text = format!(
            "tls_server_config:\n  cert: |\n{}  key: |\n{}  min_version: TLS13\n",
            indent(&issued.cert_pem),
            indent(&issued.key_pem)
        );
        let config = load(&dir, &text).unwrap();
        assert_eq!(config.summary(), "TLS (1.3 only), no authentication");
    }

    #[test]
    fn missing_or_mismatched_certificate_files_are_refused_naming_them() {
        let dir = TempDir::new("web-config-files");
        let ca = TestCa::new("ca");
        let e = refusal(&dir, CERT);
        let crt = dir.path().join("server.crt");
        assert!(
            e.ends_with(&format!(
                "web.yml: tls_server_config.cert_file {}: no such file",
                crt.display()
            )),
            "{e}"
        );
        server_files(&dir, &ca);
        ca.server(&["198.18.0.2"], 2).write(dir.path(), "other");
        let e = refusal(
            &dir,
            "tls_server_config:\n  cert_file: server.crt\n  key_file: other.key\n",
        );
        assert!(
            e.contains("tls_server_config.key_file: the certificate (cert_file "),
            "{e}"
        );
        assert!(e.ends_with("other.key) do not match"), "{e}");
        let e = refusal(
            &dir,
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.crt\n",
        );
        assert!(
            e.contains("tls_server_config.key_file ")
                && e.ends_with("server.crt: holds no private key (PKCS#8, PKCS#1 or SEC1 PEM)"),
            "{e}"
        );
        let e = refusal(
            &dir,
            "tls_server_config:\n  cert_file: server.key\n  key_file: server.key\n",
        );
        assert!(
            e.ends_with("server.key: holds no certificate (a PEM CERTIFICATE block)"),
            "{e}"
        );
        let e = refusal(&dir, "tls_server_config:\n  cert_file: server.crt\n");
        assert!(e.contains("tls_server_config.key_file: missing"), "{e}");
        let e = refusal(&dir, &format!("{CERT}  cert: x\n"));
        assert!(e.contains("set cert_file or cert, not both"), "{e}");
        let e = refusal(&dir, "tls_server_config:\n  min_version: TLS13\n");
        assert!(e.contains("TLS settings without a certificate"), "{e}");
        assert!(load(&dir, "tls_server_config: {}\n").unwrap().tls.is_none());
    }

    #[test]
    fn versions_rustls_lacks_and_unknown_ones_are_refused() {
        let dir = TempDir::new("web-config-versions");
        server_files(&dir, &TestCa::new("ca"));
        let e = refusal(&dir, &format!("{CERT}  min_version: TLS10\n"));
        assert!(e.contains("tls_server_config.min_version: TLS10 is not supported: rustls implements TLS 1.2 and 1.3 only"), "{e}");
        let e = refusal(&dir, &format!("{CERT}  max_version: TLS111\n"));
        assert!(
            e.contains("max_version: unknown TLS version \"TLS111\""),
            "{e}"
        );
        let e = refusal(
            &dir,
            &format!("{CERT}  min_version: TLS13\n  max_version: TLS12\n"),
        );
        assert!(
            e.contains("min_version: TLS13 is newer than max_version TLS12"),
            "{e}"
        );
        let c = load(&dir, &format!("{CERT}  max_version: TLS12\n")).unwrap();
        assert_eq!(c.summary(), "TLS (1.2 only), no authentication");
    }

    #[test]
    fn client_auth_needs_its_ca_and_a_ca_needs_client_auth() {
        let dir = TempDir::new("web-config-client-auth");
        server_files(&dir, &TestCa::new("ca"));
        TestCa::new("clients").write(dir.path(), "clients");
        let e = refusal(
            &dir,
            &format!("{CERT}  client_auth_type: RequireAndVerifyClientCert\n"),
        );
        assert!(
            e.contains("tls_server_config.client_ca_file: missing"),
            "{e}"
        );
        let e = refusal(
            &dir,
            &format!("{CERT}  client_auth_type: VerifyClientCertIfGiven\n"),
        );
        assert!(e.contains("client_ca_file: missing"), "{e}");
        let e = refusal(&dir, &format!("{CERT}  client_ca_file: clients.pem\n"));
        assert!(
            e.contains("client_auth_type: a client CA is set but client_auth_type is NoClientCert"),
            "{e}"
        );
        let e = refusal(&dir, &format!("{CERT}  client_auth_type: Sometimes\n"));
        assert!(
            e.contains("client_auth_type: unknown value \"Sometimes\""),
            "{e}"
        );
        let e = refusal(
            &dir,
            &format!(
                "{CERT}  client_auth_type: RequireAnyClientCert\n  client_allowed_sans: [a]\n"
            ),
        );
        assert!(
            e.contains("client_allowed_sans: needs client_auth_type RequireAndVerifyClientCert"),
            "{e}"
        );
        let e = refusal(&dir, &format!("{CERT}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: clients.pem\n  client_allowed_sans: []\n"));
        assert!(e.contains("client_allowed_sans: empty"), "{e}");
        let e = refusal(&dir, &format!("{CERT}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: nope.pem\n"));
        assert!(
            e.contains("tls_server_config.client_ca_file ")
                && e.ends_with("nope.pem: no such file"),
            "{e}"
        );
        let c = load(
            &dir,
            &format!("{CERT}  client_auth_type: RequireClientCert\n"),
        )
        .unwrap();
        assert!(c.summary().contains("required, not verified"));
    }

    #[test]
    fn cipher_suites_and_curves_restrict_the_provider_or_are_refused_by_name() {
        let dir = TempDir::new("web-config-suites");
        server_files(&dir, &TestCa::new("ca"));
        let text = format!(
            "{CERT}  cipher_suites: [TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384]\n  curve_preferences: [CurveP384]\n  prefer_server_cipher_suites: false\n"
        );
        let tls = load(&dir, &text).unwrap().tls.unwrap();
        let suites: Vec<u16> = tls
            .crypto_provider()
            .cipher_suites
            .iter()
            .map(|s| u16::from(s.suite()))
            .collect();
        // All of TLS 1.3 (none named), then the TLS 1.2 ones in the order written.
        assert_eq!(suites, vec![0x1302, 0x1301, 0x1303, 0xcca9, 0xc02c]);
        let groups: Vec<NamedGroup> = tls
            .crypto_provider()
            .kx_groups
            .iter()
            .map(|g| g.name())
            .collect();
        assert_eq!(groups, vec![NamedGroup::secp384r1]);
        assert!(!tls.ignore_client_order);
        let tls = load(
            &dir,
            &format!("{CERT}  cipher_suites: [TLS_AES_256_GCM_SHA384]\n"),
        )
        .unwrap()
        .tls
        .unwrap();
        assert_eq!(tls.crypto_provider().cipher_suites.len(), 1);

        let e = refusal(
            &dir,
            &format!("{CERT}  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA]\n"),
        );
        assert!(e.contains("cipher_suites: TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA is not a cipher suite rustls offers"), "{e}");
        let e = refusal(&dir, &format!("{CERT}  curve_preferences: [CurveP521]\n"));
        assert!(
            e.contains("curve_preferences: CurveP521: rustls's ring provider has no P-521"),
            "{e}"
        );
        let e = refusal(&dir, &format!("{CERT}  curve_preferences: [Curve25519]\n"));
        assert!(e.contains("Curve25519: unknown curve"), "{e}");
    }

    #[test]
    fn a_restricted_server_still_completes_a_handshake() {
        let dir = TempDir::new("web-config-restricted");
        let ca = TestCa::new("ca");
        server_files(&dir, &ca);
        let text = format!("{CERT}  max_version: TLS12\n  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]\n  curve_preferences: [CurveP256]\n");
        let server = load(&dir, &text).unwrap().tls.unwrap();
        handshake(server, client(&ca, None)).unwrap();
    }
}
