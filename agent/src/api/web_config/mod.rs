//! The web configuration file (`run --web-config-file FILE`): how the API is served,
//! in the format and with the meaning of Prometheus exporter-toolkit's
//! `--web.config.file`, so that one file serves node_exporter and this agent alike.
//!
//! ```yaml
//! tls_server_config:            # TLS (absent or empty: plain HTTP); see `tls`
//!   cert_file: server.crt       # relative paths are relative to this file's directory
//!   key_file: server.key
//!   client_auth_type: RequireAndVerifyClientCert
//!   client_ca_file: clients-ca.pem
//! http_server_config:
//!   http2: true                 # accepted and ignored: the agent serves HTTP/1.1 only
//!   headers:                    # only these five names, as exporter-toolkit
//!     X-Frame-Options: deny
//! basic_auth_users:             # user: bcrypt hash (`htpasswd -nBC 10 "" | tr -d ':\n'`)
//!   prometheus: $2y$10$...
//! rate_limit:                   # a token bucket over all requests; see `rate_limit`
//!   interval: 1s
//!   burst: 20
//! ```
//!
//! Parts: this file reads the YAML (every key optional, none unknown: exporter-toolkit
//! unmarshals strictly) and checks the headers; `tls` turns `tls_server_config` into a
//! rustls `ServerConfig`; `basic_auth` checks `Authorization` headers against
//! `basic_auth_users`; `rate_limit` is the token bucket. [`WebConfig::load`] reads and
//! checks everything at once (the certificate, key and CA files too) and a refusal names
//! the file, the key and the cause. Unlike exporter-toolkit, which reads the file again
//! on every request, the agent reads it once at start.

mod basic_auth;
mod rate_limit;
mod tls;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::http::{header, HeaderName, HeaderValue};
use serde::Deserialize;

pub use basic_auth::BasicAuthUsers;
pub use rate_limit::RateLimiter;

/// How the API is served: TLS or not, who may read it, the extra response headers.
#[derive(Clone, Debug)]
pub struct WebConfig {
    /// The TLS server configuration (None: plain HTTP). Its ALPN offers `http/1.1`.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// `basic_auth_users`: when not empty, every request needs one of them
    /// (answer 401 with `WWW-Authenticate: Basic` otherwise).
    pub users: Arc<BasicAuthUsers>,
    /// `http_server_config.headers`, to add to every response.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// `rate_limit` (None: no limit): a request it does not allow is answered 429.
    pub rate_limit: Option<Arc<RateLimiter>>,
    /// The file this was read from (None: no file, [`WebConfig::plain`]).
    pub source: Option<PathBuf>,
    /// What `tls` does, for [`WebConfig::summary`] (e.g. "1.2 or newer").
    tls_summary: String,
    /// Whether `tls` requires a client certificate the CA signed.
    client_certificates: bool,
}

/// Why a web configuration file was refused.
#[derive(Debug, thiserror::Error)]
pub enum WebConfigError {
    /// The file itself cannot be read.
    #[error("web config {}: cannot read it: {}", path.display(), io_cause(error))]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Not YAML, or not this format (an unknown key, a value of the wrong type).
    #[error("web config {}: {message}", path.display())]
    Parse { path: PathBuf, message: String },
    /// A key's value is refused.
    #[error("web config {}: {key}: {message}", path.display())]
    Invalid {
        path: PathBuf,
        key: String,
        message: String,
    },
    /// A file that a key names is missing, unreadable or does not hold what it should.
    #[error("web config {}: {key} {}: {message}", path.display(), file.display())]
    File {
        path: PathBuf,
        key: &'static str,
        file: PathBuf,
        message: String,
    },
}

impl WebConfigError {
    fn invalid(path: &Path, key: impl Into<String>, message: impl Into<String>) -> Self {
        WebConfigError::Invalid {
            path: path.to_path_buf(),
            key: key.into(),
            message: message.into(),
        }
    }

    fn file(path: &Path, key: &'static str, file: &Path, message: impl Into<String>) -> Self {
        WebConfigError::File {
            path: path.to_path_buf(),
            key,
            file: file.to_path_buf(),
            message: message.into(),
        }
    }
}

/// An I/O error as a refusal says it: "no such file", "permission denied".
fn io_cause(error: &std::io::Error) -> String {
    match error.kind() {
        std::io::ErrorKind::NotFound => "no such file".to_string(),
        std::io::ErrorKind::PermissionDenied => "permission denied".to_string(),
        _ => error.to_string(),
    }
}

/// The file as written.
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    expecting = "a mapping of tls_server_config, http_server_config, basic_auth_users, rate_limit"
)]
struct FileConfig {
    #[serde(default)]
    tls_server_config: Option<tls::TlsSection>,
    #[serde(default)]
    http_server_config: Option<HttpSection>,
    #[serde(default)]
    basic_auth_users: Option<UniqueMap>,
    #[serde(default)]
    rate_limit: Option<rate_limit::RateLimitSection>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping (http2, headers)")]
struct HttpSection {
    /// exporter-toolkit turns HTTP/2 off with `false`; the agent never offers it.
    #[serde(default)]
    #[allow(dead_code)]
    http2: Option<bool>,
    #[serde(default)]
    headers: Option<UniqueMap>,
}

/// A mapping of strings in which a key appears once (Go's strict YAML refuses a
/// repeated key; serde_norway would keep the last).
#[derive(Debug, Default)]
struct UniqueMap(BTreeMap<String, String>);

impl<'de> Deserialize<'de> for UniqueMap {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = UniqueMap;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a mapping of strings to strings")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<UniqueMap, A::Error> {
                let mut out = BTreeMap::new();
                while let Some((key, value)) = map.next_entry::<String, String>()? {
                    if out.contains_key(&key) {
                        return Err(serde::de::Error::custom(format!("{key:?} appears twice")));
                    }
                    out.insert(key, value);
                }
                Ok(UniqueMap(out))
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

/// The response headers a file may set, and the values allowed for each (empty: any),
/// as exporter-toolkit's list, for consistency across the Prometheus ecosystem.
const ALLOWED_HEADERS: [(&str, HeaderName, &[&str]); 5] = [
    (
        "Strict-Transport-Security",
        header::STRICT_TRANSPORT_SECURITY,
        &[],
    ),
    (
        "X-Content-Type-Options",
        header::X_CONTENT_TYPE_OPTIONS,
        &["nosniff"],
    ),
    (
        "X-Frame-Options",
        header::X_FRAME_OPTIONS,
        &["deny", "sameorigin"],
    ),
    ("X-XSS-Protection", header::X_XSS_PROTECTION, &[]),
    (
        "Content-Security-Policy",
        header::CONTENT_SECURITY_POLICY,
        &[],
    ),
];

impl WebConfig {
    /// No file: plain HTTP, no users, no extra headers, no rate limit.
    pub fn plain() -> WebConfig {
        WebConfig {
            tls: None,
            users: Arc::new(BasicAuthUsers::default()),
            headers: Vec::new(),
            rate_limit: None,
            source: None,
            tls_summary: String::new(),
            client_certificates: false,
        }
    }

    /// Reads and checks `path`: the YAML, the certificate, key and CA files it names, the
    /// bcrypt hashes, the headers. An empty file is plain HTTP.
    pub fn load(path: &Path) -> Result<WebConfig, WebConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| WebConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        let file = parse(path, &text)?;
        let dir = path.parent().unwrap_or(Path::new(""));
        let tls = match file.tls_server_config {
            Some(section) => tls::build(path, dir, section)?,
            None => None,
        };
        let headers = match file.http_server_config.and_then(|h| h.headers) {
            Some(headers) => check_headers(path, headers.0)?,
            None => Vec::new(),
        };
        let users = BasicAuthUsers::new(file.basic_auth_users.unwrap_or_default().0).map_err(
            |(user, message)| {
                WebConfigError::invalid(path, format!("basic_auth_users.{user}"), message)
            },
        )?;
        let rate_limit = match file.rate_limit {
            Some(section) => rate_limit::build(path, section)?,
            None => None,
        };
        let (tls, tls_summary, client_certificates) = match tls {
            Some(t) => (Some(t.config), t.summary, t.authenticates),
            None => (None, String::new(), false),
        };
        Ok(WebConfig {
            tls,
            users: Arc::new(users),
            headers,
            rate_limit: rate_limit.map(Arc::new),
            source: Some(path.to_path_buf()),
            tls_summary,
            client_certificates,
        })
    }

    /// One line for the start log, e.g. "TLS (1.2 or newer, client certificates
    /// required), basic auth (2 users)" or "plain HTTP, no authentication".
    pub fn summary(&self) -> String {
        let transport = match &self.tls {
            Some(_) => format!("TLS ({})", self.tls_summary),
            None => "plain HTTP".to_string(),
        };
        let auth = match self.users.len() {
            0 if self.tls.is_some() && self.client_certificates => "no basic auth".to_string(),
            0 => "no authentication".to_string(),
            1 => "basic auth (1 user)".to_string(),
            n => format!("basic auth ({n} users)"),
        };
        let mut line = format!("{transport}, {auth}");
        match self.headers.len() {
            0 => {}
            1 => line.push_str(", 1 extra response header"),
            n => line.push_str(&format!(", {n} extra response headers")),
        }
        if let Some(limit) = &self.rate_limit {
            line.push_str(&format!(", rate limit ({})", limit.describe()));
        }
        line
    }
}

/// The YAML, strictly: an unknown key or a duplicate one is refused. A file with no
/// document (empty, or only comments) is the empty configuration.
fn parse(path: &Path, text: &str) -> Result<FileConfig, WebConfigError> {
    serde_norway::from_str::<Option<FileConfig>>(text)
        .map(Option::unwrap_or_default)
        .map_err(|e| WebConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
}

/// `http_server_config.headers`: exporter-toolkit's five names (spelt as it spells
/// them), the enumerated values exactly; a blank free-form value sets nothing.
fn check_headers(
    path: &Path,
    headers: BTreeMap<String, String>,
) -> Result<Vec<(HeaderName, HeaderValue)>, WebConfigError> {
    let mut out = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        let key = format!("http_server_config.headers.{name}");
        let Some((_, header, allowed)) = ALLOWED_HEADERS.iter().find(|(n, _, _)| *n == name) else {
            let names: Vec<&str> = ALLOWED_HEADERS.iter().map(|(n, _, _)| *n).collect();
            return Err(WebConfigError::invalid(
                path,
                key,
                format!(
                    "this header cannot be configured (the allowed ones: {})",
                    names.join(", ")
                ),
            ));
        };
        if !allowed.is_empty() && !allowed.contains(&value.as_str()) {
            return Err(WebConfigError::invalid(
                path,
                key,
                format!(
                    "{value:?} is not allowed (use one of: {})",
                    allowed.join(", ")
                ),
            ));
        }
        if value.is_empty() {
            continue;
        }
        let value = HeaderValue::from_str(&value).map_err(|_| {
            WebConfigError::invalid(path, key, "not a valid header value (control characters?)")
        })?;
        out.push((header.clone(), value));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_testkit::pki::TestCa;
    use roce_testkit::temp::TempDir;

    fn write(dir: &TempDir, name: &str, text: &str) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn refusal(dir: &TempDir, text: &str) -> String {
        let path = write(dir, "web.yml", text);
        match WebConfig::load(&path) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn plain_is_plain_http_without_authentication() {
        let c = WebConfig::plain();
        assert!(c.tls.is_none() && c.users.is_empty() && c.headers.is_empty());
        assert_eq!(c.summary(), "plain HTTP, no authentication");
    }

    #[test]
    fn an_empty_file_or_only_comments_is_plain_http() {
        let dir = TempDir::new("web-config-empty");
        for text in ["", "\n", "# nothing here\n", "---\n"] {
            let c = WebConfig::load(&write(&dir, "web.yml", text)).unwrap();
            assert!(c.tls.is_none(), "{text:?}");
            assert_eq!(c.summary(), "plain HTTP, no authentication");
            assert_eq!(
                c.source.as_deref(),
                Some(dir.path().join("web.yml").as_path())
            );
        }
    }

    #[test]
    fn a_full_file_is_read_with_paths_relative_to_its_directory() {
        let dir = TempDir::new("web-config-full");
        let ca = TestCa::new("clients");
        ca.write(dir.path(), "clients-ca");
        TestCa::new("server ca")
            .server(&["198.18.0.1"], 7)
            .write(dir.path(), "server");
        let alice = bcrypt::hash("a", 4).unwrap();
        let bob = bcrypt::hash("b", 4).unwrap();
        let text = format!(
            "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  \
             client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: clients-ca.pem\n  \
             min_version: TLS12\n  max_version: TLS13\n  \
             cipher_suites: [TLS_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]\n  \
             curve_preferences: [X25519, CurveP256]\n  prefer_server_cipher_suites: true\n\
             http_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n    \
             X-XSS-Protection: 0\n    Content-Security-Policy: \"\"\n\
             basic_auth_users:\n  alice: {alice}\n  bob: '{bob}'\n\
             rate_limit:\n  interval: 1s\n  burst: 20\n"
        );
        let c = WebConfig::load(&write(&dir, "web.yml", &text)).unwrap();
        let tls = c.tls.as_ref().unwrap();
        assert_eq!(tls.alpn_protocols, vec![b"http/1.1".to_vec()]);
        assert!(tls.ignore_client_order);
        assert_eq!(c.users.len(), 2);
        assert_eq!(
            c.headers,
            vec![
                (header::X_FRAME_OPTIONS, HeaderValue::from_static("deny")),
                (header::X_XSS_PROTECTION, HeaderValue::from_static("0")),
            ]
        );
        assert_eq!(
            c.summary(),
            "TLS (1.2 or newer, client certificates required), basic auth (2 users), \
             2 extra response headers, rate limit (burst 20, then 1 request per 1s)"
        );
    }

    #[test]
    fn unknown_keys_are_refused_naming_them() {
        let dir = TempDir::new("web-config-unknown");
        let e = refusal(&dir, "tls_server_config:\n  cert_filse: server.crt\n");
        assert!(
            e.contains("web.yml: ") && e.contains("unknown field `cert_filse`"),
            "{e}"
        );
        let e = refusal(&dir, "basic_auth: {}\n");
        assert!(e.contains("unknown field `basic_auth`"), "{e}");
        let e = refusal(&dir, "http_server_config:\n  http3: true\n");
        assert!(e.contains("unknown field `http3`"), "{e}");
        let e = refusal(&dir, "just a string\n");
        assert!(e.contains("expected a mapping of tls_server_config"), "{e}");
        let e = refusal(&dir, "tls_server_config:\n  cert_file: [a]\n");
        assert!(
            e.contains("tls_server_config.cert_file: invalid type: sequence"),
            "{e}"
        );
        let e = refusal(&dir, "basic_auth_users:\n  a: x\n  a: y\n");
        assert!(e.contains("basic_auth_users: \"a\" appears twice"), "{e}");
        let e = refusal(&dir, "rate_limit: {}\nrate_limit: {}\n");
        assert!(e.contains("duplicate field `rate_limit`"), "{e}");
        let e = refusal(&dir, "basic_auth_users:\n  a:\n");
        assert!(e.contains("basic_auth_users"), "{e}");
        let e = refusal(&dir, "tls_server_config: [\n");
        assert!(e.contains("web.yml: "), "{e}");
    }

    #[test]
    fn a_missing_file_is_refused_as_such() {
        let dir = TempDir::new("web-config-missing");
        let e = WebConfig::load(&dir.path().join("nope.yml")).unwrap_err();
        assert!(
            e.to_string()
                .ends_with("nope.yml: cannot read it: no such file"),
            "{e}"
        );
    }

    #[test]
    fn only_exporter_toolkit_headers_and_values_are_accepted() {
        let dir = TempDir::new("web-config-headers");
        let e = refusal(&dir, "http_server_config:\n  headers:\n    Server: x\n");
        assert!(
            e.contains("http_server_config.headers.Server: this header cannot be configured"),
            "{e}"
        );
        // Names are spelt as exporter-toolkit spells them.
        let e = refusal(
            &dir,
            "http_server_config:\n  headers:\n    x-frame-options: deny\n",
        );
        assert!(e.contains("cannot be configured"), "{e}");
        let e = refusal(
            &dir,
            "http_server_config:\n  headers:\n    X-Frame-Options: allow\n",
        );
        assert!(
            e.contains(
                "headers.X-Frame-Options: \"allow\" is not allowed (use one of: deny, sameorigin)"
            ),
            "{e}"
        );
        let e = refusal(
            &dir,
            "http_server_config:\n  headers:\n    X-Content-Type-Options: sniff\n",
        );
        assert!(e.contains("use one of: nosniff"), "{e}");
        let ok = "http_server_config:\n  headers:\n    Strict-Transport-Security: max-age=31536000; includeSubDomains\n    X-Content-Type-Options: nosniff\n";
        let c = WebConfig::load(&write(&dir, "ok.yml", ok)).unwrap();
        assert_eq!(c.headers.len(), 2);
        assert_eq!(
            c.summary(),
            "plain HTTP, no authentication, 2 extra response headers"
        );
    }

    #[test]
    fn a_hash_that_is_not_bcrypt_is_refused_naming_the_user() {
        let dir = TempDir::new("web-config-bcrypt");
        let e = refusal(&dir, "basic_auth_users:\n  alice: secret\n");
        assert!(
            e.contains("web.yml: basic_auth_users.alice: not a bcrypt hash"),
            "{e}"
        );
        assert!(!e.contains("secret"), "{e}");
        let users = "basic_auth_users:\n  alice: $2y$04$abcdefghijklmnopqrstuuabcdefghijklmnopqrstuvwxyzABC\n";
        let e = refusal(&dir, users);
        assert!(
            e.contains("basic_auth_users.alice: not a bcrypt hash"),
            "{e}"
        );
    }
}
