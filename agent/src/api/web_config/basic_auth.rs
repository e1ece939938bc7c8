//! `basic_auth_users`: who may read the API, as user name and bcrypt hash, checked
//! against a request's `Authorization: Basic base64(user:password)` header.
//!
//! bcrypt is slow on purpose (tens of milliseconds at cost 10), so a verdict is
//! remembered, keyed by a SHA-256 of the user and password (the password itself is not
//! kept), in a bounded cache: a scraper every 15 s pays bcrypt once. Comparisons run one
//! at a time on a blocking thread, as exporter-toolkit serialises them, so that a flood
//! of wrong passwords costs one core at most. An unknown user still costs a bcrypt
//! comparison (against a dummy hash at the users' cost), so that timing does not tell
//! which users exist.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use axum::http::HeaderValue;
use rustls::SupportedCipherSuite;
use tokio::sync::Semaphore;

/// Verdicts remembered at most; the cache is emptied when it is full.
const CACHE_ENTRIES: usize = 1024;

/// A well-formed bcrypt hash that no password gives (the salt and digest are text), for
/// an unknown user; `{cost}` is the users' highest cost.
const DUMMY_SALT_AND_DIGEST: &str = "roceagentnosuchuserxyuroceagentnosuchuserdummyhashxyu";

/// The users and their bcrypt hashes, and the verdicts remembered.
pub struct BasicAuthUsers {
    users: BTreeMap<String, String>,
    dummy: String,
    cache: Mutex<HashMap<[u8; 32], bool>>,
    bcrypt_runs: AtomicU64,
    one_at_a_time: Semaphore,
}

impl Default for BasicAuthUsers {
    /// No users: no authentication.
    fn default() -> Self {
        BasicAuthUsers::with(BTreeMap::new(), 10)
    }
}

impl fmt::Debug for BasicAuthUsers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BasicAuthUsers")
            .field("users", &self.users.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl BasicAuthUsers {
    /// `basic_auth_users` checked: each hash a bcrypt hash (`$2a$`, `$2b$`, `$2x$`,
    /// `$2y$`, cost 4 to 31), each name without ':' (Basic splits on the first one).
    /// A refusal is (user, why).
    pub(super) fn new(users: BTreeMap<String, String>) -> Result<BasicAuthUsers, (String, String)> {
        let mut highest = 0;
        for (user, hash) in &users {
            if user.contains(':') {
                return Err((
                    user.clone(),
                    "a user name cannot contain ':' (Basic authentication splits on the first one)"
                        .to_string(),
                ));
            }
            let cost = bcrypt::HashParts::from_str(hash)
                .map(|h| h.get_cost())
                .map_err(|e| (user.clone(), format!("not a bcrypt hash: {e}")))?;
            if !(4..=31).contains(&cost) {
                return Err((
                    user.clone(),
                    format!("not a bcrypt hash: cost {cost} is not between 4 and 31"),
                ));
            }
            highest = highest.max(cost);
        }
        Ok(BasicAuthUsers::with(users, highest.max(4)))
    }

    fn with(users: BTreeMap<String, String>, dummy_cost: u32) -> BasicAuthUsers {
        BasicAuthUsers {
            users,
            dummy: format!("$2b${dummy_cost:02}${DUMMY_SALT_AND_DIGEST}"),
            cache: Mutex::new(HashMap::new()),
            bcrypt_runs: AtomicU64::new(0),
            one_at_a_time: Semaphore::new(1),
        }
    }

    /// No users: every request may go.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// How many users.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// How many bcrypt comparisons ran (requests the cache did not answer).
    pub fn bcrypt_runs(&self) -> u64 {
        self.bcrypt_runs.load(Ordering::Relaxed)
    }

    /// Whether `authorization` (a request's `Authorization` header) names a user with
    /// the right password; true when there are no users. A missing or malformed header,
    /// an unknown user or a wrong password is false.
    pub async fn verify(&self, authorization: Option<&HeaderValue>) -> bool {
        if self.users.is_empty() {
            return true;
        }
        let Some((user, password)) = authorization.and_then(|v| parse_basic(v.as_bytes())) else {
            return false;
        };
        let key = cache_key(&user, &password);
        if let Some(verdict) = self.remembered(&key) {
            return verdict;
        }
        let Ok(_permit) = self.one_at_a_time.acquire().await else {
            return false;
        };
        // Another request may have settled it while this one waited.
        if let Some(verdict) = self.remembered(&key) {
            return verdict;
        }
        let known = std::str::from_utf8(&user)
            .ok()
            .and_then(|u| self.users.get(u));
        let hash = known.unwrap_or(&self.dummy).clone();
        self.bcrypt_runs.fetch_add(1, Ordering::Relaxed);
        let matched = tokio::task::spawn_blocking(move || bcrypt::verify(password, &hash)).await;
        let verdict = match matched {
            Ok(Ok(matched)) => known.is_some() && matched,
            // A panic, or a hash bcrypt refuses (checked at load): refuse, remember nothing.
            _ => return false,
        };
        self.remember(key, verdict);
        verdict
    }

    fn remember(&self, key: [u8; 32], verdict: bool) {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= CACHE_ENTRIES {
            cache.clear();
        }
        cache.insert(key, verdict);
    }

    fn remembered(&self, key: &[u8; 32]) -> Option<bool> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        cache.get(key).copied()
    }
}

/// SHA-256 of the user's length, the user and the password (ring's, through rustls).
fn cache_key(user: &[u8], password: &[u8]) -> [u8; 32] {
    let sha256 = match rustls::crypto::ring::cipher_suite::TLS13_AES_128_GCM_SHA256 {
        SupportedCipherSuite::Tls13(s) => s.common.hash_provider,
        SupportedCipherSuite::Tls12(s) => s.common.hash_provider,
    };
    let mut context = sha256.start();
    context.update(&u64::try_from(user.len()).unwrap_or(u64::MAX).to_be_bytes());
    context.update(user);
    context.update(password);
    let digest = context.finish();
    let mut key = [0u8; 32];
    for (k, d) in key.iter_mut().zip(digest.as_ref()) {
        *k = *d;
    }
    key
}

/// `Basic base64(user:password)` (the scheme in any case, as Go reads it) into user and
/// password.
fn parse_basic(value: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
    let (scheme, encoded) = value.split_at_checked(6)?;
    if !scheme.eq_ignore_ascii_case(b"Basic ") {
        return None;
    }
    let decoded = decode_base64(encoded)?;
    let colon = decoded.iter().position(|&b| b == b':')?;
    Some((decoded[..colon].to_vec(), decoded[colon + 1..].to_vec()))
}

/// Standard base64 with its padding (RFC 4648 section 4), as Go's `StdEncoding`.
fn decode_base64(text: &[u8]) -> Option<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        Some(u32::from(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        }))
    }
    if !text.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let quads = text.len() / 4;
    for (i, quad) in text.chunks_exact(4).enumerate() {
        let padding = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if padding > 2 || (padding > 0 && i + 1 != quads) {
            return None;
        }
        let mut bits = 0u32;
        for &c in &quad[..4 - padding] {
            bits = bits << 6 | sextet(c)?;
        }
        bits <<= 6 * padding;
        out.extend_from_slice(&bits.to_be_bytes()[1..4 - padding]);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(user: &str, password: &str) -> HeaderValue {
        let text = format!("{user}:{password}");
        HeaderValue::from_str(&format!("Basic {}", encode(text.as_bytes()))).unwrap()
    }

    /// A plain base64 encoder, for the tests only.
    fn encode(bytes: &[u8]) -> String {
        const ALPHABET: &[u8; 64] =
            b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let mut b = [0u8; 3];
            b[..chunk.len()].copy_from_slice(chunk);
            let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    fn users(list: &[(&str, &str)]) -> BasicAuthUsers {
        let map = list
            .iter()
            .map(|(u, p)| (u.to_string(), bcrypt::hash(p, 4).unwrap()))
            .collect();
        BasicAuthUsers::new(map).unwrap()
    }

    #[test]
    fn base64_decodes_as_go_std_encoding() {
        assert_eq!(decode_base64(b"").unwrap(), b"");
        assert_eq!(decode_base64(b"YQ==").unwrap(), b"a");
        assert_eq!(decode_base64(b"YWI=").unwrap(), b"ab");
        assert_eq!(decode_base64(b"YWJj").unwrap(), b"abc");
        assert_eq!(decode_base64(b"YWxpY2U6cyNjcjN0").unwrap(), b"alice:s#cr3t");
        for bad in [&b"YQ"[..], b"YQ=", b"Y===", b"YQ==YQ==", b"Y!==", b"YW=j"] {
            assert_eq!(decode_base64(bad), None, "{bad:?}");
        }
        for s in ["", "a", "ab", "abc", "abcd", "\u{e9}t\u{e9}:x"] {
            assert_eq!(
                decode_base64(encode(s.as_bytes()).as_bytes()).unwrap(),
                s.as_bytes()
            );
        }
    }

    #[test]
    fn basic_headers_are_parsed_as_go_does() {
        let ok = |v: &str| parse_basic(v.as_bytes());
        let pair = |u: &str, p: &str| Some((u.as_bytes().to_vec(), p.as_bytes().to_vec()));
        assert_eq!(ok("Basic YWxpY2U6cDpx"), pair("alice", "p:q"));
        assert_eq!(ok("basic YWxpY2U6"), pair("alice", ""));
        assert_eq!(ok("BASIC OnA="), pair("", "p"));
        assert_eq!(ok("Bearer YWxpY2U6cA=="), None);
        assert_eq!(ok("Basic  YWxpY2U6cA=="), None);
        assert_eq!(ok("Basic YWxpY2U="), None); // no colon
        assert_eq!(ok("Basic"), None);
    }

    #[test]
    fn the_dummy_hash_parses_at_every_cost_and_matches_nothing() {
        for cost in 4..=31 {
            let users = BasicAuthUsers::with(BTreeMap::new(), cost);
            let parts = bcrypt::HashParts::from_str(&users.dummy).unwrap();
            assert_eq!(parts.get_cost(), cost);
        }
        let users = BasicAuthUsers::with(BTreeMap::new(), 4);
        assert!(!bcrypt::verify("", &users.dummy).unwrap());
        assert!(!bcrypt::verify("fakepassword", &users.dummy).unwrap());
    }

    #[test]
    fn hashes_and_names_are_checked_at_load() {
        let load = |user: &str, hash: String| {
            BasicAuthUsers::new(BTreeMap::from([(user.to_string(), hash)])).map(|_| ())
        };
        let good = bcrypt::hash("pw", 4).unwrap();
        assert!(load("alice", good.clone()).is_ok());
        assert!(load("alice", good.replacen("$2b$", "$2y$", 1)).is_ok());
        let (user, why) = load("alice", "plaintext".to_string()).unwrap_err();
        assert_eq!(user, "alice");
        assert!(why.starts_with("not a bcrypt hash"), "{why}");
        let (_, why) = load("alice", good.replacen("$04$", "$03$", 1)).unwrap_err();
        assert_eq!(why, "not a bcrypt hash: cost 3 is not between 4 and 31");
        let (_, why) = load("a:b", good).unwrap_err();
        assert!(why.contains("cannot contain ':'"), "{why}");
    }

    #[tokio::test]
    async fn verify_accepts_the_right_password_only() {
        let users = users(&[("alice", "s3cret"), ("bob", "hunter2")]);
        assert!(!users.is_empty());
        assert!(users.verify(Some(&header("alice", "s3cret"))).await);
        assert!(users.verify(Some(&header("bob", "hunter2"))).await);
        assert!(!users.verify(Some(&header("alice", "hunter2"))).await);
        assert!(!users.verify(Some(&header("alice", "s3cret "))).await);
        assert!(!users.verify(None).await);
        let malformed = HeaderValue::from_static("Basic not-base64!");
        assert!(!users.verify(Some(&malformed)).await);
        assert!(
            !users
                .verify(Some(&HeaderValue::from_static("Bearer abc")))
                .await
        );
    }

    #[tokio::test]
    async fn an_unknown_user_is_refused_after_a_bcrypt_comparison() {
        let users = users(&[("alice", "s3cret")]);
        assert!(!users.verify(Some(&header("mallory", "s3cret"))).await);
        assert_eq!(users.bcrypt_runs(), 1);
        let not_utf8 = HeaderValue::from_static("Basic /w==");
        assert!(!users.verify(Some(&not_utf8)).await);
        assert_eq!(users.bcrypt_runs(), 1, "no colon: refused before bcrypt");
        let not_utf8 = HeaderValue::from_static("Basic /zpw"); // 0xff ':' 'p'
        assert!(!users.verify(Some(&not_utf8)).await);
        assert_eq!(users.bcrypt_runs(), 2);
    }

    #[tokio::test]
    async fn verdicts_are_remembered_so_bcrypt_runs_once_per_credentials() {
        let users = users(&[("alice", "s3cret")]);
        for _ in 0..3 {
            assert!(users.verify(Some(&header("alice", "s3cret"))).await);
        }
        assert_eq!(users.bcrypt_runs(), 1);
        for _ in 0..3 {
            assert!(!users.verify(Some(&header("alice", "wrong"))).await);
        }
        assert_eq!(users.bcrypt_runs(), 2);
        // The cache holds digests, not passwords, and stays bounded.
        for i in 0..CACHE_ENTRIES + 10 {
            users.remember(cache_key(b"alice", i.to_string().as_bytes()), false);
        }
        assert!(users.cache.lock().unwrap().len() <= CACHE_ENTRIES);
    }

    #[tokio::test]
    async fn no_users_lets_every_request_go() {
        let users = BasicAuthUsers::default();
        assert!(users.is_empty());
        assert!(users.verify(None).await);
        assert_eq!(users.bcrypt_runs(), 0);
    }
}
