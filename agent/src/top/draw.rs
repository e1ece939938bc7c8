//! The drawing: one frame of a [`TopState`] on any ratatui backend, in three parts —
//! the header (the agent's status, frame counters and the flows the filter lets
//! through, rate totals, the audit, what the agent sees of RoCE on each interface and
//! its QP table), the table of flows or of hardware-only QPs (columns left out on a
//! narrow terminal) and the footer (keys or the filter prompt, filter, order, rows
//! shown). Reads the state, never changes it.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table};
use ratatui::Frame;

use crate::doc::qp::Qp;
use crate::doc::{Direction, Document, Flow};

use super::state::{flow_owner, owner_label, QpTable, Rows, SortKey, TopState};
use super::text::{clock, count, plural, printable, seconds, si};

/// The table's columns, in screen order.
const COLUMNS: [&str; 19] = [
    "iface",
    "src→dst",
    "vni",
    "inner",
    "qp",
    "owner",
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
    "RTT p99",
];
/// Columns that hold numbers are right-aligned.
const RIGHT: [bool; 19] = [
    false, false, true, false, true, false, true, true, true, true, true, true, true, true, true,
    true, true, true, true,
];
/// On a narrow terminal, columns are left out in this order until the rest fits
/// (addresses and QP, which name the flow, stay).
const DROP_ORDER: [usize; 17] = [17, 3, 2, 16, 15, 14, 13, 18, 5, 12, 11, 8, 6, 0, 10, 7, 9];
/// The rate columns: left out first when no row shown has rates (they are all "-").
const RATE_COLUMNS: [usize; 6] = [6, 7, 8, 9, 10, 11];
const COLUMN_GAP: u16 = 2;
/// The column that the sort key names, marked in the table's header.
fn sort_column(key: SortKey) -> Option<usize> {
    match key {
        SortKey::Problems => None,
        SortKey::CeRatio => Some(9),
        SortKey::CnpRate => Some(10),
        SortKey::Bitrate => Some(7),
    }
}

/// The columns of the hardware-only QPs, in screen order.
const QP_COLUMNS: [&str; 8] = [
    "device/port",
    "lqpn",
    "rqpn",
    "type",
    "state",
    "owner",
    "src→dst",
    "hw counters",
];
const QP_RIGHT: [bool; 8] = [false, true, true, false, false, false, false, true];
/// Left out in this order on a narrow terminal (device and QPN stay).
const QP_DROP_ORDER: [usize; 6] = [7, 6, 3, 2, 4, 5];

/// Header lines shown when the terminal has room for them (else only the first).
const FULL_HEADER_MIN_HEIGHT: u16 = 10;
const HEADER_LINES: u16 = 5;

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
    let every = format!("every {}", seconds(state.interval()));
    let status = match (state.error(), state.answered_at()) {
        (Some(e), last) => {
            let mut text = format!("agent not answering at {}: {}", state.addr(), printable(e));
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
            Span::raw(format!(
                "  {}  refreshed {}, {every}",
                state.addr(),
                clock(t)
            )),
        ]),
        (None, None) => Line::from(format!("waiting for the agent at {}...", state.addr())),
    };

    let counters = match state.document() {
        Some(doc) => {
            let c = &doc.counters;
            let flows = if filtering(state) {
                format!(
                    "{} of {} flows match filter \"{}\"",
                    state.row_count(),
                    doc.flows.len(),
                    printable(state.filter())
                )
            } else {
                format!("flows {}", doc.flows.len())
            };
            format!(
                "frames: roce {}, roce_in_vxlan {}, parse errors {}; {flows}",
                c.roce,
                c.roce_in_vxlan,
                c.parse_errors_total(),
            )
        }
        None => "frames: -".to_string(),
    };

    let rates = match state.document().map(rate_totals) {
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

    let audit = match state.audit() {
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

    vec![
        status,
        Line::from(counters),
        Line::from(rates),
        audit,
        Line::from(visibility_line(state)),
    ]
}

/// `visibility: va kernel_path, eth2 offloaded; QPs 12, 3 hardware-only`.
fn visibility_line(state: &TopState) -> String {
    match state.qp_table() {
        QpTable::Unknown => "visibility: -".to_string(),
        QpTable::Absent => "visibility: - (the agent has no QP table)".to_string(),
        QpTable::Failed(e) => format!("visibility: - ({})", printable(e)),
        QpTable::Answered(a) => {
            let modes: Vec<String> = a
                .visibility
                .iter()
                .map(|v| format!("{} {}", printable(&v.ifname), printable(&v.mode)))
                .collect();
            let modes = if modes.is_empty() {
                "-".to_string()
            } else {
                modes.join(", ")
            };
            let mut line = format!(
                "visibility: {modes}; QPs {}, {} hardware-only",
                a.document.qps.len(),
                state.hardware_qp_count()
            );
            if let Some(e) = &a.document.error {
                line.push_str(&format!(" (QP table not read: {})", printable(e)));
            }
            line
        }
    }
}

/// Whether a filter leaves rows out (a blank one lets every flow through).
fn filtering(state: &TopState) -> bool {
    !state.filter().trim().is_empty()
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
    if state.showing() == Rows::HardwareQps {
        draw_qp_table(frame, area, state);
        return;
    }
    let visible = usize::from(area.height.saturating_sub(1));
    let first = state
        .scroll()
        .min(state.row_count().saturating_sub(visible));
    let cells: Vec<[String; 19]> = state.rows().skip(first).take(visible).map(cells).collect();

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
    let empty_first = if any_rates {
        &[][..]
    } else {
        &RATE_COLUMNS[..]
    };
    let shown = fit_columns(&widths, area.width, empty_first, &DROP_ORDER);

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
        let note = match (state.document(), state.error()) {
            (Some(_), _) if state.flow_count() > 0 => "no flow matches the filter",
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

/// The hardware-only QPs: those of the agent's QP table that no flow was joined to.
fn draw_qp_table(frame: &mut Frame, area: Rect, state: &TopState) {
    let visible = usize::from(area.height.saturating_sub(1));
    let first = state
        .scroll()
        .min(state.row_count().saturating_sub(visible));
    let cells: Vec<[String; 8]> = state
        .qp_rows()
        .skip(first)
        .take(visible)
        .map(qp_cells)
        .collect();
    let mut widths = QP_COLUMNS.map(width_of);
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(width_of(cell));
        }
    }
    let shown = fit_columns(&widths, area.width, &[], &QP_DROP_ORDER);
    let header = Row::new(shown.iter().map(|&i| aligned(QP_COLUMNS[i], QP_RIGHT[i])))
        .style(Style::default().add_modifier(Modifier::REVERSED));
    let rows: Vec<Row> = cells
        .iter()
        .map(|row| Row::new(shown.iter().map(|&i| aligned(&row[i], QP_RIGHT[i]))))
        .collect();
    let constraints = shown.iter().map(|&i| Constraint::Length(widths[i]));
    let table = Table::new(rows, constraints)
        .header(header)
        .column_spacing(COLUMN_GAP);
    frame.render_widget(table, area);
    if cells.is_empty() && area.height > 1 {
        let note = match state.qp_table() {
            QpTable::Answered(a) if a.document.qps.is_empty() => {
                "the agent's QP table is empty: no RDMA device or no QP on its host"
            }
            QpTable::Answered(_) if state.hardware_qp_count() > 0 => "no QP matches the filter",
            QpTable::Answered(_) => {
                "no hardware-only QPs: every QP of the table was seen on the wire"
            }
            QpTable::Absent => "the agent has no QP table (GET /qps)",
            QpTable::Failed(_) | QpTable::Unknown => "no QP table from the agent yet",
        };
        let below_header = Rect {
            y: area.y + 1,
            height: 1,
            ..area
        };
        frame.render_widget(Paragraph::new(note), below_header);
    }
}

/// One hardware-only QP's cells, in [`QP_COLUMNS`] order.
fn qp_cells(q: &Qp) -> [String; 8] {
    let dash = || "-".to_string();
    [
        match q.port {
            Some(p) => format!("{}/{p}", printable(&q.device)),
            None => printable(&q.device),
        },
        format!("{:#x}", q.lqpn),
        q.rqpn.map_or_else(dash, |r| format!("{r:#x}")),
        printable(&q.qp_type),
        printable(&q.state),
        printable(&owner_label(q.pid, q.comm.as_deref(), q.pod_uid.as_deref())),
        match (q.src, q.dst) {
            (Some(s), Some(d)) => format!("{s}→{d}"),
            _ => dash(),
        },
        q.counters.len().to_string(),
    ]
}

fn aligned(text: &str, right: bool) -> Cell<'static> {
    let line = Line::from(text.to_string());
    Cell::from(if right { line.right_aligned() } else { line })
}

fn width_of(s: &str) -> u16 {
    u16::try_from(s.chars().count()).unwrap_or(u16::MAX)
}

/// The columns (indices, in screen order) that fit in `width`, leaving out columns
/// in `empty_first` and then in `drop_order` until the rest fits.
fn fit_columns(
    widths: &[u16],
    width: u16,
    empty_first: &[usize],
    drop_order: &[usize],
) -> Vec<usize> {
    let mut shown: Vec<usize> = (0..widths.len()).collect();
    let total = |shown: &[usize]| -> u32 {
        let cells: u32 = shown
            .iter()
            .map(|&i| u32::from(widths.get(i).copied().unwrap_or(0)))
            .sum();
        let gaps = u32::from(COLUMN_GAP) * shown.len().saturating_sub(1) as u32;
        cells + gaps
    };
    for &drop in empty_first.iter().chain(drop_order) {
        if total(&shown) <= u32::from(width) {
            break;
        }
        shown.retain(|&i| i != drop);
    }
    shown
}

/// One flow's cells, in [`COLUMNS`] order.
fn cells(f: &Flow) -> [String; 19] {
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
        printable(&flow_owner(f.owner.as_ref())),
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
        f.rtt.map_or_else(
            || "-".to_string(),
            |r| crate::doc::table::round_trip(r.p99_us),
        ),
    ]
}

/// The keys on the left, or the filter prompt while it is open; on the right, the
/// filter in force, the order and which rows are shown (kept whole on a narrow
/// terminal, where the keys are cut instead).
fn draw_footer(frame: &mut Frame, area: Rect, state: &TopState) {
    let (key, reverse) = state.sort();
    let arrow = if reverse { '▲' } else { '▼' };
    let n = state.row_count();
    let what = match state.showing() {
        Rows::Flows => "flows",
        Rows::HardwareQps => "hardware-only QPs",
    };
    let position = if n == 0 {
        format!("no {what}")
    } else {
        let first = state.scroll().min(n.saturating_sub(state.page())) + 1;
        let last = (first - 1 + state.page()).min(n);
        format!("{what} {first}-{last} of {n}")
    };
    let mut status = format!("sort: {}{arrow}  {position}", key.label());
    if filtering(state) && !state.filter_prompt_open() {
        status = format!("filter \"{}\"  {status}", printable(state.filter()));
    }
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let mut keys = Vec::new();
    if state.filter_prompt_open() {
        keys.push(Span::styled("filter: ", bold));
        keys.push(Span::raw(printable(state.filter())));
        // The cursor: where the next character goes.
        keys.push(Span::styled(
            " ",
            Style::default().add_modifier(Modifier::REVERSED),
        ));
        keys.push(Span::raw("  "));
        for (k, what) in [("Enter", "keep"), ("Esc", "clear")] {
            keys.push(Span::styled(k, bold));
            keys.push(Span::raw(format!(" {what}  ")));
        }
    } else {
        for (k, what) in [
            ("q", "quit"),
            ("p", "problems"),
            ("c", "CE%"),
            ("n", "CNPs/s"),
            ("b", "bits/s"),
            ("r", "reverse"),
            ("/", "filter"),
            (
                "o",
                match state.showing() {
                    Rows::Flows => "hardware-only QPs",
                    Rows::HardwareQps => "flows",
                },
            ),
            ("↑↓ PgUp PgDn Home End", "scroll"),
        ] {
            if !keys.is_empty() {
                keys.push(Span::raw("  "));
            }
            keys.push(Span::styled(k, bold));
            keys.push(Span::raw(format!(" {what}")));
        }
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    use super::*;
    use crate::top::fetch::Snapshot;
    use crate::top::state::Command;
    use crate::top::tests::{document, flow, rates, state_with};

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
            qps: Err(String::new()),
        });
        let lines = screen(&mut s, 200, 14);
        assert!(lines[0].contains(": bad??]0;title?"), "{lines:?}");
    }

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

    /// The QP column of each table row on the screen (the header line is row 5; a
    /// flow row has an arrow between its addresses, the footer none).
    fn screen_qps(lines: &[String]) -> Vec<String> {
        lines
            .iter()
            .skip(6)
            .filter(|l| l.contains('→'))
            .filter_map(|l| l.split_whitespace().find(|w| w.starts_with("0x")))
            .map(String::from)
            .collect()
    }

    #[test]
    fn round_trips_read_in_their_unit() {
        assert_eq!(crate::doc::table::round_trip(38.4), "38µs");
        assert_eq!(crate::doc::table::round_trip(1_049.0), "1.05ms");
        assert_eq!(crate::doc::table::round_trip(20_104.0), "20.10ms");
        assert_eq!(crate::doc::table::round_trip(2_500_000.0), "2.50s");
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
        assert_eq!(
            lines[4],
            "visibility: va kernel_path, eth2 offloaded; QPs 4, 2 hardware-only"
        );
        for col in [
            "iface",
            "src→dst",
            "qp",
            "owner",
            "pkts/s",
            "bits/s",
            "CE%",
            "CNPs/s",
            "NAK/RNR",
            "dscp",
            "RTT p99",
        ] {
            assert!(lines[5].contains(col), "{col}: {all}");
        }
        assert!(
            lines[6].starts_with("va/in  198.18.0.2→198.18.0.1"),
            "{all}"
        );
        assert_eq!(
            screen_qps(&lines),
            vec!["0x10", "0x20", "0x30", "0x40"],
            "{all}"
        );
        // No rates: every rate cell is "-", the totals are there.
        let words: Vec<&str> = lines[6].split_whitespace().collect();
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
                "-",
                "1000",
                "5",
                "100",
                "10/2",
                "0",
                "26",
                "-"
            ],
            "{all}"
        );
        assert!(
            lines[9].contains("198.19.0.1→198.19.0.2") && lines[9].contains("5001"),
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
        s.apply(Command::SortBy(SortKey::CeRatio));
        let lines = screen(&mut s, 200, 14);
        assert_eq!(screen_qps(&lines), vec!["0x20", "0x10", "0x30", "0x40"]);
        assert!(lines[5].contains("CE%▼"), "{}", lines[5]);
        s.apply(Command::Reverse);
        let lines = screen(&mut s, 200, 14);
        assert_eq!(screen_qps(&lines), vec!["0x30", "0x40", "0x10", "0x20"]);
        assert!(lines[5].contains("CE%▲"), "{}", lines[5]);
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
        let words: Vec<&str> = lines[6].split_whitespace().collect();
        assert_eq!(
            &words[4..12],
            ["0x10", "-", "1.00k", "10.3G", "250", "25.0", "40", "0"],
            "{all}"
        );
        // The other flows have none: "-".
        let words: Vec<&str> = lines[7].split_whitespace().collect();
        assert_eq!(
            &words[4..12],
            ["0x20", "-", "-", "-", "-", "-", "-", "-"],
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
            qps: Err("Connection refused (os error 111)".into()),
        });
        let lines = screen(&mut s, 120, 12);
        assert_eq!(
            lines[0],
            "agent not answering at 127.0.0.1:9: Connection refused (os error 111); retrying every 1s"
        );
        assert_eq!(lines[1], "frames: -");
        assert_eq!(lines[3], "audit: -");
        assert_eq!(lines[4], "visibility: -");
        assert!(
            lines[6].contains("no answer from the agent yet"),
            "{lines:?}"
        );

        // After an answer, a failure keeps the answer on screen and says how old it is.
        let mut s = state_with(document());
        s.update(Snapshot {
            at: SystemTime::now(),
            flows: Err("timed out".into()),
            findings: Err("timed out".into()),
            qps: Err("timed out".into()),
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
            qps: Ok(None),
        });
        let lines = screen(&mut s, 120, 12);
        assert!(lines[0].ends_with(", every 0.5s"), "{lines:?}");
        assert!(
            lines[3].starts_with("audit: - (127.0.0.1:9473 answered /findings"),
            "{lines:?}"
        );
        assert_eq!(lines[4], "visibility: - (the agent has no QP table)");
        assert!(lines[6].contains("no RoCE flows seen"), "{lines:?}");
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
    fn the_filter_prompt_the_filtered_rows_and_their_count_are_drawn() {
        let mut s = state_with(document());
        s.apply(Command::FilterOpen);
        let lines = screen(&mut s, 200, 14);
        let all = lines.join("\n");
        let footer = lines.last().unwrap();
        assert!(footer.starts_with("filter:"), "{all}");
        assert!(footer.contains("Enter keep  Esc clear"), "{all}");
        // An empty filter lets every flow through and says nothing of it.
        assert!(lines[1].ends_with("; flows 4"), "{all}");
        for c in "0x2".chars() {
            s.apply(Command::FilterPush(c));
        }
        let lines = screen(&mut s, 200, 14);
        let all = lines.join("\n");
        assert_eq!(
            lines[1],
            "frames: roce 2100, roce_in_vxlan 1000, parse errors 7; 1 of 4 flows match filter \"0x2\"",
            "{all}"
        );
        assert_eq!(screen_qps(&lines), vec!["0x20"], "{all}");
        let footer = lines.last().unwrap();
        assert!(footer.starts_with("filter: 0x2"), "{all}");
        assert!(footer.ends_with("sort: problems▼  flows 1-1 of 1"), "{all}");

        // Kept: the keys are back, the filter stays in the header and the footer.
        s.apply(Command::FilterKeep);
        let lines = screen(&mut s, 200, 14);
        let all = lines.join("\n");
        let footer = lines.last().unwrap();
        assert!(footer.contains("/ filter"), "{all}");
        assert!(
            footer.ends_with("filter \"0x2\"  sort: problems▼  flows 1-1 of 1"),
            "{all}"
        );
        assert!(
            lines[1].ends_with("1 of 4 flows match filter \"0x2\""),
            "{all}"
        );

        // A filter nothing matches says so, not that there are no flows.
        s.apply(Command::FilterOpen);
        s.apply(Command::FilterPush('z'));
        let lines = screen(&mut s, 200, 14);
        assert!(lines[6].contains("no flow matches the filter"), "{lines:?}");
        assert!(
            lines[1].ends_with("0 of 4 flows match filter \"0x2z\""),
            "{lines:?}"
        );

        // Cleared: every flow, and the plain count.
        s.apply(Command::FilterClear);
        let lines = screen(&mut s, 200, 14);
        assert!(lines[1].ends_with("; flows 4"), "{lines:?}");
        assert_eq!(screen_qps(&lines).len(), 4, "{lines:?}");
        assert!(lines.last().unwrap().starts_with("q quit"), "{lines:?}");
    }

    #[test]
    fn flows_show_the_owner_of_their_qp() {
        use crate::doc::qp::QpOwner;
        let mut doc = document();
        let owner = |comm: &str, pod: Option<&str>| QpOwner {
            device: "rxe0".into(),
            lqpn: 0x10,
            pid: Some(577),
            comm: Some(comm.into()),
            cgroup: None,
            pod_uid: pod.map(String::from),
            container_id: None,
        };
        for f in &mut doc.flows {
            match f.dest_qp {
                0x10 => f.owner = Some(owner("ib_write_bw", None)),
                0x20 => f.owner = Some(owner("nccl", Some("0f3c2a7e-1111-2222-3333-444455556666"))),
                _ => {}
            }
        }
        let mut s = state_with(doc);
        let lines = screen(&mut s, 200, 14);
        let all = lines.join("\n");
        let row = |qp: &str| -> Vec<String> {
            lines
                .iter()
                .find(|l| l.contains(&format!(" {qp} ")))
                .map(|l| l.split_whitespace().map(String::from).collect())
                .unwrap_or_default()
        };
        assert_eq!(row("0x10")[5], "ib_write_bw", "{all}");
        assert_eq!(&row("0x20")[5..8], ["nccl", "pod", "0f3c2a7e"], "{all}");
        assert_eq!(row("0x30")[5], "-", "{all}");
        // The filter finds flows by their owner.
        s.apply(Command::FilterOpen);
        for c in "nccl".chars() {
            s.apply(Command::FilterPush(c));
        }
        let lines = screen(&mut s, 200, 14);
        assert_eq!(screen_qps(&lines), vec!["0x20"], "{lines:?}");
    }

    #[test]
    fn o_shows_the_hardware_only_qps_and_back() {
        let mut s = state_with(document());
        s.apply(Command::ToggleQps);
        let lines = screen(&mut s, 200, 14);
        let all = lines.join("\n");
        assert_eq!(
            lines[5],
            "device/port  lqpn  rqpn  type  state  owner              src→dst  hw counters",
            "{all}"
        );
        // The QPs no flow was joined to, by device: not the one seen, not the gone one.
        assert_eq!(
            lines[6],
            "mlx5_0/1     0x2a  0x2b  RC    RTS    nccl pod 0f3c2a7e  -                  1",
            "{all}"
        );
        assert_eq!(
            lines[7],
            "rxe0/1       0x11  0x12  RC    RTS    ib_write_bw        -                  0",
            "{all}"
        );
        assert_eq!(lines[8], "", "{all}");
        let footer = lines.last().unwrap();
        assert!(footer.contains("o flows"), "{all}");
        assert!(
            footer.ends_with("sort: problems▼  hardware-only QPs 1-2 of 2"),
            "{all}"
        );
        // The filter applies to the QPs: by owner, pod, QPN.
        for (text, want) in [
            ("nccl", 1),
            ("0f3c2a7e", 1),
            ("0x11", 1),
            ("17", 1),
            ("rc", 2),
        ] {
            s.apply(Command::FilterOpen);
            for c in text.chars() {
                s.apply(Command::FilterPush(c));
            }
            assert_eq!(s.row_count(), want, "{text}");
            s.apply(Command::FilterClear);
        }
        s.apply(Command::FilterOpen);
        s.apply(Command::FilterPush('z'));
        let lines = screen(&mut s, 200, 14);
        assert!(lines[6].contains("no QP matches the filter"), "{lines:?}");
        s.apply(Command::FilterClear);
        s.apply(Command::ToggleQps);
        let lines = screen(&mut s, 200, 14);
        assert_eq!(screen_qps(&lines).len(), 4, "{lines:?}");
        assert!(lines.last().unwrap().contains("o hardware-only QPs"));
    }

    #[test]
    fn an_empty_qp_table_says_so_in_the_qp_view() {
        let mut s = state_with(document());
        s.update(Snapshot {
            qps: Ok(Some(crate::api::server::QpAnswer::default())),
            ..crate::top::tests::answered(document())
        });
        s.apply(Command::ToggleQps);
        let lines = screen(&mut s, 200, 14);
        assert_eq!(lines[4], "visibility: -; QPs 0, 0 hardware-only");
        assert!(
            lines[6].contains("the agent's QP table is empty: no RDMA device or no QP on its host"),
            "{lines:?}"
        );
    }

    #[test]
    fn an_agent_without_a_qp_table_says_so_in_the_qp_view() {
        let mut s = state_with(document());
        s.update(Snapshot {
            qps: Ok(None),
            ..crate::top::tests::answered(document())
        });
        s.apply(Command::ToggleQps);
        let lines = screen(&mut s, 200, 14);
        assert_eq!(lines[4], "visibility: - (the agent has no QP table)");
        assert!(
            lines[6].contains("the agent has no QP table (GET /qps)"),
            "{lines:?}"
        );
        assert!(lines.last().unwrap().ends_with("no hardware-only QPs"));
    }

    #[test]
    fn scrolled_view_shows_later_rows() {
        let mut doc = document();
        for i in 0..20 {
            doc.flows.push(flow("198.18.1.1", 0x100 + i));
        }
        let mut s = state_with(doc);
        screen(&mut s, 200, 14); // sets the page: 14 - 5 header - 1 table header - 1 footer
        s.apply(Command::PageDown);
        let lines = screen(&mut s, 200, 14);
        assert_eq!(screen_qps(&lines)[0], "0x103", "{lines:?}");
        assert!(
            lines.last().unwrap().ends_with("flows 8-14 of 24"),
            "{lines:?}"
        );
    }
}
