//! The QP table inside `run`: after every poll of the flow table, the host's QPs are
//! read from RDMA netlink and joined with the flows of that poll on a blocking thread
//! (netlink and /proc block; the join is a pass over every flow), and the result is
//! published for `GET /qps`, the owners of `GET /flows` and `/metrics`. The log says
//! what the agent sees of RoCE on each interface once the first interval is in, then
//! when that changes; a host without RDMA is said once, a table that cannot be read
//! when it starts and stops failing.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::watch;

use crate::rdma::{QpTable, QpTableOptions, RdmaError};
use crate::telemetry::live::LiveDocument;
use crate::telemetry::qps::{Change, Mode, QpRounds, QpView, TableRead, Watched};

/// Reads and joins the QP table again and again, remembering what it reported.
pub struct QpWatcher {
    table: QpTable,
    rounds: QpRounds,
    /// "No RDMA subsystem" was said.
    said_no_rdma: bool,
    /// The last failure, so a persisting one is logged once.
    failing: Option<String>,
}

impl QpWatcher {
    pub fn new(opts: QpTableOptions) -> QpWatcher {
        QpWatcher {
            table: QpTable::new(opts),
            rounds: QpRounds::default(),
            said_no_rdma: false,
            failing: None,
        }
    }

    /// One refresh joined with `flows`, what changed logged. Blocking.
    pub fn round(&mut self, flows: &LiveDocument, watched: &Watched) -> QpView {
        let start = Instant::now();
        let read = match self.table.refresh() {
            Ok(snapshot) => {
                if self.failing.take().is_some() {
                    tracing::info!("the QP table is read again");
                }
                TableRead::Read {
                    qps: snapshot.qps,
                    ports: snapshot.ports,
                }
            }
            Err(RdmaError::NoRdmaSubsystem) => {
                if !std::mem::replace(&mut self.said_no_rdma, true) {
                    tracing::info!(
                        "no RDMA devices (the kernel has no RDMA netlink: ib_core is not loaded): the QP table is empty"
                    );
                }
                TableRead::NoRdma
            }
            Err(e) => {
                let text = e.to_string();
                if self.failing.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "reading the QP table failed; GET /qps says why");
                    self.failing = Some(text.clone());
                }
                TableRead::Failed(text)
            }
        };
        let (view, changes) = self.rounds.round(read, flows, watched);
        log_visibility(&changes);
        tracing::debug!(
            qps = view.document.qps.len(),
            joined = view.counts.joined,
            ties = view.counts.ties,
            ambiguous = view.counts.ambiguous,
            elapsed = ?start.elapsed(),
            "QP table joined"
        );
        view
    }
}

fn log_visibility(changes: &[Change]) {
    for c in changes {
        let note = match c.now {
            Mode::KernelPath => "RoCE crosses the kernel's stack here: its flows are counted",
            Mode::Offloaded => "the RNIC moves RoCE here in hardware, past XDP and tc: no flows; `roce-agent qps` and the roce_rnic_* counters show it",
            Mode::Mirror => "a mirror collector: its flows are copies of other hosts' traffic",
            Mode::None => "no RoCE seen here yet",
        };
        match c.before {
            None => {
                tracing::info!(interface = %c.ifname, visibility = %c.now, note, "RoCE visibility")
            }
            Some(before) => {
                tracing::info!(interface = %c.ifname, visibility = %c.now, before = %before, note, "RoCE visibility changed")
            }
        }
    }
}

/// Refreshes the QP table after every poll of the flow table (the first was made by
/// the caller) and publishes the views, until the task is aborted or the flows'
/// sender goes. Each round runs on a blocking thread; a round slower than the
/// interval takes the newest poll next.
pub async fn every(
    watcher: QpWatcher,
    mut flows: watch::Receiver<Arc<LiveDocument>>,
    watched: watch::Receiver<Watched>,
    publish: watch::Sender<Arc<QpView>>,
) {
    let mut watcher = Some(watcher);
    loop {
        if flows.changed().await.is_err() {
            return;
        }
        let Some(mut w) = watcher.take() else { return };
        let doc = flows.borrow_and_update().clone();
        let interfaces = watched.borrow().clone();
        match tokio::task::spawn_blocking(move || {
            let view = w.round(&doc, &interfaces);
            (w, view)
        })
        .await
        {
            Ok((w, view)) => {
                publish.send_replace(Arc::new(view));
                watcher = Some(w);
            }
            Err(e) => {
                tracing::error!(error = %e, "the QP table task failed; GET /qps stays as it was");
                return;
            }
        }
    }
}
