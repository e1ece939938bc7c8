//! Basic auth of the API client: `user:password` from the environment variable
//! [`AUTH_ENV`] or from the first line of a file (`--auth-file`), never from the
//! command line (where `ps` shows it), sent as `Authorization: Basic ...` (RFC 7617).

use std::ffi::OsStr;
use std::fmt;
use std::path::Path;

use super::ClientError;

/// The environment variable that holds `user:password`.
pub const AUTH_ENV: &str = "ROCE_AGENT_AUTH";

/// A user and password for the agent's `basic_auth_users`, and where they came from.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    user: String,
    password: String,
    /// `ROCE_AGENT_AUTH` or `--auth-file FILE`, for messages.
    origin: String,
}

/// Without the password.
impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl Credentials {
    /// The credentials of a client: the first line of `file` when one is given, else
    /// `env`, the value of [`AUTH_ENV`] (unset or empty: none). Taking the value rather
    /// than reading the environment keeps the choice testable.
    pub fn find(
        env: Option<&OsStr>,
        file: Option<&Path>,
    ) -> Result<Option<Credentials>, ClientError> {
        if let Some(path) = file {
            let origin = format!("--auth-file {}", path.display());
            let text = std::fs::read_to_string(path).map_err(|e| ClientError::Credentials {
                origin: origin.clone(),
                message: format!("cannot read it: {e}"),
            })?;
            let line = text.lines().next().unwrap_or_default();
            return Credentials::parse(line, origin).map(Some);
        }
        match env {
            None => Ok(None),
            Some(value) if value.is_empty() => Ok(None),
            Some(value) => {
                let text = value.to_str().ok_or_else(|| ClientError::Credentials {
                    origin: AUTH_ENV.to_string(),
                    message: "not UTF-8".to_string(),
                })?;
                Credentials::parse(text, AUTH_ENV.to_string()).map(Some)
            }
        }
    }

    /// `user:password` (the user up to the first `:`, the password after it, which may
    /// hold `:`); `origin` names where the text came from. The error never quotes the
    /// text: it may be a password.
    pub fn parse(text: &str, origin: String) -> Result<Credentials, ClientError> {
        let invalid = |message: &str| ClientError::Credentials {
            origin: origin.clone(),
            message: message.to_string(),
        };
        let (user, password) = text
            .split_once(':')
            .ok_or_else(|| invalid("not user:password (no ':' in it)"))?;
        if user.is_empty() {
            return Err(invalid("not user:password (no user before the ':')"));
        }
        if text.chars().any(char::is_control) {
            return Err(invalid("not user:password (it holds a control character)"));
        }
        Ok(Credentials {
            user: user.to_string(),
            password: password.to_string(),
            origin,
        })
    }

    /// Where the credentials came from: `ROCE_AGENT_AUTH` or `--auth-file FILE`.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The value of the `Authorization` header: `Basic base64(user:password)`.
    pub fn header(&self) -> String {
        format!(
            "Basic {}",
            base64(format!("{}:{}", self.user, self.password).as_bytes())
        )
    }
}

/// `bytes` in base64 (RFC 4648, with padding).
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for (i, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 0x3f) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_testkit::temp::TempFile;

    #[test]
    fn base64_matches_rfc_4648_test_vectors() {
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded, "{plain:?}");
        }
        // RFC 7617's example.
        let c = Credentials::parse("Aladdin:open sesame", "test".into()).unwrap();
        assert_eq!(c.header(), "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ==");
    }

    #[test]
    fn credentials_come_from_the_file_first_then_the_environment() {
        assert_eq!(Credentials::find(None, None).unwrap(), None);
        assert_eq!(Credentials::find(Some(OsStr::new("")), None).unwrap(), None);
        let env = Credentials::find(Some(OsStr::new("alice:pa:ss")), None)
            .unwrap()
            .unwrap();
        assert_eq!(
            (env.user.as_str(), env.password.as_str()),
            ("alice", "pa:ss")
        );
        assert_eq!(env.origin(), "ROCE_AGENT_AUTH");

        // The first line of the file; the file wins over the environment.
        let file = TempFile::new("auth", "bob:secret\r\nignored:line\n");
        let c = Credentials::find(Some(OsStr::new("alice:x")), Some(file.path()))
            .unwrap()
            .unwrap();
        assert_eq!((c.user.as_str(), c.password.as_str()), ("bob", "secret"));
        assert_eq!(c.origin(), format!("--auth-file {}", file.arg()));
    }

    #[test]
    fn bad_credentials_are_usage_errors_that_never_show_the_password() {
        for bad in ["alice", ":secret", "alice:sec\tret"] {
            let e = Credentials::find(Some(OsStr::new(bad)), None).unwrap_err();
            assert!(e.is_usage(), "{e}");
            assert!(
                e.to_string()
                    .starts_with("ROCE_AGENT_AUTH: not user:password"),
                "{e}"
            );
            assert!(
                !e.to_string().contains("secret") && !e.to_string().contains("alice"),
                "{e}"
            );
        }
        let e = Credentials::find(None, Some(Path::new("/nonexistent/auth"))).unwrap_err();
        assert!(e.is_usage(), "{e}");
        assert!(
            e.to_string()
                .starts_with("--auth-file /nonexistent/auth: cannot read it: "),
            "{e}"
        );
        let c = Credentials::parse("alice:hunter2", "test".into()).unwrap();
        assert!(!format!("{c:?}").contains("hunter2"), "{c:?}");
    }
}
