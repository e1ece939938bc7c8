//! The configuration file as written: every key optional, none unknown, each value
//! kept with its span so that a refusal names `FILE:LINE:COLUMN` (a parse error also
//! shows the line with a caret under the column). [`ConfigError`] and [`Origin`] say
//! why and where a configuration was refused, the file's or the flags'.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use toml::Spanned;

use super::{EcnPropagation, HostMode, LogFormat};

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: cannot read the configuration file: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "{}: refusing a configuration file that any user can write (mode {mode:04o}): `chmod o-w {}`",
        path.display(),
        path.display()
    )]
    WorldWritable { path: PathBuf, mode: u32 },
    #[error("{}:{line}:{column}: {message}{excerpt}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
        /// The offending line with a caret under the column (empty when unknown).
        excerpt: String,
    },
    #[error("{}", invalid_text(origin, field, message))]
    Invalid {
        origin: Origin,
        field: &'static str,
        message: String,
    },
}

impl ConfigError {
    /// The offending line with a caret under the column, when the refusal has one
    /// (its text ends with it): log records carry it in a field of its own.
    pub fn excerpt(&self) -> Option<&str> {
        match self {
            ConfigError::Parse { excerpt, .. } if !excerpt.is_empty() => Some(excerpt.as_str()),
            _ => None,
        }
    }
}

fn invalid_text(origin: &Origin, field: &str, message: &str) -> String {
    match origin {
        Origin::File { .. } => format!("{origin}: {field}: {message}"),
        Origin::Flag(flag) => format!("{flag}: {message}"),
        Origin::Missing => format!("{field}: {message}"),
    }
}

/// Where a refused value came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A key of a configuration file.
    File {
        path: PathBuf,
        line: usize,
        column: usize,
    },
    /// A command-line flag, e.g. `--interval`.
    Flag(&'static str),
    /// Nothing set it (e.g. no interfaces at all).
    Missing,
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { path, line, column } => {
                write!(f, "{}:{line}:{column}", path.display())
            }
            Origin::Flag(flag) => f.write_str(flag),
            Origin::Missing => f.write_str("(not set)"),
        }
    }
}

/// The configuration file as written: every key optional, none unknown.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Interfaces to attach the XDP classifier to.
    pub interfaces: Option<Spanned<Vec<Spanned<String>>>>,
    /// `HOST:PORT` of the JSON API.
    pub listen: Option<Spanned<String>>,
    /// Seconds between two polls of the kernel maps.
    pub interval: Option<Spanned<f64>>,
    /// Flows of the kernel's flow table.
    pub flows_map_size: Option<Spanned<u32>>,
    pub roce_port: Option<Spanned<u16>>,
    pub vxlan_port: Option<Spanned<u16>>,
    /// Path MTU in bytes: 256, 512, 1024, 2048 or 4096.
    pub default_pmtu: Option<Spanned<u32>>,
    /// Netdev MTU the RoCE interfaces need.
    pub mtu: Option<Spanned<u32>>,
    /// Hosts whose path `check` probes.
    pub peers: Option<Spanned<Vec<Spanned<String>>>>,
    /// Host DSCP policy on egress of `interfaces`.
    pub mode: Option<Spanned<HostMode>>,
    /// VTEP underlay interfaces.
    pub vteps: Option<Spanned<Vec<Spanned<String>>>>,
    /// Mirror collector interfaces: XDP decapsulates GRE and ERSPAN copies there.
    pub mirror_interfaces: Option<Spanned<Vec<Spanned<String>>>>,
    pub ecn_propagation: Option<Spanned<EcnPropagation>>,
    /// Flows named one by one on `GET /metrics` (`roce_top_flow_*`).
    pub top_flows: Option<Spanned<u32>>,
    /// Sampled events: 1 in N of each kind (0: none).
    pub events_sample: Option<Spanned<u32>>,
    /// Round trips longer than this many µs are `rtt_spike` events (0: none).
    pub rtt_spike_us: Option<Spanned<u32>>,
    /// How `run` writes its log.
    pub log_format: Option<Spanned<LogFormat>>,
    /// Sampled events: payload bytes kept after the last transport header (0: none).
    pub events_payload_bytes: Option<Spanned<u32>>,
    /// The exporter-toolkit web configuration (TLS, basic auth, headers) of the API.
    pub web_config_file: Option<Spanned<String>>,
    pub qos: Option<QosFile>,
    pub verdicts: Option<VerdictsFile>,
}

/// The `[qos]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QosFile {
    pub roce_dscp: Option<Spanned<u8>>,
    pub cnp_dscp: Option<Spanned<u8>>,
    pub lossless_dscps: Option<Spanned<Vec<Spanned<u8>>>>,
    pub remark_dscp: Option<Spanned<u8>>,
    /// DSCP (as a string key) -> skb priority.
    pub priority: Option<Spanned<BTreeMap<String, Spanned<u32>>>>,
    /// Inner DSCP (as a string key) -> outer DSCP.
    pub vtep_dscp: Option<Spanned<BTreeMap<String, Spanned<u8>>>>,
}

/// The `[verdicts]` table: the fabric verdicts' thresholds.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerdictsFile {
    pub window_secs: Option<Spanned<f64>>,
    pub min_ce: Option<Spanned<u64>>,
    pub pause_storm_share: Option<Spanned<f64>>,
    pub pause_storm_rounds: Option<Spanned<u32>>,
    pub slow_receiver_pauses_per_s: Option<Spanned<f64>>,
    pub ecmp_min_qps: Option<Spanned<u32>>,
    pub ecmp_qps_per_port: Option<Spanned<u32>>,
}

/// A parsed configuration file together with its text, for error positions.
#[derive(Debug)]
pub struct ConfigFile {
    pub path: PathBuf,
    text: String,
    pub values: FileConfig,
}

impl ConfigFile {
    /// Reads and parses `path`.
    pub fn load(path: &Path) -> Result<ConfigFile, ConfigError> {
        use std::os::unix::fs::PermissionsExt;
        let text = std::fs::read_to_string(path).map_err(|error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        })?;
        // Whoever can write the file decides what the host sends: only its owner (and
        // group) may.
        if let Ok(meta) = std::fs::metadata(path) {
            let mode = meta.permissions().mode();
            if mode & 0o002 != 0 {
                return Err(ConfigError::WorldWritable {
                    path: path.to_path_buf(),
                    mode: mode & 0o7777,
                });
            }
        }
        ConfigFile::parse(path, text)
    }

    /// Parses `text` as if read from `path`.
    pub fn parse(path: &Path, text: String) -> Result<ConfigFile, ConfigError> {
        match toml::from_str::<FileConfig>(&text) {
            Ok(values) => Ok(ConfigFile {
                path: path.to_path_buf(),
                text,
                values,
            }),
            Err(e) => {
                let (line, column) = e.span().map(|s| line_col(&text, s.start)).unwrap_or((1, 1));
                let message = e.message().trim_end();
                // toml names the value, not the key: say which key it is, as the
                // checks after parsing do.
                let message = match key_at(&text, line) {
                    Some(key) => format!("{key}: {message}"),
                    None => message.to_string(),
                };
                Err(ConfigError::Parse {
                    path: path.to_path_buf(),
                    line,
                    column,
                    message,
                    excerpt: excerpt(&text, line, column),
                })
            }
        }
    }

    /// `path` as the file names it: a relative path is relative to the file's
    /// directory (as exporter-toolkit reads the paths of a web config), so that the
    /// agent finds it whatever directory it was started in.
    pub(super) fn relative_path(&self, path: &str) -> PathBuf {
        let path = Path::new(path);
        match self.path.parent() {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.to_path_buf(),
        }
    }

    pub(super) fn origin(&self, span: Range<usize>) -> Origin {
        let (line, column) = line_col(&self.text, span.start);
        Origin::File {
            path: self.path.clone(),
            line,
            column,
        }
    }

    /// Of `keys` (a key's name, and its value's span when the file sets it), the one
    /// written last in the file and where: what a refusal of two keys that cannot go
    /// together names. None when the file sets none of them.
    pub(super) fn last_set(
        &self,
        keys: &[(&'static str, Option<Range<usize>>)],
    ) -> Option<(Origin, &'static str)> {
        keys.iter()
            .filter_map(|(key, span)| span.clone().map(|s| (s, *key)))
            .max_by_key(|(span, _)| span.start)
            .map(|(span, key)| (self.origin(span), key))
    }

    /// Where the file names interface `name` (in `interfaces`, `vteps` or
    /// `mirror_interfaces`), and which key it is under.
    pub fn interface_origin(&self, name: &str) -> Option<(Origin, &'static str)> {
        for (key, list) in [
            ("interfaces", &self.values.interfaces),
            ("vteps", &self.values.vteps),
            ("mirror_interfaces", &self.values.mirror_interfaces),
        ] {
            let Some(list) = list else { continue };
            if let Some(i) = list.get_ref().iter().find(|i| i.get_ref() == name) {
                return Some((self.origin(i.span()), key));
            }
        }
        None
    }
}

/// 1-based line and column (in characters) of byte `offset` of `text`.
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let bytes = text.as_bytes();
    let offset = offset.min(bytes.len());
    let before = &bytes[..offset];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let line_start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = String::from_utf8_lossy(&before[line_start..])
        .chars()
        .count()
        + 1;
    (line, column)
}

/// The dotted name of the key assigned on 1-based `line` of `text` (`qos.roce_dscp`),
/// with the table it is in; None when the line assigns nothing.
fn key_at(text: &str, line: usize) -> Option<String> {
    let mut table = String::new();
    for (i, src) in text.lines().enumerate() {
        let src = src.trim();
        if i + 1 == line {
            let (key, _) = src.split_once('=')?;
            let key = key.trim().trim_matches('"');
            if key.is_empty() || key.starts_with('[') {
                return None;
            }
            return Some(if table.is_empty() {
                key.to_string()
            } else {
                format!("{table}.{key}")
            });
        }
        if let Some(name) = src.strip_prefix('[').and_then(|r| r.split_once(']')) {
            table = name.0.trim().trim_matches('[').to_string();
        }
    }
    None
}

fn excerpt(text: &str, line: usize, column: usize) -> String {
    match text.lines().nth(line.saturating_sub(1)) {
        Some(src) if !src.trim().is_empty() => {
            let pad: String = src
                .chars()
                .take(column.saturating_sub(1))
                .map(|c| if c == '\t' { '\t' } else { ' ' })
                .collect();
            format!("\n    | {src}\n    | {pad}^")
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConfigFile, ConfigError> {
        ConfigFile::parse(Path::new("t.toml"), text.to_string())
    }

    #[test]
    fn a_file_any_user_can_write_is_refused_and_a_private_one_is_read() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("roce-perm-{}.toml", std::process::id()));
        std::fs::write(&path, "interfaces = [\"eth1\"]\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let refused = ConfigFile::load(&path);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let read = ConfigFile::load(&path);
        std::fs::remove_file(&path).unwrap();
        match refused {
            Err(e @ ConfigError::WorldWritable { .. }) => {
                assert!(e.to_string().contains("mode 0666"), "{e}");
                assert!(e.to_string().contains("chmod o-w"), "{e}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert!(read.is_ok(), "{read:?}");
    }

    #[test]
    fn unknown_key_names_line_and_column() {
        let e = parse("roce_port = 4791\n  mtu_bytes = 1500\n").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with("t.toml:2:3: mtu_bytes: unknown field `mtu_bytes`"),
            "{msg}"
        );
    }

    #[test]
    fn syntax_error_names_line_and_column() {
        let e = parse("listen = \"127.0.0.1:9473\"\nroce_port = = 4\n").unwrap_err();
        match e {
            ConfigError::Parse { line, column, .. } => assert_eq!((line, column), (2, 13)),
            other => panic!("{other}"),
        }
    }

    #[test]
    fn wrong_type_names_the_value() {
        let e = parse("roce_port = \"x\"\n").unwrap_err();
        assert!(e.to_string().starts_with("t.toml:1:13: "), "{e}");
        let e = parse("vxlan_port = 70000\n").unwrap_err();
        assert!(e.to_string().starts_with("t.toml:1:14: "), "{e}");
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncdé f", 0), (1, 1));
        assert_eq!(line_col("ab\ncdé f", 3), (2, 1));
        assert_eq!(line_col("ab\ncdé f", 8), (2, 5));
        assert_eq!(line_col("ab", 99), (1, 3));
    }
}
