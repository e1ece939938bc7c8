//! tshark as an independent oracle: `tshark -r FILE -T fields -e ...` run and split
//! into rows (one per frame printed), columns (one per field asked for) and
//! occurrences (a field appears once per layer: two `ip.src` in a VXLAN frame,
//! outermost first). What the fields mean stays with each caller.
//!
//! ```no_run
//! use roce_testkit::tshark::{self, Fields};
//!
//! if tshark::available() {
//!     let rows = Fields::new(&["ip.src", "infiniband.bth.destqp"])
//!         .filter("infiniband")
//!         .run(std::path::Path::new("capture.pcap"))?;
//!     for row in &rows {
//!         let outer_src = row.first(0);
//!         let qp = row.last(1);
//!         # let _ = (outer_src, qp);
//!     }
//! }
//! # Ok::<(), anyhow::Error>(())
//! ```

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Between columns: a tab (no field value holds one).
const SEPARATOR: char = '\t';
/// Between occurrences of one field.
const AGGREGATOR: char = ',';

/// True when `tshark --version` runs.
pub fn available() -> bool {
    Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// What to ask tshark for: the fields, in order, and the options around them.
#[derive(Clone, Debug)]
pub struct Fields {
    fields: Vec<String>,
    options: Vec<OsString>,
}

impl Fields {
    /// Every occurrence of each of `fields`, in this order.
    pub fn new(fields: &[&str]) -> Fields {
        Fields {
            fields: fields.iter().map(|f| f.to_string()).collect(),
            options: Vec::new(),
        }
    }

    /// Only the frames matching display filter `expr` (`-Y`).
    pub fn filter(self, expr: &str) -> Fields {
        self.option(["-Y", expr])
    }

    /// Decode as (`-d`), e.g. `udp.port==4791,infiniband`.
    pub fn decode_as(self, rule: &str) -> Fields {
        self.option(["-d", rule])
    }

    /// Leave protocol `name` undecoded (`--disable-protocol`).
    pub fn disable_protocol(self, name: &str) -> Fields {
        self.option(["--disable-protocol", name])
    }

    /// Any other command-line options, placed before the field list.
    pub fn option<I, S>(mut self, args: I) -> Fields
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.options.extend(args.into_iter().map(Into::into));
        self
    }

    /// The field names, in column order.
    pub fn names(&self) -> &[String] {
        &self.fields
    }

    /// The tshark command reading `pcap` (for callers that run it themselves, e.g.
    /// to time it).
    pub fn command(&self, pcap: &Path) -> Command {
        let mut cmd = Command::new("tshark");
        cmd.arg("-r").arg(pcap).arg("-n").args(&self.options).args([
            "-T",
            "fields",
            "-E",
            "occurrence=a",
            "-E",
            "separator=/t",
            "-E",
            "aggregator=,",
        ]);
        for f in &self.fields {
            cmd.args(["-e", f]);
        }
        cmd
    }

    /// Runs tshark on `pcap` and splits what it printed (see [`Fields::parse`]).
    pub fn run(&self, pcap: &Path) -> Result<Vec<Row>> {
        let out = self
            .command(pcap)
            .output()
            .context("running tshark (is it installed? `cargo xtask setup`)")?;
        if !out.status.success() {
            bail!(
                "tshark on {} failed ({}): {}",
                pcap.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        self.parse(&String::from_utf8_lossy(&out.stdout))
    }

    /// Splits tshark's output: one row per line, one column per field (an error when
    /// a line has another number), each column split into its occurrences.
    pub fn parse(&self, text: &str) -> Result<Vec<Row>> {
        text.lines()
            .map(|line| {
                let columns: Vec<Vec<String>> = line
                    .split(SEPARATOR)
                    .map(|c| {
                        c.split(AGGREGATOR)
                            .filter(|s| !s.is_empty())
                            .map(str::to_string)
                            .collect()
                    })
                    .collect();
                if columns.len() != self.fields.len() {
                    bail!(
                        "tshark printed {} columns, not {}: {line:?}",
                        columns.len(),
                        self.fields.len()
                    );
                }
                Ok(Row {
                    line: line.to_string(),
                    columns,
                })
            })
            .collect()
    }
}

/// One frame as tshark printed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The line, for error messages.
    pub line: String,
    /// Per field asked for, its occurrences, outermost first (empty when absent).
    pub columns: Vec<Vec<String>>,
}

impl Row {
    /// Every occurrence of field number `i`.
    pub fn all(&self, i: usize) -> &[String] {
        self.columns.get(i).map(Vec::as_slice).unwrap_or(&[])
    }

    /// The first (outermost) occurrence of field number `i`.
    pub fn first(&self, i: usize) -> Option<&str> {
        self.all(i).first().map(String::as_str)
    }

    /// The last (innermost) occurrence of field number `i`.
    pub fn last(&self, i: usize) -> Option<&str> {
        self.all(i).last().map(String::as_str)
    }

    /// True when no field asked for occurs in this frame.
    pub fn is_empty(&self) -> bool {
        self.columns.iter().all(Vec::is_empty)
    }
}

/// A number as tshark prints it: decimal, or hexadecimal with `0x`.
pub fn number(s: &str) -> Result<u64> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    }
    .with_context(|| format!("tshark value {s:?} is not a number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_split_into_columns_and_outermost_first_occurrences() -> Result<()> {
        let f = Fields::new(&["ip.src", "vxlan.vni", "infiniband.bth.destqp"]);
        let rows = f.parse("10.0.0.1,198.19.0.1\t5001\t0x000012\n10.0.0.1\t\t18\n")?;
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].all(0), ["10.0.0.1", "198.19.0.1"]);
        assert_eq!(rows[0].first(0), Some("10.0.0.1"));
        assert_eq!(rows[0].last(0), Some("198.19.0.1"));
        assert_eq!(rows[1].first(1), None);
        assert_eq!(number(rows[0].last(2).unwrap_or_default())?, 0x12);
        assert_eq!(number(rows[1].last(2).unwrap_or_default())?, 18);
        Ok(())
    }

    #[test]
    fn a_line_with_another_number_of_columns_is_an_error() {
        let f = Fields::new(&["ip.src", "ip.dst"]);
        assert!(f.parse("10.0.0.1\n").is_err());
        // A frame without any of the fields still has every column.
        let rows = f.parse("\t\n").expect("two empty columns");
        assert!(rows[0].is_empty());
    }

    #[test]
    fn the_command_asks_for_every_occurrence_of_each_field_in_order() {
        let cmd = Fields::new(&["frame.len", "ip.src"])
            .decode_as("udp.port==4791,infiniband")
            .filter("infiniband")
            .command(Path::new("x.pcap"));
        let args: Vec<String> = cmd
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = args.join(" ");
        assert!(joined.starts_with(
            "-r x.pcap -n -d udp.port==4791,infiniband -Y infiniband -T fields -E occurrence=a"
        ));
        assert!(joined.ends_with("-e frame.len -e ip.src"));
    }

    #[test]
    fn decodes_a_capture_when_tshark_is_installed() -> Result<()> {
        if !available() {
            eprintln!("skipped: tshark is not installed");
            return Ok(());
        }
        let dir = std::env::temp_dir().join(format!("roce-tk-tshark-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let pcap = dir.join("one.pcap");
        // One RoCE SEND to QP 0x12 in a classic pcap file.
        let eth = crate::frame::Eth::default();
        let ip = crate::frame::L3::v4([198, 18, 0, 1].into(), [198, 18, 0, 2].into());
        let msg = crate::frame::RoceMsg::new(crate::frame::opcode::RC_SEND_ONLY, 0x12, 1);
        let frame = crate::frame::roce_frame(&eth, &ip, 0xC000, &msg);
        let mut file = Vec::new();
        for v in [0xa1b2c3d4u32, 0x0004_0002, 0, 0, 65535, 1] {
            file.extend_from_slice(&v.to_le_bytes());
        }
        for v in [0u32, 0, frame.len() as u32, frame.len() as u32] {
            file.extend_from_slice(&v.to_le_bytes());
        }
        file.extend_from_slice(&frame);
        std::fs::write(&pcap, &file)?;
        let rows = Fields::new(&["frame.len", "ip.dst", "infiniband.bth.destqp"]).run(&pcap);
        let _ = std::fs::remove_dir_all(&dir);
        let rows = rows?;
        assert_eq!(rows.len(), 1);
        assert_eq!(
            number(rows[0].first(0).unwrap_or_default())?,
            frame.len() as u64
        );
        assert_eq!(rows[0].first(1), Some("198.18.0.2"));
        assert_eq!(number(rows[0].first(2).unwrap_or_default())?, 0x12);
        Ok(())
    }
}
