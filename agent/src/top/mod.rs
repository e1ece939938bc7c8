//! `roce-agent top`: a live terminal view of a running agent's flows (`GET /flows`)
//! and of its host audit (`GET /findings`), refreshed every interval.
//!
//! Three parts, kept apart so that the first two are tested without a terminal:
//! - the model, [`TopState`]: answers of the agent in, sorted rows, scrolling and key
//!   handling out;
//! - the drawing, [`draw`]: one frame of a [`TopState`] on any ratatui backend;
//! - the terminal, [`top`]: a background thread fetches, the main thread reads keys
//!   and draws, and [`TerminalGuard`] gives the terminal back however the view ends.

use std::io::IsTerminal as _;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context as _};
use crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::backend::CrosstermBackend;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table};
use ratatui::{Frame, Terminal};

use crate::api::client::{self, ClientError};
use crate::config::DEFAULT_LISTEN;
use crate::doc::finding::Findings;
use crate::doc::finding::Severity;
use crate::doc::{Direction, Document, Flow};

/// How long one request to the agent may take: short, so that a dead or hung agent
/// shows in the header within seconds (the UI itself never waits for it).
const FETCH_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the view looks for keys, answers and signals.
const TICK: Duration = Duration::from_millis(100);
/// Shortest and longest refresh interval accepted.
const MIN_INTERVAL_S: f64 = 0.1;
const MAX_INTERVAL_S: f64 = 3600.0;

/// The text after `roce-agent top --help`'s options.
pub const AFTER_HELP: &str = "Examples:\n  \
    roce-agent top\n  \
    roce-agent top --api 127.0.0.1:9473 --interval 2\n\n\
    Keys:\n  \
    p            sort by problems: CE + CNPs + NAKs + RNR NAKs + PSN gaps (default)\n  \
    c            sort by CE ratio\n  \
    n            sort by CNPs/s\n  \
    b            sort by bits/s\n  \
    r            reverse the order\n  \
    Up/Down      scroll one line (also k/j)\n  \
    PgUp/PgDn    scroll one page\n  \
    Home/End     first/last flow (also g/G)\n  \
    q, Esc, Ctrl-C  quit\n\n\
    Every sort looks at the rates over the agent's last interval first and then at the \
    totals since the flow was first seen, so flows with problems now come first. A rate \
    the agent has not computed (yet) shows as \"-\". When the agent stops answering, the \
    header says so and the last answer stays on screen; the view keeps trying.\n\n\
    Exit status: 0 on quit, 1 when stdout is not a terminal or the terminal fails.";

/// `roce-agent top`'s options.
#[derive(Debug, clap::Args)]
pub struct TopArgs {
    /// Address of the running agent's API (its --listen)
    #[arg(long, value_name = "HOST:PORT", default_value = DEFAULT_LISTEN)]
    pub api: String,
    /// Seconds between two refreshes
    #[arg(long, value_name = "SECS", default_value_t = 1.0, value_parser = parse_interval)]
    pub interval: f64,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if (MIN_INTERVAL_S..=MAX_INTERVAL_S).contains(&secs) {
        Ok(secs)
    } else {
        Err(format!(
            "the interval must be between {MIN_INTERVAL_S} and {MAX_INTERVAL_S} seconds"
        ))
    }
}

// ---------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------

/// One round of asking the agent: its flow document and its findings, or why not.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// When the answers arrived.
    pub at: SystemTime,
    pub flows: Result<Document, String>,
    pub findings: Result<Findings, String>,
}

/// Asks the agent at `addr` for `/flows` and `/findings`.
pub fn fetch(addr: &str, timeout: Duration) -> Snapshot {
    let flows = client::get_body(addr, "/flows", timeout)
        .map_err(|e| short_error(&e, timeout))
        .and_then(|body| {
            serde_json::from_slice::<Document>(&body)
                .map_err(|e| format!("the answer is not a roce-agent flow document: {e}"))
        });
    // A dead agent fails the same way twice: do not wait for it twice.
    let findings = match &flows {
        Ok(_) => client::get_body(addr, "/findings", timeout)
            .map_err(|e| short_error(&e, timeout))
            .and_then(|body| {
                serde_json::from_slice::<Findings>(&body)
                    .map_err(|e| format!("the answer is not a findings document: {e}"))
            }),
        Err(e) => Err(e.clone()),
    };
    Snapshot {
        at: SystemTime::now(),
        flows,
        findings,
    }
}

/// The client's error without the hint meant for a one-shot command (the header
/// already names the address).
fn short_error(e: &ClientError, timeout: Duration) -> String {
    match e {
        ClientError::Connect { error, .. } | ClientError::Io { error, .. } => match error.kind() {
            // A read timeout reads "Resource temporarily unavailable" otherwise.
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                format!("no answer within {}", seconds(timeout))
            }
            _ => error.to_string(),
        },
        other => other.to_string(),
    }
}

/// The order of the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortKey {
    /// CE + CNPs + NAKs + RNR NAKs + PSN gaps.
    Problems,
    /// Outer CE packets / packets.
    CeRatio,
    /// CNPs per second.
    CnpRate,
    /// Bits per second.
    Bitrate,
}

impl SortKey {
    fn label(self) -> &'static str {
        match self {
            SortKey::Problems => "problems",
            SortKey::CeRatio => "CE ratio",
            SortKey::CnpRate => "CNPs/s",
            SortKey::Bitrate => "bits/s",
        }
    }

    /// What a flow is sorted by: its rate over the last interval (0 when the agent
    /// gave none), then its total, both larger first.
    fn values(self, f: &Flow) -> (f64, f64) {
        let r = f.rates.as_ref();
        match self {
            SortKey::Problems => (
                r.map_or(0.0, |r| r.ce_per_s + r.cnps_per_s + r.naks_per_s),
                problems_total(f) as f64,
            ),
            SortKey::CeRatio => (r.map_or(0.0, |r| r.ce_ratio), f.ce_ratio()),
            SortKey::CnpRate => (r.map_or(0.0, |r| r.cnps_per_s), f.cnps as f64),
            SortKey::Bitrate => (r.map_or(0.0, |r| r.bits_per_s), f.bytes as f64),
        }
    }
}

/// Everything that went wrong on a flow since it was first seen.
pub fn problems_total(f: &Flow) -> u64 {
    f.ecn
        .ce
        .saturating_add(f.cnps)
        .saturating_add(f.naks)
        .saturating_add(f.rnr_naks)
        .saturating_add(f.psn_gaps)
}

/// What a key asks of the view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Continue,
    Quit,
}

/// The host audit's findings, counted by severity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuditCounts {
    pub errors: usize,
    pub warnings: usize,
    pub infos: usize,
}

impl AuditCounts {
    pub fn of(findings: &Findings) -> AuditCounts {
        let mut c = AuditCounts::default();
        for f in &findings.findings {
            match f.severity {
                Severity::Error => c.errors += 1,
                Severity::Warning => c.warnings += 1,
                Severity::Info => c.infos += 1,
            }
        }
        c
    }
}

/// The view's state: the last answers of the agent, the order and the scroll
/// position. Pure: no terminal, no network, no clock.
#[derive(Debug)]
pub struct TopState {
    addr: String,
    interval: Duration,
    /// The last flow document the agent answered, and when.
    doc: Option<Document>,
    answered_at: Option<SystemTime>,
    /// Why the last request failed; None when it succeeded.
    error: Option<String>,
    /// The last findings counted, or why `/findings` failed while `/flows` answered.
    audit: Option<Result<AuditCounts, String>>,
    sort: SortKey,
    reverse: bool,
    /// Indices into `doc.flows` in display order (sorted once per answer or key,
    /// not once per frame).
    order: Vec<usize>,
    /// Index of the first row shown.
    scroll: usize,
    /// Rows the table shows at once (set from the terminal's size).
    page: usize,
}

impl TopState {
    pub fn new(addr: impl Into<String>, interval: Duration) -> TopState {
        TopState {
            addr: addr.into(),
            interval,
            doc: None,
            answered_at: None,
            error: None,
            audit: None,
            sort: SortKey::Problems,
            reverse: false,
            order: Vec::new(),
            scroll: 0,
            page: 1,
        }
    }

    /// Takes one round of answers. A failed round keeps the last document on screen.
    pub fn update(&mut self, snap: Snapshot) {
        match snap.flows {
            Ok(doc) => {
                self.doc = Some(doc);
                self.answered_at = Some(snap.at);
                self.error = None;
                self.audit = Some(snap.findings.map(|f| AuditCounts::of(&f)));
                self.resort();
            }
            // The audit counts of the last answer stay: they are as old as the flows.
            Err(e) => self.error = Some(e),
        }
        self.clamp_scroll();
    }

    /// Handles one key; only presses count (terminals that report releases send both).
    pub fn handle_key(&mut self, key: KeyEvent) -> Action {
        if key.kind != KeyEventKind::Press {
            return Action::Continue;
        }
        if key.modifiers.contains(KeyModifiers::CONTROL) {
            return match key.code {
                KeyCode::Char('c') => Action::Quit,
                _ => Action::Continue,
            };
        }
        match key.code {
            KeyCode::Char('q') | KeyCode::Esc => return Action::Quit,
            KeyCode::Char('p') => self.sort_by(SortKey::Problems),
            KeyCode::Char('c') => self.sort_by(SortKey::CeRatio),
            KeyCode::Char('n') => self.sort_by(SortKey::CnpRate),
            KeyCode::Char('b') => self.sort_by(SortKey::Bitrate),
            KeyCode::Char('r') => {
                self.reverse = !self.reverse;
                self.resort();
                self.scroll = 0;
            }
            KeyCode::Up | KeyCode::Char('k') => self.scroll = self.scroll.saturating_sub(1),
            KeyCode::Down | KeyCode::Char('j') => self.scroll = self.scroll.saturating_add(1),
            KeyCode::PageUp => self.scroll = self.scroll.saturating_sub(self.page),
            KeyCode::PageDown => self.scroll = self.scroll.saturating_add(self.page),
            KeyCode::Home | KeyCode::Char('g') => self.scroll = 0,
            KeyCode::End | KeyCode::Char('G') => self.scroll = self.max_scroll(),
            _ => {}
        }
        self.clamp_scroll();
        Action::Continue
    }

    /// How many rows fit in the table (see [`page_rows`]).
    pub fn set_page(&mut self, rows: usize) {
        self.page = rows.max(1);
        self.clamp_scroll();
    }

    /// The flows in display order.
    pub fn rows(&self) -> impl Iterator<Item = &Flow> + '_ {
        let flows = self.doc.as_ref().map_or(&[][..], |d| &d.flows[..]);
        self.order.iter().filter_map(move |&i| flows.get(i))
    }

    pub fn row_count(&self) -> usize {
        self.order.len()
    }

    pub fn scroll(&self) -> usize {
        self.scroll
    }

    pub fn sort(&self) -> (SortKey, bool) {
        (self.sort, self.reverse)
    }

    fn sort_by(&mut self, key: SortKey) {
        self.sort = key;
        self.resort();
        // A new order starts at its top.
        self.scroll = 0;
    }

    fn resort(&mut self) {
        let Some(doc) = &self.doc else {
            self.order.clear();
            return;
        };
        let (key, reverse) = (self.sort, self.reverse);
        let mut order: Vec<usize> = (0..doc.flows.len()).collect();
        order.sort_by(|&a, &b| {
            let (fa, fb) = (&doc.flows[a], &doc.flows[b]);
            let (ra, ta) = key.values(fa);
            let (rb, tb) = key.values(fb);
            let larger_first = rb.total_cmp(&ra).then(tb.total_cmp(&ta));
            let by_key = if reverse {
                larger_first.reverse()
            } else {
                larger_first
            };
            // Ties keep the canonical order, so equal rows do not swap between frames.
            by_key.then_with(|| fa.canonical_cmp(fb))
        });
        self.order = order;
    }

    fn max_scroll(&self) -> usize {
        self.order.len().saturating_sub(self.page)
    }

    fn clamp_scroll(&mut self) {
        self.scroll = self.scroll.min(self.max_scroll());
    }
}

// ---------------------------------------------------------------------------------
// The drawing
// ---------------------------------------------------------------------------------

/// The table's columns, in screen order.
const COLUMNS: [&str; 17] = [
    "iface",
    "src→dst",
    "vni",
    "inner",
    "qp",
    "pkts/s",
    "bits/s",
    "CE/s",
    "CE%",
    "CNPs/s",
    "NAKs/s",
    "pkts",
    "CE",
    "CNPs",
    "NAK/RNR",
    "gaps",
    "dscp",
];
/// Columns that hold numbers are right-aligned.
const RIGHT: [bool; 17] = [
    false, false, true, false, true, true, true, true, true, true, true, true, true, true, true,
    true, true,
];
/// On a narrow terminal, columns are left out in this order until the rest fits
/// (addresses and QP, which name the flow, stay).
const DROP_ORDER: [usize; 15] = [16, 3, 2, 15, 14, 13, 12, 11, 10, 7, 5, 0, 9, 6, 8];
/// The rate columns: left out first when no row shown has rates (they are all "-").
const RATE_COLUMNS: [usize; 6] = [5, 6, 7, 8, 9, 10];
const COLUMN_GAP: u16 = 2;
/// The column that the sort key names, marked in the table's header.
fn sort_column(key: SortKey) -> Option<usize> {
    match key {
        SortKey::Problems => None,
        SortKey::CeRatio => Some(8),
        SortKey::CnpRate => Some(9),
        SortKey::Bitrate => Some(6),
    }
}

/// Header lines shown when the terminal has room for them (else only the first).
const FULL_HEADER_MIN_HEIGHT: u16 = 10;
const HEADER_LINES: u16 = 4;

/// Splits the screen into header, table and footer.
fn split(area: Rect) -> [Rect; 3] {
    let header = if area.height >= FULL_HEADER_MIN_HEIGHT {
        HEADER_LINES
    } else {
        1
    };
    let footer = u16::from(area.height >= 4);
    Layout::vertical([
        Constraint::Length(header),
        Constraint::Min(0),
        Constraint::Length(footer),
    ])
    .areas(area)
}

/// How many flows the table shows on a screen of this size.
pub fn page_rows(area: Rect) -> usize {
    let [_, table, _] = split(area);
    usize::from(table.height.saturating_sub(1))
}

/// Draws one frame of the view.
pub fn draw(frame: &mut Frame, state: &TopState) {
    let [header, table, footer] = split(frame.area());
    let lines: Vec<Line> = header_lines(state)
        .into_iter()
        .take(usize::from(header.height))
        .collect();
    frame.render_widget(Paragraph::new(lines), header);
    draw_table(frame, table, state);
    draw_footer(frame, footer, state);
}

fn header_lines(state: &TopState) -> Vec<Line<'static>> {
    let every = format!("every {}", seconds(state.interval));
    let status = match (&state.error, state.answered_at) {
        (Some(e), last) => {
            let mut text = format!("agent not answering at {}: {}", state.addr, printable(e));
            if let Some(t) = last {
                text.push_str(&format!(" (showing its answer of {})", clock(t)));
            }
            text.push_str(&format!("; retrying {every}"));
            Line::from(Span::styled(
                text,
                Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
            ))
        }
        (None, Some(t)) => Line::from(vec![
            Span::styled(
                "roce-agent top",
                Style::default().add_modifier(Modifier::BOLD),
            ),
            Span::raw(format!("  {}  refreshed {}, {every}", state.addr, clock(t))),
        ]),
        (None, None) => Line::from(format!("waiting for the agent at {}...", state.addr)),
    };

    let counters = match &state.doc {
        Some(doc) => {
            let c = &doc.counters;
            format!(
                "frames: roce {}, roce_in_vxlan {}, parse errors {}; flows {}",
                c.roce,
                c.roce_in_vxlan,
                c.parse_errors_total(),
                doc.flows.len()
            )
        }
        None => "frames: -".to_string(),
    };

    let rates = match state.doc.as_ref().map(rate_totals) {
        Some(Some(t)) => format!(
            "rates: {} pkts/s, {} bits/s, CE {}/s, CNPs {}/s, NAKs {}/s",
            si(t.packets_per_s),
            si(t.bits_per_s),
            si(t.ce_per_s),
            si(t.cnps_per_s),
            si(t.naks_per_s)
        ),
        // No flow has rates (an agent that computes none, or its first interval).
        _ => "rates: -".to_string(),
    };

    let audit = match &state.audit {
        Some(Ok(c)) => {
            let mut s = format!(
                "audit: {}, {}",
                plural(c.errors, "error"),
                plural(c.warnings, "warning")
            );
            if c.infos > 0 {
                s.push_str(&format!(", {} info", c.infos));
            }
            let style = if c.errors > 0 {
                Style::default().fg(Color::Red)
            } else if c.warnings > 0 {
                Style::default().fg(Color::Yellow)
            } else {
                Style::default()
            };
            Line::from(Span::styled(s, style))
        }
        Some(Err(e)) => Line::from(format!("audit: - ({})", printable(e))),
        None => Line::from("audit: -"),
    };

    vec![status, Line::from(counters), Line::from(rates), audit]
}

/// Sums of the rates over the flows that have them; None when none has.
fn rate_totals(doc: &Document) -> Option<crate::doc::Rates> {
    let mut any = false;
    let mut t = crate::doc::Rates::default();
    for r in doc.flows.iter().filter_map(|f| f.rates.as_ref()) {
        any = true;
        t.packets_per_s += r.packets_per_s;
        t.bits_per_s += r.bits_per_s;
        t.ce_per_s += r.ce_per_s;
        t.cnps_per_s += r.cnps_per_s;
        t.naks_per_s += r.naks_per_s;
    }
    any.then_some(t)
}

fn draw_table(frame: &mut Frame, area: Rect, state: &TopState) {
    if area.height == 0 || area.width == 0 {
        return;
    }
    let visible = usize::from(area.height.saturating_sub(1));
    let first = state.scroll.min(state.row_count().saturating_sub(visible));
    let cells: Vec<[String; 17]> = state.rows().skip(first).take(visible).map(cells).collect();

    let (key, reverse) = state.sort();
    let mut titles = COLUMNS.map(String::from);
    if let Some(i) = sort_column(key) {
        titles[i].push(if reverse { '▲' } else { '▼' });
    }
    let mut widths = titles.clone().map(|t| width_of(&t));
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(width_of(cell));
        }
    }
    let any_rates = state
        .rows()
        .skip(first)
        .take(visible)
        .any(|f| f.rates.is_some());
    let shown = fit_columns(&widths, area.width, any_rates);

    let header = Row::new(shown.iter().map(|&i| aligned(&titles[i], RIGHT[i])))
        .style(Style::default().add_modifier(Modifier::REVERSED));
    let rows: Vec<Row> = cells
        .iter()
        .map(|row| Row::new(shown.iter().map(|&i| aligned(&row[i], RIGHT[i]))))
        .collect();
    let constraints = shown.iter().map(|&i| Constraint::Length(widths[i]));
    let table = Table::new(rows, constraints)
        .header(header)
        .column_spacing(COLUMN_GAP);
    frame.render_widget(table, area);

    if cells.is_empty() && area.height > 1 {
        let note = match (&state.doc, &state.error) {
            (Some(_), _) => "no RoCE flows seen",
            (None, Some(_)) => "no answer from the agent yet",
            (None, None) => "waiting for the agent...",
        };
        let below_header = Rect {
            y: area.y + 1,
            height: 1,
            ..area
        };
        frame.render_widget(Paragraph::new(note), below_header);
    }
}

fn aligned(text: &str, right: bool) -> Cell<'static> {
    let line = Line::from(text.to_string());
    Cell::from(if right { line.right_aligned() } else { line })
}

fn width_of(s: &str) -> u16 {
    u16::try_from(s.chars().count()).unwrap_or(u16::MAX)
}

/// The columns (indices, in screen order) that fit in `width`, leaving out columns
/// in [`DROP_ORDER`] (the empty rate columns first when `any_rates` is false) until
/// the rest fits.
fn fit_columns(widths: &[u16; 17], width: u16, any_rates: bool) -> Vec<usize> {
    let mut shown: Vec<usize> = (0..widths.len()).collect();
    let total = |shown: &[usize]| -> u32 {
        let cells: u32 = shown.iter().map(|&i| u32::from(widths[i])).sum();
        let gaps = u32::from(COLUMN_GAP) * shown.len().saturating_sub(1) as u32;
        cells + gaps
    };
    let empty_first = if any_rates {
        &[][..]
    } else {
        &RATE_COLUMNS[..]
    };
    for &drop in empty_first.iter().chain(&DROP_ORDER) {
        if total(&shown) <= u32::from(width) {
            break;
        }
        shown.retain(|&i| i != drop);
    }
    shown
}

/// One flow's cells, in [`COLUMNS`] order.
fn cells(f: &Flow) -> [String; 17] {
    let iface = match (f.ifname.as_deref().map(printable), f.direction) {
        (Some(n), Some(Direction::Ingress)) => format!("{n}/in"),
        (Some(n), Some(Direction::Egress)) => format!("{n}/out"),
        (Some(n), None) => n,
        (None, _) => "-".to_string(),
    };
    let inner = match (f.inner_src, f.inner_dst) {
        (Some(s), Some(d)) => format!("{s}→{d}"),
        _ => "-".to_string(),
    };
    let rate =
        |pick: fn(&crate::doc::Rates) -> f64| f.rates.as_ref().map_or("-".into(), |r| si(pick(r)));
    [
        iface,
        format!("{}→{}", f.src, f.dst),
        f.vni.map_or_else(|| "-".to_string(), |v| v.to_string()),
        inner,
        // Hex, as `roce-agent flows`, the findings, tshark and perftest print QPs.
        format!("{:#x}", f.dest_qp),
        rate(|r| r.packets_per_s),
        rate(|r| r.bits_per_s),
        rate(|r| r.ce_per_s),
        f.rates
            .as_ref()
            .map_or("-".into(), |r| format!("{:.1}", r.ce_ratio * 100.0)),
        rate(|r| r.cnps_per_s),
        rate(|r| r.naks_per_s),
        count(f.packets),
        count(f.ecn.ce),
        count(f.cnps),
        format!("{}/{}", count(f.naks), count(f.rnr_naks)),
        count(f.psn_gaps),
        f.last_dscp.to_string(),
    ]
}

/// The keys on the left; on the right, the order and which rows are shown (kept
/// whole on a narrow terminal, where the keys are cut instead).
fn draw_footer(frame: &mut Frame, area: Rect, state: &TopState) {
    let (key, reverse) = state.sort();
    let arrow = if reverse { '▲' } else { '▼' };
    let n = state.row_count();
    let position = if n == 0 {
        "no flows".to_string()
    } else {
        let first = state.scroll.min(n.saturating_sub(state.page)) + 1;
        let last = (first - 1 + state.page).min(n);
        format!("flows {first}-{last} of {n}")
    };
    let status = format!("sort: {}{arrow}  {position}", key.label());
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut keys = Vec::new();
    for (k, what) in [
        ("q", "quit"),
        ("p", "problems"),
        ("c", "CE%"),
        ("n", "CNPs/s"),
        ("b", "bits/s"),
        ("r", "reverse"),
        ("↑↓ PgUp PgDn Home End", "scroll"),
    ] {
        if !keys.is_empty() {
            keys.push(Span::raw("  "));
        }
        keys.push(Span::styled(k, bold));
        keys.push(Span::raw(format!(" {what}")));
    }
    let [left, right] = Layout::horizontal([
        Constraint::Min(0),
        Constraint::Length(width_of(&status).min(area.width)),
    ])
    .spacing(2)
    .areas(area);
    frame.render_widget(Paragraph::new(Line::from(keys)), left);
    frame.render_widget(Paragraph::new(status), right);
}

/// A rate with an SI prefix: `0`, `0.5`, `12`, `950`, `1.23k`, `10.3G`.
pub fn si(v: f64) -> String {
    const PREFIXES: [&str; 6] = ["", "k", "M", "G", "T", "P"];
    if !v.is_finite() || v < 0.0 {
        return "-".to_string();
    }
    if v == 0.0 {
        return "0".to_string();
    }
    if v < 10.0 {
        return format!("{v:.1}");
    }
    let mut v = v;
    let mut prefix = 0;
    while v >= 1000.0 && prefix + 1 < PREFIXES.len() {
        v /= 1000.0;
        prefix += 1;
    }
    let p = PREFIXES[prefix];
    if prefix == 0 || v >= 100.0 {
        format!("{v:.0}{p}")
    } else if v >= 10.0 {
        format!("{v:.1}{p}")
    } else {
        format!("{v:.2}{p}")
    }
}

/// A total: exact up to 99999, then with an SI prefix (the column stays narrow).
pub fn count(n: u64) -> String {
    if n < 100_000 {
        n.to_string()
    } else {
        si(n as f64)
    }
}

/// Text from the network with control characters replaced: an escape sequence in an
/// interface name or an error must not reach the terminal.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0}s")
    } else {
        format!("{s}s")
    }
}

/// Local wall-clock time of day, `HH:MM:SS`.
fn clock(t: SystemTime) -> String {
    let secs = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_secs(),
        Err(_) => return "??:??:??".to_string(),
    };
    let Ok(time) = libc::time_t::try_from(secs) else {
        return "??:??:??".to_string();
    };
    // SAFETY: localtime_r only writes the `tm` we own; a zeroed tm is a valid value.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are valid for the call; localtime_r is thread-safe.
    if unsafe { libc::localtime_r(&time, &mut tm) }.is_null() {
        return "??:??:??".to_string();
    }
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

// ---------------------------------------------------------------------------------
// The terminal
// ---------------------------------------------------------------------------------

/// Whether this process has the terminal in raw mode on the alternate screen, so
/// that exactly one of the guard's drop and the panic hook gives it back.
static TERMINAL_TAKEN: AtomicBool = AtomicBool::new(false);
/// Set by SIGTERM, SIGHUP or SIGINT: the view ends as if `q` was pressed.
static STOP: AtomicBool = AtomicBool::new(false);

/// Raw mode, alternate screen and a hidden cursor while it lives; the terminal as it
/// was when it is dropped (on return, on error, on unwinding) or, before the panic
/// message is printed, by the panic hook.
pub struct TerminalGuard(());

impl TerminalGuard {
    pub fn enter() -> std::io::Result<TerminalGuard> {
        install_panic_hook();
        crossterm::terminal::enable_raw_mode()?;
        TERMINAL_TAKEN.store(true, AtomicOrdering::SeqCst);
        // From here on, a failure restores the terminal when `guard` drops.
        let guard = TerminalGuard(());
        crossterm::execute!(
            std::io::stdout(),
            crossterm::terminal::EnterAlternateScreen,
            crossterm::cursor::Hide
        )?;
        Ok(guard)
    }
}

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        restore_terminal();
    }
}

/// Raw mode off, main screen back, cursor shown; once, whoever calls first.
fn restore_terminal() {
    if TERMINAL_TAKEN.swap(false, AtomicOrdering::SeqCst) {
        let _ = crossterm::terminal::disable_raw_mode();
        let _ = crossterm::execute!(
            std::io::stdout(),
            crossterm::terminal::LeaveAlternateScreen,
            crossterm::cursor::Show
        );
    }
}

fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // Before the message, or it would be printed on the alternate screen and lost.
            restore_terminal();
            previous(info);
        }));
    });
}

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, AtomicOrdering::SeqCst);
}

/// A kill, a closed terminal or a SIGINT from another process ends the view through
/// the same path as `q`, so the terminal is restored.
fn stop_on_signals() {
    let handler = on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
    for sig in [libc::SIGTERM, libc::SIGHUP, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, handler) };
    }
}

/// Asks the agent every `interval` on its own thread, so a slow or dead agent never
/// holds up keys or drawing. Ends when the view has gone (the receiver is dropped).
fn spawn_fetcher(
    addr: String,
    interval: Duration,
    answers: mpsc::Sender<Snapshot>,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("top-fetch".into())
        .spawn(move || loop {
            let started = Instant::now();
            if answers.send(fetch(&addr, FETCH_TIMEOUT)).is_err() {
                return;
            }
            std::thread::sleep(interval.saturating_sub(started.elapsed()));
        })
        .map(|_| ())
}

/// `roce-agent top`.
pub fn top(args: TopArgs) -> anyhow::Result<()> {
    if !std::io::stdout().is_terminal() {
        bail!("top draws on a terminal and stdout is not one; `roce-agent flows` prints the table once");
    }
    let interval = Duration::from_secs_f64(args.interval);
    let (tx, answers) = mpsc::channel();
    spawn_fetcher(args.api.clone(), interval, tx).context("starting the fetch thread")?;
    let mut state = TopState::new(args.api, interval);
    stop_on_signals();

    let keyboard = Keyboard::open().context("opening the terminal for keys")?;
    let guard = TerminalGuard::enter().context("setting up the terminal")?;
    let mut terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))
        .context("setting up the terminal")?;
    terminal.clear().context("clearing the terminal")?;
    let result = view_loop(&mut terminal, &mut state, &answers, &keyboard);
    drop(terminal);
    drop(guard);
    result
}

fn view_loop(
    terminal: &mut Terminal<CrosstermBackend<std::io::Stdout>>,
    state: &mut TopState,
    answers: &mpsc::Receiver<Snapshot>,
    keyboard: &Keyboard,
) -> anyhow::Result<()> {
    loop {
        while let Ok(snap) = answers.try_recv() {
            state.update(snap);
        }
        // Resizes need no event: ratatui measures the terminal before each frame.
        terminal
            .draw(|frame| {
                state.set_page(page_rows(frame.area()));
                draw(frame, state);
            })
            .context("drawing")?;
        if keyboard.gone_after(TICK) {
            return Ok(());
        }
        // Every key that has arrived: one read may bring crossterm several.
        loop {
            if keyboard.gone_after(Duration::ZERO) {
                return Ok(());
            }
            if !event::poll(Duration::ZERO).context("reading the terminal")? {
                break;
            }
            if let Event::Key(key) = event::read().context("reading the terminal")? {
                if state.handle_key(key) == Action::Quit {
                    return Ok(());
                }
            }
        }
        if STOP.load(AtomicOrdering::SeqCst) {
            return Ok(());
        }
    }
}

/// The terminal the keys come from, watched with poll(2) before crossterm reads it:
/// crossterm 0.29 loops forever on a terminal that hung up (its reads return 0), so
/// it is only asked while the terminal is still there.
struct Keyboard {
    /// `/dev/tty` when stdin is not the terminal (crossterm then reads it too).
    _tty: Option<std::fs::File>,
    fd: std::os::fd::RawFd,
}

impl Keyboard {
    fn open() -> std::io::Result<Keyboard> {
        use std::os::fd::AsRawFd as _;
        if std::io::stdin().is_terminal() {
            return Ok(Keyboard {
                _tty: None,
                fd: std::io::stdin().as_raw_fd(),
            });
        }
        let tty = std::fs::File::open("/dev/tty")?;
        let fd = tty.as_raw_fd();
        Ok(Keyboard {
            _tty: Some(tty),
            fd,
        })
    }

    /// Waits up to `timeout` for a key or a hang-up; true when the terminal hung up
    /// (its window closed, its tmux server killed: nobody is watching). A signal ends
    /// the wait early, so the caller sees `STOP` at once.
    fn gone_after(&self, timeout: Duration) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let millis = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd, alive for the whole call.
        let ready = unsafe { libc::poll(&mut pfd, 1, millis) };
        ready > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc::finding::Finding;
    use crate::doc::{Counters, Ecn, Family, Rates};
    use ratatui::backend::TestBackend;

    fn flow(src: &str, qp: u32) -> Flow {
        Flow {
            ifname: Some("va".into()),
            direction: Some(Direction::Ingress),
            family: Family::Ipv4,
            src: src.parse().unwrap(),
            dst: "198.18.0.1".parse().unwrap(),
            sport: 49152,
            vni: None,
            inner_family: None,
            inner_src: None,
            inner_dst: None,
            dest_qp: qp,
            packets: 1000,
            bytes: 1_284_000,
            ecn: Ecn {
                ect0: 1000,
                ..Default::default()
            },
            inner_ecn: None,
            cnps: 0,
            acks: 0,
            naks: 0,
            rnr_naks: 0,
            psn_gaps: 0,
            psn_split: false,
            last_dscp: 26,
            first_seen_ns: 0,
            last_seen_ns: 0,
            rates: None,
        }
    }

    fn with_ce(mut f: Flow, ce: u64) -> Flow {
        f.ecn.ce = ce;
        f.ecn.ect0 = f.packets - ce;
        f
    }

    fn rates(ce_ratio: f64, cnps_per_s: f64, bits_per_s: f64) -> Option<Rates> {
        Some(Rates {
            interval_s: 1.0,
            packets_per_s: 1000.0,
            bits_per_s,
            ce_per_s: ce_ratio * 1000.0,
            ce_ratio,
            cnps_per_s,
            naks_per_s: 0.0,
        })
    }

    /// Three flows whose orders differ by key (no rates):
    /// problems: 0x10 (CNPs, NAKs) > 0x20 (CE) > 0x30 (a PSN gap) > 0x40 (none);
    /// CE ratio: 0x20 (50%) > 0x10 (0.5%) > the others; bytes: 0x40 > 0x30 > ...
    fn document() -> Document {
        let mut a = with_ce(flow("198.18.0.2", 0x10), 5);
        a.cnps = 100;
        a.naks = 10;
        a.rnr_naks = 2;
        let mut b = with_ce(flow("198.18.0.3", 0x20), 0);
        b.packets = 100;
        b.ecn = Ecn {
            ect0: 50,
            ce: 50,
            ..Default::default()
        };
        let mut c = flow("198.18.0.4", 0x30);
        c.psn_gaps = 1;
        c.bytes = 5_000_000;
        let mut d = flow("198.18.0.5", 0x40);
        d.bytes = 9_000_000;
        d.vni = Some(5001);
        d.inner_src = Some("198.19.0.1".parse().unwrap());
        d.inner_dst = Some("198.19.0.2".parse().unwrap());
        let mut counters = Counters {
            roce: 2100,
            roce_in_vxlan: 1000,
            ..Default::default()
        };
        counters.parse_errors.insert("truncated_bth".into(), 3);
        counters.parse_errors.insert("bad_vxlan_flags".into(), 4);
        Document {
            // The document's own order, which the view must not keep.
            flows: vec![d, c, b, a],
            counters,
        }
    }

    fn findings() -> Findings {
        let f = |severity| Finding {
            check: "mtu".into(),
            interface: Some("va".into()),
            severity,
            found: "MTU 1500".into(),
            expected: "MTU >= 4192".into(),
            fix: "ip link set dev va mtu 4192".into(),
            flows: None,
        };
        Findings {
            findings: vec![
                f(Severity::Error),
                f(Severity::Warning),
                f(Severity::Error),
                f(Severity::Info),
            ],
        }
    }

    fn answered(doc: Document) -> Snapshot {
        Snapshot {
            at: SystemTime::now(),
            flows: Ok(doc),
            findings: Ok(findings()),
        }
    }

    fn state_with(doc: Document) -> TopState {
        let mut s = TopState::new("127.0.0.1:9473", Duration::from_secs(1));
        s.update(answered(doc));
        s
    }

    fn press(s: &mut TopState, code: KeyCode) -> Action {
        s.handle_key(KeyEvent::new(code, KeyModifiers::NONE))
    }

    fn qps(s: &TopState) -> Vec<u32> {
        s.rows().map(|f| f.dest_qp).collect()
    }

    #[test]
    fn problems_first_by_default() {
        let s = state_with(document());
        assert_eq!(s.sort(), (SortKey::Problems, false));
        assert_eq!(qps(&s), vec![0x10, 0x20, 0x30, 0x40]);
    }

    #[test]
    fn sort_keys_and_reverse_change_the_order() {
        let mut s = state_with(document());
        press(&mut s, KeyCode::Char('c'));
        assert_eq!(qps(&s), vec![0x20, 0x10, 0x30, 0x40]);
        press(&mut s, KeyCode::Char('b'));
        assert_eq!(qps(&s), vec![0x40, 0x30, 0x10, 0x20]);
        press(&mut s, KeyCode::Char('n'));
        // 0x10 has CNPs; the rest tie and keep the document's order (by source).
        assert_eq!(qps(&s), vec![0x10, 0x20, 0x30, 0x40]);
        press(&mut s, KeyCode::Char('r'));
        assert_eq!(s.sort(), (SortKey::CnpRate, true));
        assert_eq!(qps(&s), vec![0x20, 0x30, 0x40, 0x10]);
        press(&mut s, KeyCode::Char('p'));
        assert_eq!(qps(&s), vec![0x40, 0x30, 0x20, 0x10]);
        press(&mut s, KeyCode::Char('r'));
        assert_eq!(qps(&s), vec![0x10, 0x20, 0x30, 0x40]);
    }

    #[test]
    fn rates_come_before_totals() {
        let mut doc = document();
        // 0x40 has no problem in total but CE now; 0x10, the worst in total, is quiet now.
        for f in &mut doc.flows {
            f.rates = rates(0.0, 0.0, 1e9);
        }
        let d = doc.flows.iter_mut().find(|f| f.dest_qp == 0x40).unwrap();
        d.rates = rates(0.01, 0.0, 2e9);
        let mut s = state_with(doc);
        assert_eq!(qps(&s), vec![0x40, 0x10, 0x20, 0x30]);
        press(&mut s, KeyCode::Char('b'));
        assert_eq!(qps(&s)[0], 0x40);
        press(&mut s, KeyCode::Char('c'));
        assert_eq!(qps(&s), vec![0x40, 0x20, 0x10, 0x30]);
    }

    #[test]
    fn quit_keys() {
        let mut s = state_with(document());
        assert_eq!(press(&mut s, KeyCode::Char('q')), Action::Quit);
        assert_eq!(press(&mut s, KeyCode::Esc), Action::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(s.handle_key(ctrl_c), Action::Quit);
        // Ctrl-C is not `c`: the order stays.
        assert_eq!(s.sort().0, SortKey::Problems);
        assert_eq!(press(&mut s, KeyCode::Char('x')), Action::Continue);
        let mut release = KeyEvent::new(KeyCode::Char('q'), KeyModifiers::NONE);
        release.kind = KeyEventKind::Release;
        assert_eq!(s.handle_key(release), Action::Continue);
    }

    #[test]
    fn scrolling_stays_within_the_rows() {
        let mut doc = document();
        for i in 0..20 {
            doc.flows.push(flow("198.18.1.1", 0x100 + i));
        }
        let mut s = state_with(doc);
        s.set_page(10);
        press(&mut s, KeyCode::Up);
        assert_eq!(s.scroll(), 0);
        press(&mut s, KeyCode::Down);
        assert_eq!(s.scroll(), 1);
        press(&mut s, KeyCode::PageDown);
        assert_eq!(s.scroll(), 11);
        press(&mut s, KeyCode::PageDown);
        assert_eq!(s.scroll(), 14, "24 rows, 10 shown");
        press(&mut s, KeyCode::PageUp);
        assert_eq!(s.scroll(), 4);
        press(&mut s, KeyCode::End);
        assert_eq!(s.scroll(), 14);
        press(&mut s, KeyCode::Home);
        assert_eq!(s.scroll(), 0);
        press(&mut s, KeyCode::End);
        // Fewer flows in the next answer: the view stays on a full page.
        s.update(answered(document()));
        assert_eq!(s.scroll(), 0);
        // A new sort starts at the top.
        s.set_page(2);
        press(&mut s, KeyCode::End);
        assert_eq!(s.scroll(), 2);
        press(&mut s, KeyCode::Char('c'));
        assert_eq!(s.scroll(), 0);
    }

    #[test]
    fn a_failed_round_keeps_the_last_answer() {
        let mut s = state_with(document());
        s.update(Snapshot {
            at: SystemTime::now(),
            flows: Err("Connection refused (os error 111)".into()),
            findings: Err("Connection refused (os error 111)".into()),
        });
        assert_eq!(s.row_count(), 4);
        assert_eq!(
            s.audit,
            Some(Ok(AuditCounts {
                errors: 2,
                warnings: 1,
                infos: 1
            }))
        );
        assert!(s.error.is_some());
        s.update(answered(Document::default()));
        assert_eq!(s.row_count(), 0);
        assert!(s.error.is_none());
    }

    #[test]
    fn a_silent_agent_is_a_timeout_and_no_agent_a_refusal() {
        // Bound but never accepting: the connection is made, no answer comes.
        let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = silent.local_addr().unwrap().to_string();
        let snap = fetch(&addr, Duration::from_millis(200));
        assert_eq!(snap.flows.unwrap_err(), "no answer within 0.2s");
        assert_eq!(snap.findings.unwrap_err(), "no answer within 0.2s");
        drop(silent);
        let e = fetch(&addr, Duration::from_millis(200)).flows.unwrap_err();
        assert!(e.contains("refused"), "{e}");
    }

    #[test]
    fn control_characters_from_the_network_never_reach_the_terminal() {
        let mut doc = document();
        doc.flows[0].ifname = Some("eth\x1b[2J1".into());
        let mut s = state_with(doc);
        let lines = screen(&mut s, 200, 14);
        assert!(lines.iter().any(|l| l.contains("eth?[2J1/in")), "{lines:?}");
        s.update(Snapshot {
            at: SystemTime::now(),
            flows: Err("bad\x07\x1b]0;title\x07".into()),
            findings: Err(String::new()),
        });
        let lines = screen(&mut s, 200, 14);
        assert!(lines[0].contains(": bad??]0;title?"), "{lines:?}");
    }

    #[test]
    fn interval_must_be_sane() {
        assert_eq!(parse_interval("0.5"), Ok(0.5));
        assert!(parse_interval("0").is_err());
        assert!(parse_interval("-1").is_err());
        assert!(parse_interval("NaN").is_err());
        assert!(parse_interval("soon").is_err());
    }

    #[test]
    fn numbers_in_human_units() {
        assert_eq!(si(0.0), "0");
        assert_eq!(si(0.5), "0.5");
        assert_eq!(si(12.0), "12");
        assert_eq!(si(950.0), "950");
        assert_eq!(si(1234.0), "1.23k");
        assert_eq!(si(10.3e9), "10.3G");
        assert_eq!(si(400e9), "400G");
        assert_eq!(si(f64::NAN), "-");
        assert_eq!(count(99_999), "99999");
        assert_eq!(count(123_456), "123k");
        assert_eq!(plural(1, "error"), "1 error");
        assert_eq!(plural(0, "error"), "0 errors");
    }

    // ---- drawing -------------------------------------------------------------

    /// Draws `state` on a `width` x `height` test terminal and returns its lines.
    fn screen(state: &mut TopState, width: u16, height: u16) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal
            .draw(|frame| {
                state.set_page(page_rows(frame.area()));
                draw(frame, state);
            })
            .unwrap();
        let buf = terminal.backend().buffer();
        (0..buf.area.height)
            .map(|y| {
                (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect::<String>()
                    .trim_end()
                    .to_string()
            })
            .collect()
    }

    /// The QP column of each table row on the screen (the header line is row 4).
    fn screen_qps(lines: &[String]) -> Vec<String> {
        lines
            .iter()
            .skip(5)
            .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("0x")))
            .map(String::from)
            .collect()
    }

    #[test]
    fn draws_header_counts_and_the_worst_flow_first() {
        let mut s = state_with(document());
        let lines = screen(&mut s, 200, 14);
        let all = lines.join("\n");
        assert!(
            lines[0].starts_with("roce-agent top  127.0.0.1:9473  refreshed "),
            "{all}"
        );
        assert!(lines[0].ends_with(", every 1s"), "{all}");
        assert_eq!(
            lines[1],
            "frames: roce 2100, roce_in_vxlan 1000, parse errors 7; flows 4"
        );
        assert_eq!(lines[2], "rates: -");
        assert_eq!(lines[3], "audit: 2 errors, 1 warning, 1 info");
        for col in [
            "iface",
            "src→dst",
            "qp",
            "pkts/s",
            "bits/s",
            "CE%",
            "CNPs/s",
            "NAK/RNR",
            "dscp",
        ] {
            assert!(lines[4].contains(col), "{col}: {all}");
        }
        assert!(
            lines[5].starts_with("va/in  198.18.0.2→198.18.0.1"),
            "{all}"
        );
        assert_eq!(
            screen_qps(&lines),
            vec!["0x10", "0x20", "0x30", "0x40"],
            "{all}"
        );
        // No rates: every rate cell is "-", the totals are there.
        let words: Vec<&str> = lines[5].split_whitespace().collect();
        assert_eq!(
            words,
            [
                "va/in",
                "198.18.0.2→198.18.0.1",
                "-",
                "-",
                "0x10",
                "-",
                "-",
                "-",
                "-",
                "-",
                "-",
                "1000",
                "5",
                "100",
                "10/2",
                "0",
                "26"
            ],
            "{all}"
        );
        assert!(
            lines[8].contains("198.19.0.1→198.19.0.2") && lines[8].contains("5001"),
            "{all}"
        );
        let footer = lines.last().unwrap();
        assert!(
            footer.contains("q quit") && footer.contains("c CE%"),
            "{all}"
        );
        assert!(footer.ends_with("sort: problems▼  flows 1-4 of 4"), "{all}");
    }

    #[test]
    fn sort_keys_change_the_drawn_order() {
        let mut s = state_with(document());
        press(&mut s, KeyCode::Char('c'));
        let lines = screen(&mut s, 200, 14);
        assert_eq!(screen_qps(&lines), vec!["0x20", "0x10", "0x30", "0x40"]);
        assert!(lines[4].contains("CE%▼"), "{}", lines[4]);
        press(&mut s, KeyCode::Char('r'));
        let lines = screen(&mut s, 200, 14);
        assert_eq!(screen_qps(&lines), vec!["0x30", "0x40", "0x10", "0x20"]);
        assert!(lines[4].contains("CE%▲"), "{}", lines[4]);
        assert!(lines.last().unwrap().contains("sort: CE ratio▲"));
    }

    #[test]
    fn rates_are_drawn_when_present_and_totalled() {
        let mut doc = document();
        let a = doc.flows.iter_mut().find(|f| f.dest_qp == 0x10).unwrap();
        a.rates = rates(0.25, 40.0, 10.3e9);
        let mut s = state_with(doc);
        let lines = screen(&mut s, 200, 14);
        let all = lines.join("\n");
        assert_eq!(
            lines[2], "rates: 1.00k pkts/s, 10.3G bits/s, CE 250/s, CNPs 40/s, NAKs 0/s",
            "{all}"
        );
        let words: Vec<&str> = lines[5].split_whitespace().collect();
        assert_eq!(
            &words[4..11],
            ["0x10", "1.00k", "10.3G", "250", "25.0", "40", "0"],
            "{all}"
        );
        // The other flows have none: "-".
        let words: Vec<&str> = lines[6].split_whitespace().collect();
        assert_eq!(
            &words[4..11],
            ["0x20", "-", "-", "-", "-", "-", "-"],
            "{all}"
        );
    }

    #[test]
    fn agent_down_is_said_in_the_header() {
        let mut s = TopState::new("127.0.0.1:9", Duration::from_secs(1));
        s.update(Snapshot {
            at: SystemTime::now(),
            flows: Err("Connection refused (os error 111)".into()),
            findings: Err("Connection refused (os error 111)".into()),
        });
        let lines = screen(&mut s, 120, 12);
        assert_eq!(
            lines[0],
            "agent not answering at 127.0.0.1:9: Connection refused (os error 111); retrying every 1s"
        );
        assert_eq!(lines[1], "frames: -");
        assert_eq!(lines[3], "audit: -");
        assert!(
            lines[5].contains("no answer from the agent yet"),
            "{lines:?}"
        );

        // After an answer, a failure keeps the answer on screen and says how old it is.
        let mut s = state_with(document());
        s.update(Snapshot {
            at: SystemTime::now(),
            flows: Err("timed out".into()),
            findings: Err("timed out".into()),
        });
        let lines = screen(&mut s, 200, 14);
        assert!(
            lines[0].starts_with(
                "agent not answering at 127.0.0.1:9473: timed out (showing its answer of "
            ),
            "{lines:?}"
        );
        assert_eq!(screen_qps(&lines).len(), 4);
    }

    #[test]
    fn findings_failure_alone_is_shown_on_the_audit_line() {
        let mut s = TopState::new("127.0.0.1:9473", Duration::from_millis(500));
        s.update(Snapshot {
            at: SystemTime::now(),
            flows: Ok(Document::default()),
            findings: Err("127.0.0.1:9473 answered /findings with HTTP status 404: ".into()),
        });
        let lines = screen(&mut s, 120, 12);
        assert!(lines[0].ends_with(", every 0.5s"), "{lines:?}");
        assert!(
            lines[3].starts_with("audit: - (127.0.0.1:9473 answered /findings"),
            "{lines:?}"
        );
        assert!(lines[5].contains("no RoCE flows seen"), "{lines:?}");
        assert!(lines.last().unwrap().ends_with("no flows"), "{lines:?}");
    }

    #[test]
    fn a_small_terminal_keeps_the_flow_names_and_the_status() {
        let mut s = state_with(document());
        let lines = screen(&mut s, 40, 6);
        let all = lines.join("\n");
        // One header line, the table header, rows, the footer.
        assert!(lines[0].starts_with("roce-agent top"), "{all}");
        assert!(
            lines[1].contains("src→dst") && lines[1].contains("qp"),
            "{all}"
        );
        assert!(!lines[1].contains("dscp"), "{all}");
        // No flow has rates: the "-" columns go first, the totals stay.
        assert!(
            !lines[1].contains("pkts/s") && lines[1].contains("pkts"),
            "{all}"
        );
        assert!(
            lines[2].contains("198.18.0.2→198.18.0.1") && lines[2].contains("0x10"),
            "{all}"
        );
        // Three rows fit (6 lines - header - table header - footer), the footer says so.
        assert!(lines[5].starts_with("q quit"), "{all}");
        // Tiny screens draw without panicking.
        for (w, h) in [(1, 1), (10, 2), (200, 3), (0, 0)] {
            screen(&mut s, w, h);
        }
    }

    #[test]
    fn scrolled_view_shows_later_rows() {
        let mut doc = document();
        for i in 0..20 {
            doc.flows.push(flow("198.18.1.1", 0x100 + i));
        }
        let mut s = state_with(doc);
        screen(&mut s, 200, 14); // sets the page: 14 - 4 header - 1 table header - 1 footer
        press(&mut s, KeyCode::PageDown);
        let lines = screen(&mut s, 200, 14);
        assert_eq!(screen_qps(&lines)[0], "0x104", "{lines:?}");
        assert!(
            lines.last().unwrap().ends_with("flows 9-16 of 24"),
            "{lines:?}"
        );
    }
}
