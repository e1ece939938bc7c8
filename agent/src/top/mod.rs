//! `roce-agent top`: a live terminal view of a running agent's flows (`GET /flows`),
//! of its host audit (`GET /findings`) and of its QP table (`GET /qps`: the owner of
//! each flow, the QPs never seen on the wire, what the agent sees of RoCE on each
//! interface), refreshed every interval.
//!
//! One role a file, so that the model and the drawing are tested without a terminal:
//! - [`fetch`]: asking the agent, one [`Snapshot`] a round, on a background thread;
//! - [`state`]: the model, [`TopState`]: answers and commands in, sorted rows and
//!   the scroll position out;
//! - [`draw`]: one frame of a [`TopState`] on any ratatui backend;
//! - [`input`]: what each key asks ([`Action`]) and the terminal the keys come from;
//! - [`terminal`]: raw mode and the alternate screen taken and given back, and the
//!   signals that stop the view;
//! - [`text`]: how numbers, times and network text are written;
//! - this file: [`top`], the loop that ties them: answers
//!   into the state, a frame drawn, keys read, until `q`, a signal or a hang-up.

pub mod draw;
pub mod fetch;
pub mod input;
pub mod state;
pub mod terminal;
pub mod text;

use std::io::IsTerminal as _;
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use crossterm::event::{self, Event};
use ratatui::backend::CrosstermBackend;
use ratatui::Terminal;

use crate::api::client::Client;
use fetch::Snapshot;
use input::{Action, Keyboard};
use state::TopState;
use terminal::{stop_on_signals, stop_requested, TerminalGuard};

/// How often the view looks for keys, answers and signals.
const TICK: Duration = Duration::from_millis(100);
/// Runs the view of the agent of `client`, asking it every `interval`, until `q`, a
/// signal or a hang-up.
pub fn top(client: Client, interval: Duration) -> anyhow::Result<()> {
    if !std::io::stdout().is_terminal() {
        bail!("top draws on a terminal and stdout is not one; `roce-agent flows` prints the table once");
    }
    let (tx, answers) = mpsc::channel();
    let api = client.addr().to_string();
    fetch::spawn_fetcher(client, interval, tx).context("starting the fetch thread")?;
    let mut state = TopState::new(api, interval);
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
                state.set_page(draw::page_rows(frame.area()));
                draw::draw(frame, state);
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
                match input::action(key, state.filter_prompt_open()) {
                    Action::Quit => return Ok(()),
                    Action::Apply(command) => state.apply(command),
                    Action::Continue => {}
                }
            }
        }
        if stop_requested() {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    //! The interval's parse, and the fixtures the tests of `state` and `draw` share.

    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::api::server::{InterfaceVisibility, QpAnswer};
    use crate::doc::finding::{Finding, Findings, Severity};
    use crate::doc::qp::{Qp, QpDocument};
    use crate::doc::{test_flow, Counters, Document, Ecn, Flow, Rates};

    pub(super) fn flow(src: &str, qp: u32) -> Flow {
        Flow {
            packets: 1000,
            bytes: 1_284_000,
            ecn: Ecn {
                ect0: 1000,
                ..Default::default()
            },
            ..test_flow("va", src, "198.18.0.1", qp)
        }
    }

    pub(super) fn with_ce(mut f: Flow, ce: u64) -> Flow {
        f.ecn.ce = ce;
        f.ecn.ect0 = f.packets - ce;
        f
    }

    pub(super) fn rates(ce_ratio: f64, cnps_per_s: f64, bits_per_s: f64) -> Option<Rates> {
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
    pub(super) fn document() -> Document {
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

    pub(super) fn findings() -> Findings {
        let f = |severity| Finding {
            check: "mtu".into(),
            interface: Some("va".into()),
            severity,
            found: "MTU 1500".into(),
            expected: "MTU >= 4192".into(),
            fix: "ip link set dev va mtu 4192".into(),
            flows: None,
            flow_keys: Vec::new(),
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

    /// A QP of rxe0 port 1 on `va`, RC, RTS, owned by ib_write_bw[577].
    pub(super) fn qp(lqpn: u32) -> Qp {
        Qp {
            device: "rxe0".into(),
            port: Some(1),
            lqpn,
            rqpn: Some(lqpn + 1),
            qp_type: "RC".into(),
            state: "RTS".into(),
            sq_psn: Some(0),
            rq_psn: Some(0),
            pid: Some(577),
            comm: Some("ib_write_bw".into()),
            cgroup: None,
            pod_uid: None,
            container_id: None,
            src: None,
            dst: None,
            counters: Default::default(),
            counter_id: None,
            seen_on_wire: false,
            netdev: Some("va".into()),
            src_port: None,
            dst_port: None,
            gone: false,
            wire: None,
        }
    }

    /// The QP table: 0x10 seen on the wire; 0x2a of mlx5_0 in a pod and 0x11 of rxe0
    /// not (hardware-only); 0x12 gone. `va` is on the kernel path.
    pub(super) fn qp_answer() -> QpAnswer {
        let mut seen = qp(0x10);
        seen.seen_on_wire = true;
        let mut offloaded = qp(0x2a);
        offloaded.device = "mlx5_0".into();
        offloaded.comm = Some("nccl".into());
        offloaded.pid = Some(900);
        offloaded.pod_uid = Some("0f3c2a7e-1111-2222-3333-444455556666".into());
        offloaded.counters.insert("rx_write_requests".into(), 3);
        let mut gone = qp(0x12);
        gone.gone = true;
        QpAnswer {
            document: QpDocument {
                qps: vec![offloaded, gone, seen, qp(0x11)],
                ports: Vec::new(),
                error: None,
            },
            visibility: vec![
                InterfaceVisibility {
                    ifname: "va".into(),
                    mode: "kernel_path".into(),
                },
                InterfaceVisibility {
                    ifname: "eth2".into(),
                    mode: "offloaded".into(),
                },
            ],
        }
    }

    pub(super) fn answered(doc: Document) -> Snapshot {
        Snapshot {
            at: SystemTime::now(),
            flows: Ok(doc),
            findings: Ok(findings()),
            qps: Ok(Some(qp_answer())),
        }
    }

    pub(super) fn state_with(doc: Document) -> TopState {
        let mut s = TopState::new("127.0.0.1:9473", Duration::from_secs(1));
        s.update(answered(doc));
        s
    }

    pub(super) fn qps(s: &TopState) -> Vec<u32> {
        s.rows().map(|f| f.dest_qp).collect()
    }
}
