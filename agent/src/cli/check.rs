//! `roce-agent check`: the host audit from the command line, as a table or JSON,
//! `--fix` (only on interfaces named by `--iface` or the config) and `--dry-run` (the
//! commands `--fix` would run). The audit itself is `crate::audit`.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Args;
use serde::Serialize;

use crate::audit::{
    self, Audit, AuditError, AuditOptions, AuditedInterface, Change, Finding, FixFailure, Plan,
    Severity, Why,
};
use crate::config::{ConfigFile, Overrides, Settings};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Interface to audit; repeat for more [default: the config's interfaces and VTEPs, else those that carry RoCE: RDMA devices' netdevs, VXLAN devices and their underlays]
    #[arg(long = "iface", value_name = "IF")]
    pub iface: Vec<String>,
    /// The netdev MTU the RoCE interfaces need [default: the config's `mtu`, else the one carrying the RoCE path MTU (default_pmtu, 4096): 4192]
    #[arg(long, value_name = "BYTES")]
    pub mtu: Option<u32>,
    /// A host whose network path must carry --mtu with DF set (IPv4 or IPv6); repeat for more
    #[arg(long = "peer", value_name = "ADDR")]
    pub peer: Vec<std::net::IpAddr>,
    /// TOML configuration file: interfaces, vteps, mtu, peers, default_pmtu and [qos] apply
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The directory that stands for /sys (fixture trees)
    #[arg(long, value_name = "DIR", default_value = "/sys")]
    pub sysfs_root: PathBuf,
    /// Apply what can be applied (MTU via netlink, DCB entries, writable sysfs knobs) on the interfaces named by --iface or the config, print each change, then audit again
    #[arg(long)]
    pub fix: bool,
    /// Print the commands --fix would run on the audited interfaces; change nothing
    #[arg(long, conflicts_with = "fix")]
    pub dry_run: bool,
    /// Print {"findings": [...], "interfaces": [...], "summary": {...}} as JSON (and "changes" with --fix, "planned" with --dry-run)
    #[arg(long)]
    pub json: bool,
    /// Indent the JSON (compact by default)
    #[arg(long, requires = "json")]
    pub pretty: bool,
    /// Seconds a path probe waits for an answer
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub probe_timeout: f64,
}

/// The audit found at least one error (exit 1); the table says which.
#[derive(Debug, thiserror::Error)]
#[error("the audit found {errors} finding(s) at error level")]
pub struct FindingsAtErrorLevel {
    pub errors: usize,
}

/// What `check --json` prints.
#[derive(Debug, Serialize)]
pub struct CheckDocument<'a> {
    pub findings: &'a [Finding],
    /// The interfaces audited and why.
    pub interfaces: &'a [AuditedInterface],
    pub summary: Summary,
    /// With --fix: the changes made (before/after) and those that could not be made.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes: Option<&'a [Change]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_changed: Option<Vec<String>>,
    /// With --dry-run: the commands --fix would run, and what it could not do.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub planned: Option<&'a [String]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_planned: Option<Vec<String>>,
}

/// How many findings at each severity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub error: usize,
    pub warning: usize,
    pub info: usize,
}

impl Summary {
    pub fn of(findings: &[Finding]) -> Summary {
        let count = |s| findings.iter().filter(|f| f.severity == s).count();
        Summary {
            error: count(Severity::Error),
            warning: count(Severity::Warning),
            info: count(Severity::Info),
        }
    }
}

/// The audit options from the config file and the flags.
pub fn options(args: &CheckArgs) -> anyhow::Result<AuditOptions> {
    let file = args.config.as_deref().map(ConfigFile::load).transpose()?;
    let flags = Overrides {
        interfaces: args.iface.clone(),
        mtu: args.mtu,
        peers: args.peer.clone(),
        ..Overrides::default()
    };
    let settings = Settings::resolve(file.as_ref(), &flags, false)?;
    let mut opts = AuditOptions::for_settings(
        &settings,
        &args.sysfs_root,
        probe_timeout(args.probe_timeout)?,
    );
    opts.named = args.iface.clone();
    Ok(opts)
}

fn probe_timeout(secs: f64) -> anyhow::Result<Duration> {
    if secs.is_finite() && (0.01..=60.0).contains(&secs) {
        Ok(Duration::from_secs_f64(secs))
    } else {
        Err(crate::config::ConfigError::Invalid {
            origin: crate::config::Origin::Flag("--probe-timeout"),
            field: "probe_timeout",
            message: format!("{secs} is out of range (0.01 to 60 seconds)"),
        }
        .into())
    }
}

/// `roce-agent check`.
pub fn check(args: CheckArgs) -> anyhow::Result<()> {
    let opts = options(&args)?;
    // Before anything is read or changed: --fix never picks interfaces by itself.
    if args.fix && opts.interfaces.is_empty() {
        return Err(AuditError::FixNeedsNamedInterfaces.into());
    }
    let first = audit::audit(&opts)?;
    let planned = args.dry_run.then(|| audit::plan(&opts, &first));
    let (result, fixed) = if args.fix {
        let fixed = audit::fix(&opts, &first)?;
        (audit::audit(&opts)?, Some(fixed))
    } else {
        (first, None)
    };

    let text = if args.json {
        let doc = CheckDocument {
            findings: &result.findings,
            interfaces: &result.why,
            summary: Summary::of(&result.findings),
            changes: fixed.as_ref().map(|f| f.changes.as_slice()),
            not_changed: fixed
                .as_ref()
                .map(|f| f.failures.iter().map(ToString::to_string).collect()),
            planned: planned.as_ref().map(|p| p.commands.as_slice()),
            not_planned: planned
                .as_ref()
                .map(|p| p.not_planned.iter().map(ToString::to_string).collect()),
        };
        let mut t = if args.pretty {
            serde_json::to_string_pretty(&doc)
        } else {
            serde_json::to_string(&doc)
        }
        .context("encoding JSON")?;
        t.push('\n');
        t
    } else {
        let mut t = String::new();
        if let Some(f) = &fixed {
            t.push_str(&render_changes(&f.changes, &f.failures));
            t.push_str("\naudit after the changes:\n");
        }
        t.push_str(&render(&opts, &result));
        if let Some(p) = &planned {
            t.push('\n');
            // Interfaces found rather than named: --fix needs them named.
            let fix = if opts.interfaces.is_empty() {
                let named: Vec<String> = result
                    .why
                    .iter()
                    .map(|a| format!("--iface {}", a.ifname))
                    .collect();
                format!("`--fix {}`", named.join(" "))
            } else {
                "--fix".to_string()
            };
            t.push_str(&render_plan(p, &fix));
        }
        t
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => return Err(e).context("writing to stdout"),
    }
    let errors = result
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .count();
    if errors > 0 {
        return Err(FindingsAtErrorLevel { errors }.into());
    }
    Ok(())
}

/// The changes `--fix` made and could not make, one line each.
pub fn render_changes(changes: &[Change], failures: &[FixFailure]) -> String {
    let mut out = String::new();
    if changes.is_empty() && failures.is_empty() {
        out.push_str("fix: nothing to change\n");
    }
    for c in changes {
        let _ = writeln!(out, "changed: {c}");
    }
    for f in failures {
        let _ = writeln!(out, "NOT changed: {f}");
    }
    out
}

/// `--dry-run`: the commands `fix` (`--fix`, or the command line that names the
/// interfaces found) would run, one a line, as they are typed.
pub fn render_plan(plan: &Plan, fix: &str) -> String {
    let mut out = String::new();
    if plan.commands.is_empty() && plan.not_planned.is_empty() {
        let _ = writeln!(out, "dry run: {fix} would change nothing");
        return out;
    }
    if !plan.commands.is_empty() {
        let _ = writeln!(out, "dry run: {fix} would run (nothing was changed):");
    }
    for c in &plan.commands {
        let _ = writeln!(out, "{c}");
    }
    for f in &plan.not_planned {
        let _ = writeln!(out, "would NOT change: {f}");
    }
    out
}

/// `eth1 (RDMA device mlx5_0)`; an interface named by --iface is just its name.
fn audited_text(audit: &Audit) -> String {
    audit
        .why
        .iter()
        .map(|a| match &a.why {
            Why::Named => a.ifname.clone(),
            why => format!("{} ({why})", a.ifname),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn severity_text(s: Severity) -> &'static str {
    match s {
        Severity::Error => "error",
        Severity::Warning => "warning",
        Severity::Info => "info",
    }
}

/// The human table: a header line, one row per finding (its fix below it), a summary.
pub fn render(opts: &AuditOptions, audit: &Audit) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "audited: {} | required MTU {} | peers: {}",
        audited_text(audit),
        opts.required_mtu,
        if opts.peers.is_empty() {
            "none".to_string()
        } else {
            opts.peers
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        }
    );
    out.push('\n');
    let width = |f: fn(&Finding) -> usize, title: &str| {
        audit
            .findings
            .iter()
            .map(f)
            .max()
            .unwrap_or(0)
            .max(title.len())
    };
    let wc = width(|f| f.check.len(), "CHECK");
    let wi = width(|f| f.interface.as_deref().map_or(1, str::len), "INTERFACE");
    let _ = writeln!(
        out,
        "{:<8} {:<wc$} {:<wi$} FOUND",
        "SEVERITY", "CHECK", "INTERFACE"
    );
    let indent = 8 + 1 + wc + 1 + wi + 1;
    for f in &audit.findings {
        let _ = writeln!(
            out,
            "{:<8} {:<wc$} {:<wi$} {}",
            severity_text(f.severity),
            f.check,
            f.interface.as_deref().unwrap_or("-"),
            f.found,
        );
        if f.severity != Severity::Info {
            let _ = writeln!(out, "{:indent$}expected: {}", "", f.expected);
            if !f.fix.is_empty() {
                let _ = writeln!(out, "{:indent$}fix: {}", "", f.fix);
            }
        }
    }
    let n = Summary::of(&audit.findings);
    let _ = writeln!(
        out,
        "\n{} error(s), {} warning(s), {} info",
        n.error, n.warning, n.info
    );
    out
}
