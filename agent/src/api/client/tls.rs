//! TLS of the API client (rustls on ring, through ureq): [`TlsFiles`], the CAs to trust
//! and the client certificate of mutual TLS, read from PEM files and checked as rustls
//! will use them; and [`explain`], what a failed handshake means for the user, from
//! rustls's error kinds (an untrusted or misnamed certificate, a client certificate
//! asked for, plain HTTP answering the TLS hello).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::{self, PemObject as _};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::{AlertDescription, CertificateError, InvalidMessage};
use ureq::tls::{Certificate, ClientCert, PrivateKey, RootCerts, TlsConfig, TlsProvider};

use super::{Client, ClientError};

/// The PEM files of a client's TLS. With none, the agent's certificate must chain to
/// one of the built-in web roots (webpki-roots: Mozilla's), and no client certificate
/// is offered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificates to trust instead of the built-in web roots (`--ca-file`).
    pub ca_file: Option<PathBuf>,
    /// A client certificate (and its chain) for mutual TLS (`--cert-file`).
    pub cert_file: Option<PathBuf>,
    /// The private key of `cert_file` (`--key-file`).
    pub key_file: Option<PathBuf>,
}

impl TlsFiles {
    /// No file given.
    pub fn is_empty(&self) -> bool {
        self.ca_file.is_none() && self.cert_file.is_none() && self.key_file.is_none()
    }

    /// Reads the files into ureq's TLS configuration. A file that cannot be read or is
    /// not what it should be is [`ClientError::File`]; a certificate without its key
    /// (or a key without its certificate) is [`ClientError::Usage`].
    pub(super) fn load(&self) -> Result<TlsConfig, ClientError> {
        let roots = match &self.ca_file {
            Some(path) => RootCerts::new_with_certs(&read_cas(path)?),
            None => RootCerts::WebPki,
        };
        let client_cert = match (&self.cert_file, &self.key_file) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some(read_client_cert(cert, key)?),
            (Some(_), None) | (None, Some(_)) => {
                return Err(ClientError::Usage(
                    "--cert-file and --key-file go together: pass both".to_string(),
                ))
            }
        };
        Ok(TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .root_certs(roots)
            .client_cert(client_cert)
            .build())
    }
}

fn file_error(flag: &'static str, path: &Path, message: impl Into<String>) -> ClientError {
    ClientError::File {
        flag,
        path: path.to_path_buf(),
        message: message.into(),
    }
}

fn read(flag: &'static str, path: &Path) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path).map_err(|e| file_error(flag, path, format!("cannot read it: {e}")))
}

/// Why a PEM file does not parse, in words (rustls-pki-types prints bytes).
fn pem_error(e: &pem::Error) -> String {
    match e {
        pem::Error::MissingSectionEnd { .. } => "not PEM: a block has no END line".to_string(),
        pem::Error::IllegalSectionStart { line } => format!(
            "not PEM: a malformed BEGIN line: {}",
            String::from_utf8_lossy(line).trim()
        ),
        pem::Error::Base64Decode(e) => format!("not PEM: bad base64 in a block: {e}"),
        other => format!("not PEM: {other}"),
    }
}

/// The certificates of a PEM file: at least one.
fn read_certs(
    flag: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, ClientError> {
    let pem = read(flag, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(flag, path, pem_error(&e)))?;
    if certs.is_empty() {
        return Err(file_error(
            flag,
            path,
            "holds no certificate (no -----BEGIN CERTIFICATE----- block)",
        ));
    }
    Ok(certs)
}

/// The CA certificates of `--ca-file`, each one checked as a trust anchor (ureq skips
/// those that are not, silently).
fn read_cas(path: &Path) -> Result<Vec<Certificate<'static>>, ClientError> {
    let certs = read_certs("--ca-file", path)?;
    let mut store = rustls::RootCertStore::empty();
    for (i, cert) in certs.iter().enumerate() {
        store.add(cert.clone()).map_err(|e| {
            file_error(
                "--ca-file",
                path,
                format!(
                    "certificate {} of {} is not a usable CA certificate: {e}",
                    i + 1,
                    certs.len()
                ),
            )
        })?;
    }
    Ok(certs
        .iter()
        .map(|c| Certificate::from_der(c.as_ref()).to_owned())
        .collect())
}

/// The crypto provider ureq's rustls will use: the process's default, else ring.
// ring is the agent's one crypto stack (no aws-lc); rustls 0.23.48 deprecates its
// provider only for the lack of post-quantum key exchange, which ureq's uses too.
#[allow(deprecated)]
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    rustls::crypto::CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// The client certificate of `--cert-file` and `--key-file`, checked by rustls as
/// ureq will hand them to it (ureq panics on a key rustls refuses).
fn read_client_cert(cert_path: &Path, key_path: &Path) -> Result<ClientCert, ClientError> {
    let chain = read_certs("--cert-file", cert_path)?;
    let key_pem = read("--key-file", key_path)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
        file_error(
            "--key-file",
            key_path,
            match e {
                pem::Error::NoItemsFound => {
                    "holds no private key (no -----BEGIN PRIVATE KEY----- block)".to_string()
                }
                other => pem_error(&other),
            },
        )
    })?;
    rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .and_then(|builder| {
            builder
                .with_root_certificates(rustls::RootCertStore::empty())
                .with_client_auth_cert(chain.clone(), key)
        })
        .map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => file_error(
                "--key-file",
                key_path,
                format!("not the key of the certificate in {}", cert_path.display()),
            ),
            other => file_error("--key-file", key_path, other.to_string()),
        })?;
    let key = PrivateKey::from_pem(&key_pem)
        .map_err(|e| file_error("--key-file", key_path, e.to_string()))?
        .to_owned();
    let chain: Vec<Certificate<'static>> = chain
        .iter()
        .map(|c| Certificate::from_der(c.as_ref()).to_owned())
        .collect();
    Ok(ClientCert::new_with_certs(&chain, key))
}

/// The rustls error behind a failed request, if TLS failed: ureq passes those of
/// making a connection as they are, those of the handshake and of reading inside an
/// I/O error.
pub(super) fn rustls_error(e: &ureq::Error) -> Option<&rustls::Error> {
    match e {
        ureq::Error::Rustls(e) => Some(e),
        ureq::Error::Io(io) => io.get_ref().and_then(|e| e.downcast_ref()),
        _ => None,
    }
}

/// What the TLS failure `e` of a request by `client` means, and what to do.
pub(super) fn explain(client: &Client, e: &rustls::Error) -> ClientError {
    let addr = client.addr.clone();
    let cert_file = client.files.cert_file.clone();
    match e {
        rustls::Error::InvalidCertificate(cert) => {
            certificate_error(client, cert).unwrap_or_else(|| ClientError::Tls {
                addr,
                detail: e.to_string(),
            })
        }
        // In TLS 1.3 the agent tells after the handshake that it wanted a certificate
        // (certificate_required); in TLS 1.2 it ends the handshake.
        rustls::Error::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::HandshakeFailure
            | AlertDescription::BadCertificate,
        ) if cert_file.is_none() => ClientError::ClientCertRequired { addr },
        rustls::Error::AlertReceived(
            alert @ (AlertDescription::CertificateRequired
            | AlertDescription::HandshakeFailure
            | AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::AccessDenied),
        ) => match cert_file {
            Some(cert_file) => ClientError::ClientCertRefused {
                addr,
                cert_file,
                alert: format!("alert {alert:?}"),
            },
            None => ClientError::Tls {
                addr,
                detail: e.to_string(),
            },
        },
        // A plain HTTP server answers the TLS hello with text: "HTTP/1.1 400 ...".
        rustls::Error::InvalidMessage(InvalidMessage::InvalidContentType)
            if client.endpoint.tls =>
        {
            ClientError::WantsHttp {
                addr,
                authority: client.endpoint.authority.clone(),
            }
        }
        _ => ClientError::Tls {
            addr,
            detail: e.to_string(),
        },
    }
}

/// The agent's certificate refused: untrusted, not for this host, out of its validity
/// period. None for the other reasons (rustls's words say those).
fn certificate_error(client: &Client, e: &CertificateError) -> Option<ClientError> {
    let addr = client.addr.clone();
    let host = client.endpoint.host().to_string();
    let expired = |when: String| {
        Some(ClientError::Expired {
            addr: addr.clone(),
            when,
        })
    };
    match e {
        CertificateError::UnknownIssuer => Some(ClientError::Untrusted {
            addr: addr.clone(),
            reason: match &client.files.ca_file {
                None => "unknown issuer: not one of the built-in web roots".to_string(),
                Some(path) => format!("unknown issuer: not a CA of {}", path.display()),
            },
        }),
        CertificateError::NotValidForName => Some(ClientError::WrongName {
            addr: addr.clone(),
            host,
            detail: "it names other hosts: use one of its names in --api".to_string(),
        }),
        CertificateError::NotValidForNameContext { presented, .. } => {
            Some(ClientError::WrongName {
                addr: addr.clone(),
                host,
                detail: names_detail(presented),
            })
        }
        CertificateError::Expired => expired("has expired".to_string()),
        CertificateError::ExpiredContext { time, not_after } => {
            expired(format!("expired {} ago", span(since(*not_after, *time))))
        }
        CertificateError::NotValidYet => expired("is not valid yet".to_string()),
        CertificateError::NotValidYetContext { time, not_before } => expired(format!(
            "is not valid for another {}",
            span(since(*time, *not_before))
        )),
        _ => None,
    }
}

/// What a certificate is valid for, from webpki's names (`DnsName("a")`,
/// `IpAddress(1.2.3.4)`), and what to do.
fn names_detail(presented: &[String]) -> String {
    let names: Vec<&str> = presented
        .iter()
        .filter_map(|n| {
            n.strip_prefix("DnsName(\"")
                .and_then(|n| n.strip_suffix("\")"))
                .or_else(|| {
                    n.strip_prefix("IpAddress(")
                        .and_then(|n| n.strip_suffix(')'))
                })
        })
        .collect();
    if names.is_empty() {
        "it names no host name or address (no subjectAltName): issue it with the agent's names"
            .to_string()
    } else {
        format!("it is for {}: use one of those in --api", names.join(", "))
    }
}

/// Seconds from `earlier` to `later` (0 when not later).
fn since(earlier: UnixTime, later: UnixTime) -> u64 {
    later.as_secs().saturating_sub(earlier.as_secs())
}

/// `secs` in the largest unit that keeps it readable.
fn span(secs: u64) -> String {
    match secs {
        s if s >= 2 * 86_400 => format!("{} days", s / 86_400),
        s if s >= 2 * 3_600 => format!("{} hours", s / 3_600),
        s if s >= 2 * 60 => format!("{} minutes", s / 60),
        s => format!("{s} seconds"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::thread::{self, JoinHandle};
    use std::time::Duration;

    use roce_testkit::pki::{Issued, TestCa};
    use roce_testkit::temp::TempDir;
    use rustls::server::WebPkiClientVerifier;

    use crate::api::client::tests::{answer, serve};
    use crate::api::client::{get_body, Credentials};

    const T: Duration = Duration::from_secs(5);
    const OK: &str =
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}";
    const UNAUTHORIZED: &str = "HTTP/1.1 401 Unauthorized\r\nwww-authenticate: Basic\r\ncontent-length: 12\r\n\r\nUnauthorized";
    /// The one user of the agent in these tests, and its header.
    const USER: &str = "ops:s3cr:et";
    const USER_HEADER: &str = "authorization: Basic b3BzOnMzY3I6ZXQ=";

    /// A test's certificates: the agent's CA, the agent's certificate (for 127.0.0.1
    /// unless said otherwise) and a client certificate of the same CA, as files.
    struct Pki {
        dir: TempDir,
        ca: TestCa,
        ca_file: PathBuf,
        server: Issued,
        client: (PathBuf, PathBuf),
    }

    fn pki(server_names: &[&str]) -> Pki {
        let dir = TempDir::new("client-tls");
        let ca = TestCa::new("roce-agent test CA");
        let ca_file = ca.write(dir.path(), "ca");
        let server = ca.server(server_names, 1);
        let client = ca.client("operator", 2).write(dir.path(), "client");
        Pki {
            dir,
            ca,
            ca_file,
            server,
            client,
        }
    }

    fn files(ca_file: Option<&Path>, client: Option<&(PathBuf, PathBuf)>) -> TlsFiles {
        TlsFiles {
            ca_file: ca_file.map(Path::to_path_buf),
            cert_file: client.map(|(c, _)| c.clone()),
            key_file: client.map(|(_, k)| k.clone()),
        }
    }

    #[allow(deprecated)]
    fn ring() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    /// The agent's TLS: `server`'s certificate; a client certificate signed by
    /// `client_ca` required when given.
    fn server_config(server: &Issued, client_ca: Option<&TestCa>) -> Arc<rustls::ServerConfig> {
        let builder = rustls::ServerConfig::builder_with_provider(ring())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                roots
                    .add(CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap())
                    .unwrap();
                builder.with_client_cert_verifier(
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), ring())
                        .build()
                        .unwrap(),
                )
            }
        };
        let key = PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes()).unwrap();
        Arc::new(
            builder
                .with_single_cert(vec![CertificateDer::from(server.cert_der.clone())], key)
                .unwrap(),
        )
    }

    /// A one-connection HTTPS server: reads the request's head and writes `answer`
    /// of it. Joins to the head, or to why there was none (the server's TLS error).
    fn serve_tls(
        config: Arc<rustls::ServerConfig>,
        answer: fn(&str) -> &'static str,
    ) -> (String, JoinHandle<Result<String, String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = thread::spawn(move || {
            let (tcp, _) = listener.accept().unwrap();
            tcp.set_read_timeout(Some(T)).unwrap();
            let conn = rustls::ServerConnection::new(config).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, tcp);
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match tls.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    Ok(_) => return Err("closed before the end of the head".to_string()),
                    Err(e) => {
                        // rustls sent its alert: let the client read it before the
                        // connection closes (closing on unread bytes resets it).
                        drain(&mut tls.sock);
                        return Err(e.to_string());
                    }
                }
            }
            let head = String::from_utf8(head).unwrap();
            tls.write_all(answer(&head).as_bytes()).unwrap();
            tls.conn.send_close_notify();
            tls.flush().unwrap();
            Ok(head)
        });
        (format!("https://127.0.0.1:{port}"), server)
    }

    /// Reads what the client still sends until it closes (or a second passes).
    fn drain(tcp: &mut TcpStream) {
        tcp.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut sink = [0u8; 4096];
        while matches!(tcp.read(&mut sink), Ok(n) if n > 0) {}
    }

    fn ok(_head: &str) -> &'static str {
        OK
    }

    /// 200 to [`USER`], 401 to anyone else.
    fn basic_auth(head: &str) -> &'static str {
        if head
            .lines()
            .any(|line| line.eq_ignore_ascii_case(USER_HEADER))
        {
            OK
        } else {
            UNAUTHORIZED
        }
    }

    #[test]
    fn https_trusting_the_agents_ca_reads_the_answer() {
        let pki = pki(&["127.0.0.1"]);
        let (url, server) = serve_tls(server_config(&pki.server, None), ok);
        let client = Client::new(&url, files(Some(&pki.ca_file), None), None).unwrap();
        assert_eq!(client.get_body("/flows", T).unwrap(), b"{}");
        let head = server.join().unwrap().unwrap();
        assert!(head.starts_with("GET /flows HTTP/1.1\r\n"), "{head}");
        assert!(
            !head.to_ascii_lowercase().contains("authorization"),
            "{head}"
        );
    }

    #[test]
    fn an_untrusted_certificate_says_to_pass_its_ca() {
        let pki = pki(&["127.0.0.1"]);
        // Not one of the web roots.
        let (url, server) = serve_tls(server_config(&pki.server, None), ok);
        let e = Client::plain(&url)
            .unwrap()
            .get_body("/flows", T)
            .unwrap_err();
        assert!(matches!(e, ClientError::Untrusted { .. }), "{e:?}");
        assert!(!e.is_usage(), "{e}");
        assert_eq!(
            e.to_string(),
            "the agent's certificate is not trusted (unknown issuer: not one of the built-in web roots): pass its CA with --ca-file"
        );
        assert!(server.join().unwrap().is_err());

        // Another CA than the one that signed it.
        let other = TestCa::new("another CA").write(pki.dir.path(), "other-ca");
        let (url, server) = serve_tls(server_config(&pki.server, None), ok);
        let client = Client::new(&url, files(Some(&other), None), None).unwrap();
        let e = client.get_body("/flows", T).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "the agent's certificate is not trusted (unknown issuer: not a CA of {}): pass its CA with --ca-file",
                other.display()
            )
        );
        assert!(server.join().unwrap().is_err());
    }

    #[test]
    fn a_certificate_for_other_names_names_them() {
        let pki = pki(&["agent1.example", "198.18.0.1"]);
        let (url, server) = serve_tls(server_config(&pki.server, None), ok);
        let client = Client::new(&url, files(Some(&pki.ca_file), None), None).unwrap();
        let e = client.get_body("/flows", T).unwrap_err();
        assert!(matches!(e, ClientError::WrongName { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "the certificate is not valid for 127.0.0.1: it is for agent1.example, 198.18.0.1: use one of those in --api"
        );
        assert!(server.join().unwrap().is_err());
    }

    #[test]
    fn mutual_tls_with_and_without_a_client_certificate() {
        let pki = pki(&["127.0.0.1"]);
        let config = server_config(&pki.server, Some(&pki.ca));

        let (url, server) = serve_tls(config.clone(), ok);
        let client = Client::new(&url, files(Some(&pki.ca_file), Some(&pki.client)), None).unwrap();
        assert_eq!(client.get_body("/flows", T).unwrap(), b"{}");
        server.join().unwrap().unwrap();

        let (url, server) = serve_tls(config.clone(), ok);
        let client = Client::new(&url, files(Some(&pki.ca_file), None), None).unwrap();
        let e = client.get_body("/flows", T).unwrap_err();
        assert!(matches!(e, ClientError::ClientCertRequired { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "the agent requires a client certificate: pass --cert-file and --key-file"
        );
        assert!(server.join().unwrap().is_err());

        // A certificate of a CA the agent does not trust.
        let stranger = TestCa::new("stranger CA")
            .client("stranger", 3)
            .write(pki.dir.path(), "stranger");
        let (url, server) = serve_tls(config, ok);
        let client = Client::new(&url, files(Some(&pki.ca_file), Some(&stranger)), None).unwrap();
        let e = client.get_body("/flows", T).unwrap_err();
        assert!(matches!(e, ClientError::ClientCertRefused { .. }), "{e:?}");
        assert!(
            e.to_string().starts_with(&format!(
                "the agent refused the client certificate of --cert-file {} (alert ",
                stranger.0.display()
            )),
            "{e}"
        );
        assert!(server.join().unwrap().is_err());
    }

    #[test]
    fn basic_auth_is_sent_and_a_401_says_what_to_do() {
        let pki = pki(&["127.0.0.1"]);
        let config = server_config(&pki.server, None);
        let ca = files(Some(&pki.ca_file), None);

        // From the environment's value, then from a file.
        let from_env = Credentials::find(Some(std::ffi::OsStr::new(USER)), None).unwrap();
        let auth_file = pki.dir.path().join("auth");
        std::fs::write(&auth_file, format!("{USER}\n")).unwrap();
        let from_file = Credentials::find(None, Some(&auth_file)).unwrap();
        for credentials in [from_env, from_file] {
            let (url, server) = serve_tls(config.clone(), basic_auth);
            let client = Client::new(&url, ca.clone(), credentials).unwrap();
            assert_eq!(client.get_body("/flows", T).unwrap(), b"{}");
            server.join().unwrap().unwrap();
        }

        let (url, server) = serve_tls(config.clone(), basic_auth);
        let e = Client::new(&url, ca.clone(), None)
            .unwrap()
            .get_body("/flows", T)
            .unwrap_err();
        assert!(matches!(e, ClientError::Unauthorized { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            "the agent refused the request: 401 Unauthorized (set ROCE_AGENT_AUTH=user:password or --auth-file)"
        );
        server.join().unwrap().unwrap();

        let (url, server) = serve_tls(config, basic_auth);
        let wrong = Credentials::find(Some(std::ffi::OsStr::new("ops:guess")), None).unwrap();
        let e = Client::new(&url, ca, wrong)
            .unwrap()
            .get_body("/flows", T)
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "the agent refused the request: 401 Unauthorized (the credentials were refused: check ROCE_AGENT_AUTH)"
        );
        server.join().unwrap().unwrap();
    }

    #[test]
    fn http_to_an_https_agent_says_to_use_https() {
        // What exporter-toolkit (Go's net/http) answers plain HTTP on a TLS port.
        let (addr, server) = serve(
            answer(
                "HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n",
            ),
            Duration::ZERO,
        );
        let e = get_body(&addr, "/flows", T).unwrap_err();
        assert!(matches!(e, ClientError::WantsHttps { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("the agent serves HTTPS: use --api https://{addr}")
        );
        server.join().unwrap();
    }

    #[test]
    fn https_to_a_plain_agent_says_to_use_http() {
        // A plain HTTP server answers the TLS hello with a 400.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = thread::spawn(move || {
            let (mut tcp, _) = listener.accept().unwrap();
            let mut hello = [0u8; 512];
            let n = tcp.read(&mut hello).unwrap();
            tcp.write_all(
                b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
            )
            .unwrap();
            drain(&mut tcp);
            n
        });
        let e = get_body(&format!("https://{addr}"), "/flows", T).unwrap_err();
        assert!(matches!(e, ClientError::WantsHttp { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!("the agent serves plain HTTP at {addr}: use --api http://{addr} (or give it a web config)")
        );
        // The hello was a TLS handshake record.
        assert!(server.join().unwrap() > 5);
    }

    #[test]
    fn a_silent_https_agent_times_out() {
        let silent = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("https://{}", silent.local_addr().unwrap());
        let start = std::time::Instant::now();
        let e = get_body(&url, "/flows", Duration::from_millis(200)).unwrap_err();
        assert!(
            matches!(&e, ClientError::Connect { error, .. } | ClientError::Io { error, .. } if error.kind() == std::io::ErrorKind::TimedOut),
            "{e:?}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{:?}",
            start.elapsed()
        );
    }

    #[test]
    fn tls_files_that_cannot_be_used_are_named_with_the_cause() {
        let pki = pki(&["127.0.0.1"]);
        let dir = pki.dir.path();
        let url = "https://127.0.0.1:9473";
        let new = |files: TlsFiles| Client::new(url, files, None).unwrap_err();
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };

        let missing = dir.join("missing.pem");
        let e = new(files(Some(&missing), None));
        assert!(e.is_usage(), "{e}");
        assert!(
            e.to_string().starts_with(&format!(
                "--ca-file {}: cannot read it: No such file",
                missing.display()
            )),
            "{e}"
        );

        let empty = write("empty.pem", "no PEM here\n");
        let e = new(files(Some(&empty), None));
        assert_eq!(
            e.to_string(),
            format!(
                "--ca-file {}: holds no certificate (no -----BEGIN CERTIFICATE----- block)",
                empty.display()
            )
        );
        let broken = write(
            "broken.pem",
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        );
        let e = new(files(Some(&broken), None));
        assert!(
            e.to_string()
                .starts_with(&format!("--ca-file {}: not PEM: ", broken.display())),
            "{e}"
        );
        // A certificate that is not a CA's cannot anchor trust... but parses: a
        // certificate whose DER is garbage cannot.
        let garbage = write(
            "garbage.pem",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        let e = new(files(Some(&garbage), None));
        assert!(
            e.to_string().starts_with(&format!(
                "--ca-file {}: certificate 1 of 1 is not a usable CA certificate: ",
                garbage.display()
            )),
            "{e}"
        );

        // The key of another certificate.
        let other = pki.ca.client("other", 9).write(dir, "other");
        let e = new(files(None, Some(&(pki.client.0.clone(), other.1.clone()))));
        assert!(e.is_usage(), "{e}");
        assert_eq!(
            e.to_string(),
            format!(
                "--key-file {}: not the key of the certificate in {}",
                other.1.display(),
                pki.client.0.display()
            )
        );
        // A certificate where the key should be.
        let e = new(files(
            None,
            Some(&(pki.client.0.clone(), pki.client.0.clone())),
        ));
        assert_eq!(
            e.to_string(),
            format!(
                "--key-file {}: holds no private key (no -----BEGIN PRIVATE KEY----- block)",
                pki.client.0.display()
            )
        );
        // One without the other.
        let e = new(TlsFiles {
            cert_file: Some(pki.client.0.clone()),
            ..TlsFiles::default()
        });
        assert!(matches!(e, ClientError::Usage(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "--cert-file and --key-file go together: pass both"
        );
        // Any of them with a plain http:// agent.
        let e = Client::new("127.0.0.1:9473", files(Some(&pki.ca_file), None), None).unwrap_err();
        assert!(matches!(e, ClientError::Usage(_)), "{e:?}");
    }

    #[test]
    fn an_expired_or_early_certificate_says_when() {
        let client = Client::plain("https://127.0.0.1:9473").unwrap();
        let at = |secs| UnixTime::since_unix_epoch(Duration::from_secs(secs));
        let expired = rustls::Error::InvalidCertificate(CertificateError::ExpiredContext {
            time: at(1_000_000 + 3 * 86_400 + 5),
            not_after: at(1_000_000),
        });
        assert_eq!(
            explain(&client, &expired).to_string(),
            "the agent's certificate expired 3 days ago: renew it (the agent's cert_file) or check the clocks"
        );
        let early = rustls::Error::InvalidCertificate(CertificateError::NotValidYetContext {
            time: at(1_000_000),
            not_before: at(1_000_000 + 300),
        });
        assert_eq!(
            explain(&client, &early).to_string(),
            "the agent's certificate is not valid for another 5 minutes: renew it (the agent's cert_file) or check the clocks"
        );
        // Other failures keep rustls's words.
        let other = rustls::Error::InvalidCertificate(CertificateError::BadSignature);
        let e = explain(&client, &other);
        assert!(matches!(e, ClientError::Tls { .. }), "{e:?}");
    }
}
