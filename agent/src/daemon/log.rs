//! The log on stderr, in the format `run --log-format` (config `log_format`) names:
//!
//! - `text`, for people: tracing-subscriber's own lines; a value may span lines (a
//!   refused configuration's caret block stays readable under its line);
//! - `json`: one JSON object a record;
//! - `logfmt`: one line of `key=value` a record; a value with a space, `=`, `"` or a
//!   control character is quoted, `"`, `\` and control characters escaped.
//!
//! `json` and `logfmt` records have the same keys, in this order: `ts` (RFC 3339, UTC),
//! `level` (`error`, `warn`, `info`, `debug`, `trace`), `target`, `msg`, then the
//! event's fields; a value's leading and trailing line breaks are left out. When
//! stderr is the systemd journal (`JOURNAL_STREAM` names it), text and logfmt lines
//! have no timestamp: the journal stamps each one. Every record is one line.
//!
//! Other subcommands log in text. RUST_LOG filters (default `info`).

use std::fmt::{self, Write as _};
use std::sync::OnceLock;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

static IN_FORCE: OnceLock<LogFormat> = OnceLock::new();

/// Starts logging to stderr in `format`. Only the first call of a process counts.
pub fn init(format: LogFormat) {
    if IN_FORCE.set(format).is_err() {
        return;
    }
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let journal = stderr_is_journal();
    let registry = tracing_subscriber::registry().with(filter);
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    // A second subscriber (a test that set its own) is harmless: keep the first.
    let _ = match format {
        LogFormat::Text => {
            let layer = layer.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
            if journal {
                registry.with(layer.without_time()).try_init()
            } else {
                registry.with(layer).try_init()
            }
        }
        LogFormat::Json | LogFormat::Logfmt => registry
            .with(layer.event_format(Records {
                format,
                timestamps: format == LogFormat::Json || !journal,
            }))
            .try_init(),
    };
}

/// The format [`init`] set (text before it ran).
pub fn in_force() -> LogFormat {
    IN_FORCE.get().copied().unwrap_or_default()
}

/// Whether stderr is the journal: `JOURNAL_STREAM` (`DEVICE:INODE`, set by systemd
/// for a service whose output goes there) names the file stderr is.
fn stderr_is_journal() -> bool {
    use std::os::fd::AsFd as _;
    use std::os::unix::fs::MetadataExt as _;
    let Some(named) = std::env::var("JOURNAL_STREAM")
        .ok()
        .and_then(|v| parse_journal_stream(&v))
    else {
        return false;
    };
    let stderr = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .map(std::fs::File::from)
        .and_then(|f| f.metadata());
    stderr.is_ok_and(|m| (m.dev(), m.ino()) == named)
}

fn parse_journal_stream(value: &str) -> Option<(u64, u64)> {
    let (dev, ino) = value.split_once(':')?;
    Some((dev.parse().ok()?, ino.parse().ok()?))
}

/// The `json` and `logfmt` records.
struct Records {
    format: LogFormat,
    timestamps: bool,
}

impl<S, N> FormatEvent<S, N> for Records
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let meta = event.metadata();
        let mut record: Vec<(&str, Value)> = Vec::with_capacity(fields.values.len() + 4);
        if self.timestamps {
            let mut ts = String::new();
            SystemTime.format_time(&mut Writer::new(&mut ts))?;
            record.push(("ts", Value::Str(ts)));
        }
        record.push((
            "level",
            Value::Str(meta.level().as_str().to_ascii_lowercase()),
        ));
        // `log` crate records (aya's) name their target in a field.
        let target = fields
            .log_target
            .take()
            .unwrap_or_else(|| meta.target().to_string());
        record.push(("target", Value::Str(target)));
        record.push(("msg", Value::Str(fields.message.take().unwrap_or_default())));
        record.extend(fields.values);
        let line = match self.format {
            LogFormat::Json => json_line(&record),
            _ => logfmt_line(&record),
        };
        writer.write_str(&line)?;
        writer.write_char('\n')
    }
}

/// A field's value, typed as the event recorded it.
#[derive(Debug, PartialEq)]
enum Value {
    Str(String),
    I64(i64),
    U64(u64),
    F64(f64),
    Bool(bool),
}

#[derive(Default)]
struct Fields {
    message: Option<String>,
    log_target: Option<String>,
    values: Vec<(&'static str, Value)>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        let text = |v: Value| match v {
            Value::Str(s) => s,
            other => format!("{other:?}"),
        };
        match field.name() {
            "message" => self.message = Some(text(value)),
            "log.target" => self.log_target = Some(text(value)),
            // The rest of a `log` record's origin: the target says enough.
            name if name.starts_with("log.") => {}
            name => self.values.push((name, value)),
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        // `%x` fields arrive here too, their Debug being x's Display.
        self.put(field, Value::Str(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::Str(value.to_string()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::I64(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::U64(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::F64(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::Str(value.to_string()));
    }
}

/// A value's text as it is written: without leading and trailing line breaks.
fn trimmed(s: &str) -> &str {
    s.trim_matches(['\n', '\r'])
}

fn json_line(record: &[(&str, Value)]) -> String {
    let mut out = String::from("{");
    for (i, (key, value)) in record.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        push_json_string(&mut out, key);
        out.push(':');
        match value {
            Value::Str(s) => push_json_string(&mut out, trimmed(s)),
            Value::I64(n) => out.push_str(&n.to_string()),
            Value::U64(n) => out.push_str(&n.to_string()),
            // Rust writes a finite f64 without an exponent: a JSON number.
            Value::F64(x) if x.is_finite() => out.push_str(&x.to_string()),
            Value::F64(x) => push_json_string(&mut out, &x.to_string()),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        }
    }
    out.push('}');
    out
}

fn push_json_string(out: &mut String, s: &str) {
    match serde_json::to_string(s) {
        Ok(quoted) => out.push_str(&quoted),
        // Serialising a str cannot fail; should it, the value is left empty.
        Err(_) => out.push_str("\"\""),
    }
}

fn logfmt_line(record: &[(&str, Value)]) -> String {
    let mut out = String::new();
    for (i, (key, value)) in record.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        out.push_str(key);
        out.push('=');
        match value {
            Value::Str(s) => push_logfmt_string(&mut out, trimmed(s)),
            Value::I64(n) => out.push_str(&n.to_string()),
            Value::U64(n) => out.push_str(&n.to_string()),
            Value::F64(x) => out.push_str(&x.to_string()),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        }
    }
    out
}

/// `s` bare when it can be (non-empty, no space, `=`, `"` or control character),
/// else quoted with `"`, `\` and control characters escaped.
fn push_logfmt_string(out: &mut String, s: &str) {
    let bare = !s.is_empty()
        && !s
            .chars()
            .any(|c| c == '=' || c == '"' || c.is_whitespace() || c.is_control());
    if bare {
        out.push_str(s);
        return;
    }
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Vec<(&'static str, Value)> {
        vec![
            ("level", Value::Str("error".into())),
            (
                "msg",
                Value::Str("SIGHUP: the configuration was refused".into()),
            ),
            (
                "error",
                Value::Str("t.toml:2:13: roce_port: invalid \"x\"".into()),
            ),
            (
                "excerpt",
                Value::Str("\n    | roce_port = = 4\n    |             ^".into()),
            ),
            ("path", Value::Str("C:\\dir".into())),
            ("empty", Value::Str(String::new())),
            ("n", Value::U64(3)),
            ("ratio", Value::F64(0.5)),
            ("nan", Value::F64(f64::NAN)),
            ("ok", Value::Bool(true)),
        ]
    }

    #[test]
    fn logfmt_quotes_what_needs_it_and_keeps_one_line() {
        assert_eq!(
            logfmt_line(&record()),
            "level=error msg=\"SIGHUP: the configuration was refused\" \
             error=\"t.toml:2:13: roce_port: invalid \\\"x\\\"\" \
             excerpt=\"    | roce_port = = 4\\n    |             ^\" \
             path=C:\\dir empty=\"\" n=3 ratio=0.5 nan=NaN ok=true"
        );
        let mut out = String::new();
        push_logfmt_string(&mut out, "a=b\u{1}\"\\");
        assert_eq!(out, "\"a=b\\u0001\\\"\\\\\"");
    }

    #[test]
    fn json_is_one_object_with_typed_values() {
        let line = json_line(&record());
        assert!(!line.contains('\n'), "{line}");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["level"], "error");
        assert_eq!(v["excerpt"], "    | roce_port = = 4\n    |             ^");
        assert_eq!(v["n"], 3);
        assert_eq!(v["ratio"], 0.5);
        assert_eq!(v["nan"], "NaN");
        assert_eq!(v["ok"], true);
        assert!(line.starts_with("{\"level\":\"error\",\"msg\":"), "{line}");
    }

    #[test]
    fn journal_stream_is_device_colon_inode() {
        assert_eq!(parse_journal_stream("64769:123456"), Some((64769, 123456)));
        for bad in ["", "1", "a:b", "1:2:3"] {
            assert_eq!(parse_journal_stream(bad), None, "{bad}");
        }
    }
}
