//! The view's model, [`TopState`]: the agent's last answers in (a [`Snapshot`]),
//! [`Command`]s from the user in, the rows the filter lets through, sorted, and the
//! scroll position out. The rows are the flows, or (key `o`) the hardware-only QPs:
//! those of the agent's QP table that no flow was joined to. Pure: no terminal, no
//! network, no clock, so every rule of the order and of the filter is tested here.

use std::time::{Duration, SystemTime};

use crate::api::server::QpAnswer;
use crate::doc::finding::{Findings, Severity};
use crate::doc::qp::{Qp, QpOwner};
use crate::doc::{Document, Flow};

use super::fetch::Snapshot;

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
    /// How the footer names the order.
    pub fn label(self) -> &'static str {
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

/// What the user can ask of the model (the keys that mean each are in `input`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Sort by this key, from the top.
    SortBy(SortKey),
    /// Reverse the order, from the top.
    Reverse,
    /// Scroll one row up or down.
    Up,
    Down,
    /// Scroll one page up or down.
    PageUp,
    PageDown,
    /// The first or the last page.
    First,
    Last,
    /// Open the filter prompt, with the filter in force to edit (`/`).
    FilterOpen,
    /// Type a character at the end of the filter.
    FilterPush(char),
    /// Delete the filter's last character.
    FilterPop,
    /// Close the prompt and keep the filter.
    FilterKeep,
    /// Close the prompt and clear the filter.
    FilterClear,
    /// Show the hardware-only QPs instead of the flows, or the flows again (`o`).
    ToggleQps,
}

/// What the table shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rows {
    Flows,
    /// The QPs of the table that were not seen on the wire (offloaded or idle).
    HardwareQps,
}

/// The agent's QP table as the view last got it.
#[derive(Clone, Debug, PartialEq)]
pub enum QpTable {
    /// Not asked yet.
    Unknown,
    /// The agent has no `/qps` (an older agent).
    Absent,
    Failed(String),
    Answered(QpAnswer),
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
    /// What the rows must show (see [`matches`]); empty: every flow.
    filter: String,
    /// The filter prompt is open: typed characters go into `filter`.
    prompt: bool,
    /// Indices into `doc.flows` of the flows the filter lets through, in display
    /// order (filtered and sorted once per answer or key, not once per frame); in
    /// the QP view, indices into the table's QPs.
    order: Vec<usize>,
    /// The last QP table, kept like the flows when a round fails.
    qps: QpTable,
    rows: Rows,
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
            filter: String::new(),
            prompt: false,
            order: Vec::new(),
            qps: QpTable::Unknown,
            rows: Rows::Flows,
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
                self.qps = match snap.qps {
                    Ok(Some(answer)) => QpTable::Answered(answer),
                    Ok(None) => QpTable::Absent,
                    Err(e) => QpTable::Failed(e),
                };
                self.resort();
            }
            // The audit counts of the last answer stay: they are as old as the flows.
            Err(e) => self.error = Some(e),
        }
        self.clamp_scroll();
    }

    /// Does what the user asked.
    pub fn apply(&mut self, command: Command) {
        match command {
            Command::SortBy(key) => self.sort_by(key),
            Command::Reverse => {
                self.reverse = !self.reverse;
                self.resort();
                self.scroll = 0;
            }
            Command::Up => self.scroll = self.scroll.saturating_sub(1),
            Command::Down => self.scroll = self.scroll.saturating_add(1),
            Command::PageUp => self.scroll = self.scroll.saturating_sub(self.page),
            Command::PageDown => self.scroll = self.scroll.saturating_add(self.page),
            Command::First => self.scroll = 0,
            Command::Last => self.scroll = self.max_scroll(),
            Command::FilterOpen => self.prompt = true,
            Command::FilterPush(c) => {
                // Only printable text: what is typed is drawn back on the terminal.
                if !c.is_control() {
                    self.filter.push(c);
                    self.refilter();
                }
            }
            Command::FilterPop => {
                if self.filter.pop().is_some() {
                    self.refilter();
                }
            }
            Command::FilterKeep => {
                self.prompt = false;
                // An emptied filter is no filter.
                if self.filter.trim().is_empty() && !self.filter.is_empty() {
                    self.filter.clear();
                    self.refilter();
                }
            }
            Command::FilterClear => {
                self.prompt = false;
                if !self.filter.is_empty() {
                    self.filter.clear();
                    self.refilter();
                }
            }
            Command::ToggleQps => {
                self.rows = match self.rows {
                    Rows::Flows => Rows::HardwareQps,
                    Rows::HardwareQps => Rows::Flows,
                };
                self.refilter();
            }
        }
        self.clamp_scroll();
    }

    /// How many rows fit in the table (see [`super::draw::page_rows`]).
    pub fn set_page(&mut self, rows: usize) {
        self.page = rows.max(1);
        self.clamp_scroll();
    }

    /// The flows in display order (none in the QP view).
    pub fn rows(&self) -> impl Iterator<Item = &Flow> + '_ {
        let flows = match self.rows {
            Rows::Flows => self.doc.as_ref().map_or(&[][..], |d| &d.flows[..]),
            Rows::HardwareQps => &[][..],
        };
        self.order.iter().filter_map(move |&i| flows.get(i))
    }

    /// The hardware-only QPs in display order (none in the flow view).
    pub fn qp_rows(&self) -> impl Iterator<Item = &Qp> + '_ {
        let qps = match self.rows {
            Rows::HardwareQps => self.qp_answer().map_or(&[][..], |a| &a.document.qps[..]),
            Rows::Flows => &[][..],
        };
        self.order.iter().filter_map(move |&i| qps.get(i))
    }

    /// What the table shows.
    pub fn showing(&self) -> Rows {
        self.rows
    }

    /// The agent's QP table as last answered.
    pub fn qp_table(&self) -> &QpTable {
        &self.qps
    }

    fn qp_answer(&self) -> Option<&QpAnswer> {
        match &self.qps {
            QpTable::Answered(a) => Some(a),
            _ => None,
        }
    }

    /// QPs of the table no flow was joined to.
    pub fn hardware_qp_count(&self) -> usize {
        self.qp_answer().map_or(0, |a| {
            a.document.qps.iter().filter(|q| hardware_only(q)).count()
        })
    }

    /// Rows the filter lets through.
    pub fn row_count(&self) -> usize {
        self.order.len()
    }

    /// Flows in the last answer, filtered or not.
    pub fn flow_count(&self) -> usize {
        self.doc.as_ref().map_or(0, |d| d.flows.len())
    }

    /// The filter as typed; empty when there is none.
    pub fn filter(&self) -> &str {
        &self.filter
    }

    /// Whether the filter prompt is open (keys are typed into the filter).
    pub fn filter_prompt_open(&self) -> bool {
        self.prompt
    }

    /// Index of the first row shown.
    pub fn scroll(&self) -> usize {
        self.scroll
    }

    /// Rows the table shows at once.
    pub fn page(&self) -> usize {
        self.page
    }

    /// The order: its key, and whether it is reversed.
    pub fn sort(&self) -> (SortKey, bool) {
        (self.sort, self.reverse)
    }

    /// The agent's address, as the user gave it.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// How often the agent is asked.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// The last flow document the agent answered.
    pub fn document(&self) -> Option<&Document> {
        self.doc.as_ref()
    }

    /// When the agent last answered.
    pub fn answered_at(&self) -> Option<SystemTime> {
        self.answered_at
    }

    /// Why the last round failed; None when it succeeded.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// The last findings counted, or why `/findings` failed while `/flows` answered;
    /// None before the first answer.
    pub fn audit(&self) -> Option<&Result<AuditCounts, String>> {
        self.audit.as_ref()
    }

    fn sort_by(&mut self, key: SortKey) {
        self.sort = key;
        self.resort();
        // A new order starts at its top.
        self.scroll = 0;
    }

    /// The filter changed: the rows it lets through, from the top.
    fn refilter(&mut self) {
        self.resort();
        self.scroll = 0;
    }

    fn resort(&mut self) {
        if self.rows == Rows::HardwareQps {
            self.order = self.qp_order();
            return;
        }
        let Some(doc) = &self.doc else {
            self.order.clear();
            return;
        };
        let (key, reverse) = (self.sort, self.reverse);
        let needle = self.filter.trim().to_ascii_lowercase();
        let mut text = String::new();
        let mut order: Vec<usize> = (0..doc.flows.len())
            .filter(|&i| needle.is_empty() || matches(&doc.flows[i], &needle, &mut text))
            .collect();
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

    /// The hardware-only QPs the filter lets through, by device, port and local QPN.
    fn qp_order(&self) -> Vec<usize> {
        let Some(answer) = self.qp_answer() else {
            return Vec::new();
        };
        let qps = &answer.document.qps;
        let needle = self.filter.trim().to_ascii_lowercase();
        let mut text = String::new();
        let mut order: Vec<usize> = (0..qps.len())
            .filter(|&i| {
                hardware_only(&qps[i])
                    && (needle.is_empty() || qp_matches(&qps[i], &needle, &mut text))
            })
            .collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (&qps[a], &qps[b]);
            (&a.device, a.port, a.lqpn).cmp(&(&b.device, b.port, b.lqpn))
        });
        order
    }

    fn max_scroll(&self) -> usize {
        self.order.len().saturating_sub(self.page)
    }

    fn clamp_scroll(&mut self) {
        self.scroll = self.scroll.min(self.max_scroll());
    }
}

/// A QP of the table that no flow was joined to: its packets never crossed XDP or tc
/// (an RNIC that offloads RoCE), or it sent nothing; gone QPs are left out.
pub fn hardware_only(q: &Qp) -> bool {
    !q.seen_on_wire && !q.gone
}

/// How the view names an owner: its command (`[PID]` without one), and the first 8
/// characters of its pod UID when it runs in a pod.
pub fn owner_label(pid: Option<u32>, comm: Option<&str>, pod_uid: Option<&str>) -> String {
    let mut s = match (comm, pid) {
        (Some(c), _) => c.to_string(),
        (None, Some(p)) => format!("[{p}]"),
        (None, None) => "-".to_string(),
    };
    if let Some(pod) = pod_uid {
        s.push_str(" pod ");
        s.extend(pod.chars().take(8));
    }
    s
}

/// [`owner_label`] of a flow's owner.
pub fn flow_owner(owner: Option<&QpOwner>) -> String {
    owner.map_or_else(
        || "-".to_string(),
        |o| owner_label(o.pid, o.comm.as_deref(), o.pod_uid.as_deref()),
    )
}

/// Whether a QP's row shows `needle` (lowercase, not empty): its device, QPNs (hex
/// and decimal), type, state, owner, pod UID and addresses.
pub fn qp_matches(q: &Qp, needle: &str, text: &mut String) -> bool {
    use std::fmt::Write as _;
    text.clear();
    let _ = writeln!(text, "{}", q.device);
    let _ = writeln!(text, "{:#x}\n{}", q.lqpn, q.lqpn);
    if let Some(r) = q.rqpn {
        let _ = writeln!(text, "{r:#x}\n{r}");
    }
    let _ = writeln!(text, "{}\n{}", q.qp_type, q.state);
    let _ = writeln!(
        text,
        "{}",
        owner_label(q.pid, q.comm.as_deref(), q.pod_uid.as_deref())
    );
    if let Some(pod) = &q.pod_uid {
        let _ = writeln!(text, "{pod}");
    }
    if let (Some(s), Some(d)) = (q.src, q.dst) {
        let _ = writeln!(text, "{s}→{d}");
    }
    text.make_ascii_lowercase();
    text.contains(needle)
}

/// Whether a flow's row shows `needle` (lowercase, not empty): its interface as the
/// row names it (`va/in`), its outer and inner addresses (each, and as `src→dst`),
/// its VNI, its QP in hex (`0x1a`) and in decimal (`26`), its owner. `text` is room to
/// write them in, reused from one flow to the next.
pub fn matches(f: &Flow, needle: &str, text: &mut String) -> bool {
    use std::fmt::Write as _;
    text.clear();
    // One line per field: a needle (typed on one line) never spans two.
    if let Some(name) = &f.ifname {
        let dir = match f.direction {
            Some(crate::doc::Direction::Ingress) => "/in",
            Some(crate::doc::Direction::Egress) => "/out",
            None => "",
        };
        let _ = writeln!(text, "{name}{dir}");
    }
    let _ = writeln!(text, "{}→{}", f.src, f.dst);
    if let Some(vni) = f.vni {
        let _ = writeln!(text, "{vni}");
    }
    if let (Some(s), Some(d)) = (f.inner_src, f.inner_dst) {
        let _ = writeln!(text, "{s}→{d}");
    }
    let _ = writeln!(text, "{:#x}\n{}", f.dest_qp, f.dest_qp);
    if let Some(o) = &f.owner {
        let _ = write!(text, "{}", flow_owner(Some(o)));
    }
    text.make_ascii_lowercase();
    text.contains(needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::tests::{answered, document, flow, qps, rates, state_with};
    use Command::{Down, First, Last, PageDown, PageUp, Reverse, SortBy, Up};

    #[test]
    fn problems_first_by_default() {
        let s = state_with(document());
        assert_eq!(s.sort(), (SortKey::Problems, false));
        assert_eq!(qps(&s), vec![0x10, 0x20, 0x30, 0x40]);
    }

    #[test]
    fn sort_keys_and_reverse_change_the_order() {
        let mut s = state_with(document());
        s.apply(SortBy(SortKey::CeRatio));
        assert_eq!(qps(&s), vec![0x20, 0x10, 0x30, 0x40]);
        s.apply(SortBy(SortKey::Bitrate));
        assert_eq!(qps(&s), vec![0x40, 0x30, 0x10, 0x20]);
        s.apply(SortBy(SortKey::CnpRate));
        // 0x10 has CNPs; the rest tie and keep the document's order (by source).
        assert_eq!(qps(&s), vec![0x10, 0x20, 0x30, 0x40]);
        s.apply(Reverse);
        assert_eq!(s.sort(), (SortKey::CnpRate, true));
        assert_eq!(qps(&s), vec![0x20, 0x30, 0x40, 0x10]);
        s.apply(SortBy(SortKey::Problems));
        assert_eq!(qps(&s), vec![0x40, 0x30, 0x20, 0x10]);
        s.apply(Reverse);
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
        s.apply(SortBy(SortKey::Bitrate));
        assert_eq!(qps(&s)[0], 0x40);
        s.apply(SortBy(SortKey::CeRatio));
        assert_eq!(qps(&s), vec![0x40, 0x20, 0x10, 0x30]);
    }

    #[test]
    fn scrolling_stays_within_the_rows() {
        let mut doc = document();
        for i in 0..20 {
            doc.flows.push(flow("198.18.1.1", 0x100 + i));
        }
        let mut s = state_with(doc);
        s.set_page(10);
        s.apply(Up);
        assert_eq!(s.scroll(), 0);
        s.apply(Down);
        assert_eq!(s.scroll(), 1);
        s.apply(PageDown);
        assert_eq!(s.scroll(), 11);
        s.apply(PageDown);
        assert_eq!(s.scroll(), 14, "24 rows, 10 shown");
        s.apply(PageUp);
        assert_eq!(s.scroll(), 4);
        s.apply(Last);
        assert_eq!(s.scroll(), 14);
        s.apply(First);
        assert_eq!(s.scroll(), 0);
        s.apply(Last);
        // Fewer flows in the next answer: the view stays on a full page.
        s.update(answered(document()));
        assert_eq!(s.scroll(), 0);
        // A new sort starts at the top.
        s.set_page(2);
        s.apply(Last);
        assert_eq!(s.scroll(), 2);
        s.apply(SortBy(SortKey::CeRatio));
        assert_eq!(s.scroll(), 0);
    }

    /// Opens the prompt and types `text` into it.
    fn type_filter(s: &mut TopState, text: &str) {
        s.apply(Command::FilterOpen);
        for c in text.chars() {
            s.apply(Command::FilterPush(c));
        }
    }

    #[test]
    fn the_filter_keeps_the_rows_that_show_its_text() {
        let mut doc = document();
        doc.flows[0].ifname = Some("Eth7".into());
        doc.flows[0].direction = Some(crate::doc::Direction::Egress);
        let mut s = state_with(doc);
        assert_eq!((s.row_count(), s.flow_count()), (4, 4));
        for (text, want) in [
            // QP in hex, with or without 0x, any case; and in decimal (0x20 = 32).
            ("0x20", vec![0x20]),
            ("0X2", vec![0x20]),
            ("32", vec![0x20]),
            // Addresses: outer, inner, as the row writes them.
            ("198.18.0.3", vec![0x20]),
            ("198.18.0.3→198.18.0.1", vec![0x20]),
            ("198.19.0.2", vec![0x40]),
            ("198.18.0.1", vec![0x10, 0x20, 0x30, 0x40]),
            // VNI, interface as the row names it.
            ("5001", vec![0x40]),
            ("eth7/out", vec![0x40]),
            ("va/in", vec![0x10, 0x20, 0x30]),
            ("nothing like it", vec![]),
        ] {
            type_filter(&mut s, text);
            assert!(s.filter_prompt_open());
            assert_eq!(qps(&s), want, "{text:?}");
            assert_eq!(s.flow_count(), 4);
            s.apply(Command::FilterClear);
            assert_eq!(s.filter(), "");
            assert_eq!(qps(&s), vec![0x10, 0x20, 0x30, 0x40]);
        }
    }

    #[test]
    fn enter_keeps_the_filter_esc_clears_it_and_it_outlives_answers_and_sorts() {
        let mut s = state_with(document());
        type_filter(&mut s, "198.18.0.5x");
        assert_eq!(qps(&s), Vec::<u32>::new());
        s.apply(Command::FilterPop);
        assert_eq!(qps(&s), vec![0x40]);
        s.apply(Command::FilterKeep);
        assert!(!s.filter_prompt_open());
        assert_eq!(s.filter(), "198.18.0.5");
        // The next answer and another order are filtered too.
        s.update(answered(document()));
        assert_eq!(qps(&s), vec![0x40]);
        s.apply(SortBy(SortKey::CeRatio));
        assert_eq!(qps(&s), vec![0x40]);
        // `/` again edits the filter in force; Esc clears it.
        s.apply(Command::FilterOpen);
        assert_eq!(s.filter(), "198.18.0.5");
        s.apply(Command::FilterPop);
        assert_eq!(qps(&s), vec![0x20, 0x10, 0x30, 0x40]);
        s.apply(Command::FilterPush('5'));
        s.apply(Command::FilterClear);
        assert!(!s.filter_prompt_open());
        assert_eq!(s.filter(), "");
        assert_eq!(s.row_count(), 4);
        // Control characters are not typed; a blank filter kept is no filter.
        type_filter(&mut s, "\u{1b} ");
        assert_eq!(s.filter(), " ");
        assert_eq!(s.row_count(), 4);
        s.apply(Command::FilterKeep);
        assert_eq!(s.filter(), "");
    }

    #[test]
    fn a_new_filter_starts_at_the_top_and_scrolls_within_its_rows() {
        let mut doc = document();
        for i in 0..20 {
            doc.flows.push(flow("198.18.1.1", 0x100 + i));
        }
        let mut s = state_with(doc);
        s.set_page(5);
        s.apply(Last);
        assert_eq!(s.scroll(), 19);
        type_filter(&mut s, "198.18.1.1");
        assert_eq!((s.scroll(), s.row_count()), (0, 20));
        s.apply(Last);
        assert_eq!(s.scroll(), 15);
        s.apply(Command::FilterPush('x'));
        assert_eq!((s.scroll(), s.row_count()), (0, 0));
    }

    #[test]
    fn a_failed_round_keeps_the_last_answer() {
        let mut s = state_with(document());
        s.update(Snapshot {
            at: SystemTime::now(),
            flows: Err("Connection refused (os error 111)".into()),
            findings: Err("Connection refused (os error 111)".into()),
            qps: Err("Connection refused (os error 111)".into()),
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
}
