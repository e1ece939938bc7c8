//! `roce-agent qps`: a running agent's QP table (`GET /qps`), as a table or its JSON.

use std::time::Duration;

use anyhow::Context as _;
use clap::Args;

use super::api_args::{api_help, ApiClientArgs};
use crate::api::client::ClientError;
use crate::api::server::QpAnswer;
use crate::doc::qp::Qp;

/// How long `qps` waits for the agent.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

/// The text after `roce-agent qps --help`'s options.
pub const AFTER_HELP: &str = concat!(
    "Examples:\n  \
    roce-agent qps\n  \
    roce-agent qps --json | jq '.qps[] | select(.seen_on_wire | not)'\n  \
    roce-agent qps --api :9474                          # the agent on this host, port 9474\n  \
    roce-agent qps --api https://agent1:9473 --ca-file ca.pem\n\n\
    One row per queue pair of the host's RDMA devices, as RDMA netlink lists them \
    (`rdma resource show qp`), read by the agent every interval: device/port, local and \
    remote QP numbers (hex), type, state, the owner (command[pid], or [kernel user] for a \
    QP the kernel made) and its pod UID, the rdma_cm addresses (src→dst, - when rdma_cm \
    did not make the QP), what the agent's XDP and tc programs counted of it (packets \
    sent/received), or, for a QP they never counted, \"offloaded\" when its interface is \
    (an RNIC that handles RoCE in hardware) and \"not seen\" otherwise (an idle QP, or one \
    on an interface the agent is not on), and how many per-QP hardware counters the \
    driver binds to it. The last lines name the RDMA ports with their netdevs and what \
    the agent sees of RoCE on each interface (kernel_path, offloaded, mirror, none). \
    --json prints the document as the agent served it, on one line. ",
    api_help!(),
    "\n\n\
    Exit status: 0 success (also when the agent could not read the table: it says why), \
    1 no agent answers (or an agent without a QP table, or its answer is not a QP table, \
    or it refuses the request), 2 usage error (an --api that is not an address, an \
    unreadable or invalid --ca-file, --cert-file, --key-file or --auth-file)."
);

#[derive(Debug, Args)]
pub struct QpsArgs {
    /// Print the JSON document exactly as the agent served it: one line
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub api: ApiClientArgs,
}

/// `roce-agent qps`.
pub fn qps(args: QpsArgs) -> anyhow::Result<()> {
    let client = args.api.client()?;
    let body = match client.get_body("/qps", CLIENT_TIMEOUT) {
        Ok(body) => body,
        Err(e @ ClientError::Status { status: 404, .. }) => {
            return Err(anyhow::Error::new(e).context(format!(
                "the agent at {} has no QP table (an older roce-agent)",
                client.addr()
            )))
        }
        Err(e) => return Err(e.into()),
    };
    let answer: QpAnswer = serde_json::from_slice(&body).with_context(|| {
        format!(
            "the answer of {} is not a roce-agent QP table",
            client.addr()
        )
    })?;
    let mut out = std::io::stdout().lock();
    use std::io::Write as _;
    let written = if args.json {
        out.write_all(&body).and_then(|()| {
            if body.last() != Some(&b'\n') {
                out.write_all(b"\n")
            } else {
                Ok(())
            }
        })
    } else {
        out.write_all(render(&answer).as_bytes())
    };
    match written.and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        // A closed pipe (`| head`) is not an error worth reporting.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(e).context("writing to stdout"),
    }
}

const HEADERS: [&str; 11] = [
    "device/port",
    "lqpn",
    "rqpn",
    "type",
    "state",
    "owner",
    "pod",
    "src→dst",
    "wire tx/rx pkts",
    "RTT p99",
    "hw counters",
];
/// Columns that hold numbers are right-aligned.
const RIGHT: [bool; 11] = [
    false, true, true, false, false, false, false, false, true, true, true,
];

/// The table of `answer`: one line per QP (by device, port, local QPN), then the
/// ports and the interfaces' visibility, each line ending in a newline.
pub fn render(answer: &QpAnswer) -> String {
    let doc = &answer.document;
    let mut out = String::new();
    if let Some(e) = &doc.error {
        out.push_str(&format!("the agent could not read the QP table: {e}\n"));
    }
    let mut qps: Vec<&Qp> = doc.qps.iter().collect();
    qps.sort_by(|a, b| (&a.device, a.port, a.lqpn).cmp(&(&b.device, b.port, b.lqpn)));
    if qps.is_empty() {
        if doc.error.is_none() {
            out.push_str(if doc.ports.is_empty() {
                "no queue pairs: no RDMA device on this host\n"
            } else {
                "no queue pairs\n"
            });
        }
    } else {
        let rows: Vec<[String; 11]> = qps.iter().map(|q| row(q, answer)).collect();
        out.push_str(&crate::doc::table::aligned(&HEADERS, &RIGHT, &rows));
    }
    let seen = doc.qps.iter().filter(|q| q.seen_on_wire).count();
    let offloaded = doc
        .qps
        .iter()
        .filter(|q| unseen(q, answer) == Some(OFFLOADED))
        .count();
    out.push_str(&format!(
        "qps {}: {} seen on the wire, {} offloaded, {} not seen",
        doc.qps.len(),
        seen,
        offloaded,
        doc.qps.len() - seen - offloaded
    ));
    if !doc.ports.is_empty() {
        let ports: Vec<String> = doc
            .ports
            .iter()
            .map(|p| {
                format!(
                    "{}/{} {}",
                    p.device,
                    p.port,
                    p.netdev.as_deref().unwrap_or("-")
                )
            })
            .collect();
        out.push_str(&format!("; ports: {}", ports.join(", ")));
    }
    out.push('\n');
    if !answer.visibility.is_empty() {
        let modes: Vec<String> = answer
            .visibility
            .iter()
            .map(|v| format!("{} {}", v.ifname, v.mode))
            .collect();
        out.push_str(&format!("visibility: {}\n", modes.join(", ")));
    }
    out
}

/// `ib_write_bw[577]`; `[ib_core]` for a QP the kernel made; `-` when unknown.
pub fn owner(pid: Option<u32>, comm: Option<&str>) -> String {
    match (pid, comm) {
        (Some(pid), Some(comm)) => format!("{comm}[{pid}]"),
        (Some(pid), None) => format!("[{pid}]"),
        (None, Some(comm)) => format!("[{comm}]"),
        (None, None) => "-".to_string(),
    }
}

const OFFLOADED: &str = "offloaded";
const NOT_SEEN: &str = "not seen";

/// What the wire column says of a QP that XDP and tc never counted: "offloaded" when
/// its netdev is an offloaded interface (the RNIC moves RoCE past the kernel's
/// stack), else "not seen" (an idle QP on an interface whose RoCE the agent does see,
/// or one on an interface it is not on). None for a QP seen on the wire.
fn unseen(q: &Qp, answer: &QpAnswer) -> Option<&'static str> {
    if q.seen_on_wire {
        return None;
    }
    let offloaded = answer
        .visibility
        .iter()
        .any(|v| q.netdev.as_deref() == Some(v.ifname.as_str()) && v.mode == OFFLOADED);
    Some(if offloaded { OFFLOADED } else { NOT_SEEN })
}

fn row(q: &Qp, answer: &QpAnswer) -> [String; 11] {
    let dash = || "-".to_string();
    let wire = match (&q.wire, unseen(q, answer)) {
        (Some(w), None) => format!("{}/{}", w.tx_packets, w.rx_packets),
        (_, label) => label.unwrap_or(NOT_SEEN).to_string(),
    };
    let state = if q.gone {
        format!("{} (gone)", q.state)
    } else {
        q.state.clone()
    };
    [
        match q.port {
            Some(p) => format!("{}/{p}", q.device),
            None => q.device.clone(),
        },
        // Hex, as `flows`, `top`, tshark and perftest print QPs.
        format!("{:#x}", q.lqpn),
        q.rqpn.map_or_else(dash, |r| format!("{r:#x}")),
        q.qp_type.clone(),
        state,
        owner(q.pid, q.comm.as_deref()),
        q.pod_uid.clone().unwrap_or_else(dash),
        match (q.src, q.dst) {
            (Some(s), Some(d)) => format!("{s}→{d}"),
            _ => dash(),
        },
        wire,
        q.wire
            .as_ref()
            .and_then(|w| w.rtt)
            .map_or_else(dash, |r| crate::doc::table::round_trip(r.p99_us)),
        q.counters.len().to_string(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::server::InterfaceVisibility;
    use crate::doc::qp::{QpDocument, QpWire, RdmaPort};

    fn qp(lqpn: u32) -> Qp {
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
            netdev: Some("eth1".into()),
            src_port: None,
            dst_port: None,
            gone: false,
            wire: None,
        }
    }

    #[test]
    fn the_table_has_a_row_per_qp_ports_and_visibility() {
        let mut seen = qp(0x11);
        seen.src = Some("198.18.0.1".parse().unwrap());
        seen.dst = Some("198.18.0.2".parse().unwrap());
        seen.pod_uid = Some("0f3c2a7e-1111-2222-3333-444455556666".into());
        seen.seen_on_wire = true;
        seen.wire = Some(QpWire {
            flows: 2,
            tx_packets: 1200,
            rx_packets: 600,
            rtt: Some(crate::doc::Rtt {
                samples: 40,
                min_us: 31.0,
                p50_us: 38.2,
                p99_us: 1_204.0,
            }),
            ..QpWire::default()
        });
        let mut offloaded = qp(0x2a);
        offloaded.device = "mlx5_0".into();
        offloaded.netdev = Some("eth2".into());
        offloaded.counters.insert("rx_write_requests".into(), 5);
        offloaded.counters.insert("out_of_sequence".into(), 0);
        let mut kernel = qp(1);
        kernel.qp_type = "GSI".into();
        kernel.rqpn = None;
        kernel.pid = None;
        kernel.comm = Some("ib_core".into());
        let mut gone = qp(0x12);
        gone.gone = true;
        let answer = QpAnswer {
            document: QpDocument {
                qps: vec![offloaded, gone, seen, kernel],
                ports: vec![
                    RdmaPort {
                        device: "rxe0".into(),
                        port: 1,
                        netdev: Some("eth1".into()),
                        counters: Default::default(),
                    },
                    RdmaPort {
                        device: "mlx5_0".into(),
                        port: 1,
                        netdev: Some("eth2".into()),
                        counters: Default::default(),
                    },
                ],
                error: None,
            },
            visibility: vec![
                InterfaceVisibility {
                    ifname: "eth1".into(),
                    mode: "kernel_path".into(),
                },
                InterfaceVisibility {
                    ifname: "eth2".into(),
                    mode: "offloaded".into(),
                },
            ],
        };
        assert_eq!(
            render(&answer),
            "\
device/port  lqpn  rqpn  type  state       owner             pod                                   src→dst                wire tx/rx pkts  RTT p99  hw counters
mlx5_0/1     0x2a  0x2b  RC    RTS         ib_write_bw[577]  -                                     -                            offloaded        -            2
rxe0/1        0x1     -  GSI   RTS         [ib_core]         -                                     -                             not seen        -            0
rxe0/1       0x11  0x12  RC    RTS         ib_write_bw[577]  0f3c2a7e-1111-2222-3333-444455556666  198.18.0.1→198.18.0.2         1200/600   1.20ms            0
rxe0/1       0x12  0x13  RC    RTS (gone)  ib_write_bw[577]  -                                     -                             not seen        -            0
qps 4: 1 seen on the wire, 1 offloaded, 2 not seen; ports: rxe0/1 eth1, mlx5_0/1 eth2
visibility: eth1 kernel_path, eth2 offloaded
"
        );
    }

    #[test]
    fn an_empty_table_says_why() {
        let mut answer = QpAnswer::default();
        assert_eq!(
            render(&answer),
            "no queue pairs: no RDMA device on this host\nqps 0: 0 seen on the wire, 0 offloaded, 0 not seen\n"
        );
        answer.document.error = Some("RDMA netlink: Permission denied".into());
        assert_eq!(
            render(&answer),
            "the agent could not read the QP table: RDMA netlink: Permission denied\nqps 0: 0 seen on the wire, 0 offloaded, 0 not seen\n"
        );
    }

    #[test]
    fn owners_read_as_rdma_prints_them() {
        assert_eq!(owner(Some(577), Some("ib_write_bw")), "ib_write_bw[577]");
        assert_eq!(owner(None, Some("ib_core")), "[ib_core]");
        assert_eq!(owner(Some(9), None), "[9]");
        assert_eq!(owner(None, None), "-");
    }
}
