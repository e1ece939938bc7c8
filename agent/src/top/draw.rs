//! The drawing: one frame of a [`TopState`] on any ratatui backend, in three parts —
//! the header (the agent's status, frame counters and the flows the filter lets
//! through, rate totals, the audit), the flow table (columns left out on a narrow
//! terminal) and the footer (keys or the filter prompt, filter, order, rows shown).
//! Reads the state, never changes it.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Table};
use ratatui::Frame;

use crate::doc::{Direction, Document, Flow};

use super::state::{SortKey, TopState};
use super::text::{clock, count, plural, printable, seconds, si};

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

    vec![status, Line::from(counters), Line::from(rates), audit]
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
    let visible = usize::from(area.height.saturating_sub(1));
    let first = state
        .scroll()
        .min(state.row_count().saturating_sub(visible));
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

/// The keys on the left, or the filter prompt while it is open; on the right, the
/// filter in force, the order and which rows are shown (kept whole on a narrow
/// terminal, where the keys are cut instead).
fn draw_footer(frame: &mut Frame, area: Rect, state: &TopState) {
    let (key, reverse) = state.sort();
    let arrow = if reverse { '▲' } else { '▼' };
    let n = state.row_count();
    let position = if n == 0 {
        "no flows".to_string()
    } else {
        let first = state.scroll().min(n.saturating_sub(state.page())) + 1;
        let last = (first - 1 + state.page()).min(n);
        format!("flows {first}-{last} of {n}")
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

    /// The QP column of each table row on the screen (the header line is row 4; a
    /// flow row has an arrow between its addresses, the footer none).
    fn screen_qps(lines: &[String]) -> Vec<String> {
        lines
            .iter()
            .skip(5)
            .filter(|l| l.contains('→'))
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
        s.apply(Command::SortBy(SortKey::CeRatio));
        let lines = screen(&mut s, 200, 14);
        assert_eq!(screen_qps(&lines), vec!["0x20", "0x10", "0x30", "0x40"]);
        assert!(lines[4].contains("CE%▼"), "{}", lines[4]);
        s.apply(Command::Reverse);
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
        assert!(lines[5].contains("no flow matches the filter"), "{lines:?}");
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
    fn scrolled_view_shows_later_rows() {
        let mut doc = document();
        for i in 0..20 {
            doc.flows.push(flow("198.18.1.1", 0x100 + i));
        }
        let mut s = state_with(doc);
        screen(&mut s, 200, 14); // sets the page: 14 - 4 header - 1 table header - 1 footer
        s.apply(Command::PageDown);
        let lines = screen(&mut s, 200, 14);
        assert_eq!(screen_qps(&lines)[0], "0x104", "{lines:?}");
        assert!(
            lines.last().unwrap().ends_with("flows 9-16 of 24"),
            "{lines:?}"
        );
    }
}
