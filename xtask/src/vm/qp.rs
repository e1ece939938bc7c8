//! Judges the `qp_table` scenario: the agent's QP table (`roce-agent qps --json`,
//! GET /qps) against iproute2's `rdma -j resource show qp` and `... cm_id`, taken
//! while perftest (RC over verbs, RC over rdma_cm) and rping run, two of the tools in
//! cgroups made like a pod's containers.
//!
//! The guest reads rdma's tables, then the agent's, then rdma's again
//! (`rdma-qp-running-before.json`, `qps-running.json`, `...-after.json`): the agent
//! read its table between the two, so a figure rdma shows the same in both (a QP's
//! state, its PSNs, ...) is the one the agent must show; one that moved in between is
//! not compared. Then the flows of the same moment carry their QP's owner, and once
//! the tools ended their QPs leave both tables.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::Path;

use anyhow::{anyhow, Context, Result};
use serde_json::Value;

use super::judge::Outcome;

/// The RDMA devices of the lab and their netdevs.
const DEVICES: [(&str, &str); 2] = [("rxe0", "veth0"), ("rxe1", "veth1")];

/// A container the guest made, as the kubelet's systemd driver and the runtime name
/// its cgroup (tests/vm/scenarios.sh, POD1_* and POD2_*).
struct Pod {
    uid: &'static str,
    container_id: &'static str,
    cgroup: &'static str,
}

const POD1: Pod = Pod {
    uid: "5f0c6a1e-2b7d-4c1e-9a3f-0123456789ab",
    container_id: "4b1c3e6f8a2d0b9c7e5f3a1d2c4b6a8e0f9d7c5b3a1e2f4d6c8b0a9e7f5d3c1b",
    cgroup: "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod5f0c6a1e_2b7d_4c1e_9a3f_0123456789ab.slice/cri-containerd-4b1c3e6f8a2d0b9c7e5f3a1d2c4b6a8e0f9d7c5b3a1e2f4d6c8b0a9e7f5d3c1b.scope",
};

const POD2: Pod = Pod {
    uid: "0d3e2a41-77c5-4f0b-8e2a-b1c9d8e7f6a5",
    container_id: "9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d",
    cgroup: "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0d3e2a41_77c5_4f0b_8e2a_b1c9d8e7f6a5.slice/docker-9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d.scope",
};

/// The processes the guest started: role (its files `pid-ROLE`, `cgroup-ROLE`), the
/// command rdma names, the pod it runs in.
const ROLES: [(&str, &str, Option<&Pod>); 7] = [
    ("idle", "ibv_rc_pingpong", None),
    ("rc-server", "ib_write_bw", Some(&POD1)),
    ("rc-client", "ib_write_bw", None),
    ("cm-server", "ib_write_bw", Some(&POD2)),
    ("cm-client", "ib_write_bw", None),
    ("rping-server", "rping", None),
    ("rping-client", "rping", None),
];

/// The role whose QP never sends or receives.
const IDLE: &str = "idle";

/// A QP by device and local QP number.
type QpKey = (String, u64);

/// The figures of one QP both tables show, by the agent's field names; JSON null where
/// a table leaves one out.
type QpFigures = BTreeMap<&'static str, Value>;

/// The figures compared between rdma's QPs and the agent's, as (agent's name, rdma's name).
const QP_FIELDS: [(&str, &str); 9] = [
    ("port", "port"),
    ("rqpn", "rqpn"),
    ("type", "type"),
    ("state", "state"),
    ("sq_psn", "sq-psn"),
    ("rq_psn", "rq-psn"),
    ("pid", "pid"),
    ("comm", "comm"),
    ("device", "ifname"),
];

/// rdma prints a kernel-owned QP's command in brackets (`[ib_core]`); the agent
/// without them.
fn plain_comm(v: &Value) -> Value {
    match v.as_str() {
        Some(s) => Value::String(s.trim_start_matches('[').trim_end_matches(']').to_string()),
        None => Value::Null,
    }
}

/// rdma's device name: `ifname` is "rxe0" (some versions print "rxe0/1").
fn rdma_device(o: &Value) -> Option<String> {
    let name = o.get("ifname")?.as_str()?;
    Some(name.split('/').next().unwrap_or(name).to_string())
}

fn read_json(path: &Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

/// `rdma -j resource show qp`: the QPs by (device, lqpn), their figures normalised.
fn rdma_qps(path: &Path) -> Result<BTreeMap<QpKey, QpFigures>> {
    rdma_qps_of(&read_json(path)?).with_context(|| format!("in {}", path.display()))
}

fn rdma_qps_of(doc: &Value) -> Result<BTreeMap<QpKey, QpFigures>> {
    let rows = doc
        .as_array()
        .ok_or_else(|| anyhow!("rdma's QP table is not a JSON array"))?;
    let mut out = BTreeMap::new();
    for row in rows {
        let (Some(device), Some(lqpn)) = (rdma_device(row), row["lqpn"].as_u64()) else {
            continue;
        };
        let mut f = QpFigures::new();
        for (agent_name, rdma_name) in QP_FIELDS {
            let v = match agent_name {
                "device" => Value::String(device.clone()),
                "comm" => plain_comm(&row[rdma_name]),
                _ => row.get(rdma_name).cloned().unwrap_or(Value::Null),
            };
            f.insert(agent_name, v);
        }
        out.insert((device, lqpn), f);
    }
    Ok(out)
}

/// An rdma_cm connection's addresses and ports, as the agent's fields.
type CmAddrs = BTreeMap<&'static str, Value>;

fn norm_ip(v: &Value) -> Value {
    match v.as_str().map(|s| s.parse::<IpAddr>()) {
        Some(Ok(a)) => Value::String(a.to_string()),
        _ => v.clone(),
    }
}

/// One end of a cm_id as (address, port): iproute2 prints `"src-addr": "ADDR:PORT"`
/// (the port after the last colon, also for IPv6), or a separate `src-port`.
fn endpoint(row: &Value, end: &str) -> (Value, Value) {
    let addr = &row[format!("{end}-addr")];
    let port = &row[format!("{end}-port")];
    if !port.is_null() {
        return (norm_ip(addr), port.clone());
    }
    match addr.as_str().and_then(|s| s.rsplit_once(':')) {
        Some((a, p)) => match p.parse::<u64>() {
            Ok(p) => (
                norm_ip(&Value::from(a.trim_matches(['[', ']']))),
                Value::from(p),
            ),
            Err(_) => (norm_ip(addr), Value::Null),
        },
        None => (norm_ip(addr), Value::Null),
    }
}

/// `rdma -j resource show cm_id`: the cm_ids bound to a QP, by (device, lqpn).
fn rdma_cm_ids(path: &Path) -> Result<BTreeMap<QpKey, CmAddrs>> {
    let doc = read_json(path)?;
    let rows = doc
        .as_array()
        .ok_or_else(|| anyhow!("{}: not a JSON array", path.display()))?;
    let mut out = BTreeMap::new();
    for row in rows {
        let (Some(device), Some(lqpn)) = (rdma_device(row), row["lqpn"].as_u64()) else {
            continue;
        };
        let mut a = CmAddrs::new();
        for end in ["src", "dst"] {
            let (addr, port) = endpoint(row, end);
            a.insert(end, addr);
            a.insert(if end == "src" { "src_port" } else { "dst_port" }, port);
        }
        out.insert((device, lqpn), a);
    }
    Ok(out)
}

/// What two snapshots show the same: the keys in both, each with the fields equal
/// in both (the others left out).
fn stable<F: Ord + Clone>(
    before: &BTreeMap<QpKey, BTreeMap<F, Value>>,
    after: &BTreeMap<QpKey, BTreeMap<F, Value>>,
) -> BTreeMap<QpKey, BTreeMap<F, Value>> {
    before
        .iter()
        .filter_map(|(k, b)| {
            let a = after.get(k)?;
            let same = b
                .iter()
                .filter(|(f, v)| a.get(*f) == Some(*v))
                .map(|(f, v)| (f.clone(), v.clone()))
                .collect();
            Some((k.clone(), same))
        })
        .collect()
}

/// The agent's QP records by (device, lqpn).
fn agent_qps(doc: &Value) -> Result<BTreeMap<QpKey, Value>> {
    let qps = doc["qps"]
        .as_array()
        .ok_or_else(|| anyhow!("the QP document has no qps array"))?;
    let mut out = BTreeMap::new();
    for q in qps {
        let device = q["device"]
            .as_str()
            .ok_or_else(|| anyhow!("a QP without device: {q}"))?
            .to_string();
        let lqpn = q["lqpn"]
            .as_u64()
            .ok_or_else(|| anyhow!("a QP without lqpn: {q}"))?;
        if out.insert((device.clone(), lqpn), q.clone()).is_some() {
            return Err(anyhow!("QP {device}/{lqpn} appears twice"));
        }
    }
    Ok(out)
}

/// rdma prints the remote QP number 0 of an RC or UC QP not yet connected (RESET,
/// INIT): the kernel fills the attribute for those types in every state.
fn before_rtr(figs: &QpFigures, rqpn: &Value) -> bool {
    *rqpn == 0
        && matches!(
            figs.get("state").and_then(Value::as_str),
            Some("RESET" | "INIT")
        )
}

/// The agent's value of field `f` normalised like rdma's (addresses parsed).
fn agent_field(q: &Value, f: &str) -> Value {
    let v = q.get(f).cloned().unwrap_or(Value::Null);
    match f {
        "src" | "dst" => norm_ip(&v),
        _ => v,
    }
}

fn qp_name(k: &QpKey) -> String {
    format!("{}/{}", k.0, k.1)
}

/// The `0::PATH` line of a `/proc/PID/cgroup` copy.
fn cgroup_v2_path(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
}

fn read_pid(dir: &Path, role: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join(format!("pid-{role}")))
        .ok()
        .and_then(|t| t.trim().parse().ok())
}

pub fn qp_table(dir: &Path, o: &mut Outcome) -> Result<()> {
    let before = rdma_qps(&dir.join("rdma-qp-running-before.json"))?;
    let after = rdma_qps(&dir.join("rdma-qp-running-after.json"))?;
    let rdma = stable(&before, &after);
    let cm = stable(
        &rdma_cm_ids(&dir.join("rdma-cm_id-running-before.json"))?,
        &rdma_cm_ids(&dir.join("rdma-cm_id-running-after.json"))?,
    );
    let doc = read_json(&dir.join("qps-running.json"))?;
    let agent = agent_qps(&doc)?;
    o.figures += 1;
    if !doc["error"].is_null() {
        o.problem(format!("the QP document says error {}", doc["error"]));
    }
    ports(&doc, o);

    // Every QP rdma shows in both snapshots, figure for figure.
    for (key, figs) in &rdma {
        let Some(q) = agent.get(key) else {
            o.problem(format!(
                "QP {} ({}, {}) in rdma's table, not in the agent's",
                qp_name(key),
                figs.get("comm").unwrap_or(&Value::Null),
                figs.get("state").unwrap_or(&Value::Null)
            ));
            continue;
        };
        for (f, want) in figs {
            o.figures += 1;
            let got = agent_field(q, f);
            if *f == "rqpn" && got.is_null() && before_rtr(figs, want) {
                o.notes.push(format!(
                    "QP {} ({}): rqpn null where rdma prints {want} (no remote before RTR, as the document says)",
                    qp_name(key),
                    figs.get("state").unwrap_or(&Value::Null)
                ));
                continue;
            }
            if &got != want {
                o.problem(format!("QP {}: {f} agent {got}, rdma {want}", qp_name(key)));
            }
        }
        // The addresses of the rdma_cm connection that made it, else none.
        let cm_addrs = cm.get(key);
        for f in ["src", "dst", "src_port", "dst_port"] {
            let want = match cm_addrs {
                Some(a) => match a.get(f) {
                    Some(v) => v.clone(),
                    None => continue, // moved between the snapshots
                },
                None if before.contains_key(key) && after.contains_key(key) => Value::Null,
                None => continue,
            };
            o.figures += 1;
            let got = agent_field(q, f);
            if got != want {
                o.problem(format!(
                    "QP {}: {f} agent {got}, rdma's cm_id {want}",
                    qp_name(key)
                ));
            }
        }
        // The netdev under its port.
        if let Some((_, netdev)) = DEVICES.iter().find(|(d, _)| *d == key.0) {
            o.figures += 1;
            if q["netdev"] != *netdev {
                o.problem(format!(
                    "QP {}: netdev {}, expected {netdev:?}",
                    qp_name(key),
                    q["netdev"]
                ));
            }
        }
    }
    // The agent shows no QP rdma did not (one that ended in between is marked gone).
    for (key, q) in &agent {
        o.figures += 1;
        let gone = q["gone"].as_bool().unwrap_or(false);
        if !before.contains_key(key) && !after.contains_key(key) && !gone {
            o.problem(format!(
                "QP {} in the agent's table ({}), in neither of rdma's",
                qp_name(key),
                q
            ));
        }
    }
    o.notes.push(format!(
        "rdma: {} QPs in both snapshots ({} bound to an rdma_cm cm_id), the agent: {} QPs",
        rdma.len(),
        cm.len(),
        agent.len()
    ));

    owners(dir, &rdma, &agent, o);
    flow_owners(dir, &rdma, &agent, o)?;
    ended(dir, o)?;
    Ok(())
}

/// `ports`: each rxe port with its netdev.
fn ports(doc: &Value, o: &mut Outcome) {
    let ports = doc["ports"].as_array().cloned().unwrap_or_default();
    for (device, netdev) in DEVICES {
        o.figures += 1;
        let found = ports
            .iter()
            .find(|p| p["device"] == device && p["port"] == 1);
        match found {
            None => o.problem(format!("ports: no {device} port 1 ({})", doc["ports"])),
            Some(p) if p["netdev"] != netdev => o.problem(format!(
                "ports: {device} port 1 has netdev {}, expected {netdev:?}",
                p["netdev"]
            )),
            Some(_) => {}
        }
    }
}

/// Each tool's QPs: rdma names its PID and command, the agent its cgroup and, for
/// the two in a pod's container, the pod UID and container ID; its packets were seen.
fn owners(
    dir: &Path,
    rdma: &BTreeMap<QpKey, QpFigures>,
    agent: &BTreeMap<QpKey, Value>,
    o: &mut Outcome,
) {
    let mut seen = Vec::new();
    for (role, comm, pod) in ROLES {
        o.figures += 1;
        let Some(pid) = read_pid(dir, role) else {
            o.problem(format!("{role}: the guest recorded no PID"));
            continue;
        };
        let proc_cgroup =
            std::fs::read_to_string(dir.join(format!("cgroup-{role}"))).unwrap_or_default();
        let cgroup = cgroup_v2_path(&proc_cgroup);
        if let Some(p) = pod {
            // The guest put it there: else the scenario proves nothing about pods.
            o.figures += 1;
            if cgroup.as_deref() != Some(p.cgroup) {
                o.problem(format!(
                    "{role}: /proc/{pid}/cgroup says {cgroup:?}, not the pod's {}",
                    p.cgroup
                ));
            }
        }
        let keys: Vec<&QpKey> = rdma
            .iter()
            .filter(|(_, f)| f.get("pid").and_then(Value::as_u64) == Some(pid))
            .map(|(k, _)| k)
            .collect();
        if keys.is_empty() {
            o.problem(format!("{role}: rdma lists no QP of PID {pid}"));
            continue;
        }
        for key in &keys {
            let Some(q) = agent.get(*key) else { continue };
            let want_pod = pod.map(|p| (p.cgroup, p.uid, p.container_id));
            let expect: [(&str, Value); 5] = [
                ("pid", Value::from(pid)),
                ("comm", Value::from(comm)),
                (
                    "cgroup",
                    want_pod.map_or_else(
                        || cgroup.clone().map_or(Value::Null, Value::from),
                        |p| Value::from(p.0),
                    ),
                ),
                (
                    "pod_uid",
                    want_pod.map_or(Value::Null, |p| Value::from(p.1)),
                ),
                (
                    "container_id",
                    want_pod.map_or(Value::Null, |p| Value::from(p.2)),
                ),
            ];
            for (f, want) in expect {
                o.figures += 1;
                if q[f] != want {
                    o.problem(format!(
                        "{role}'s QP {}: {f} {}, expected {want}",
                        qp_name(key),
                        q[f]
                    ));
                }
            }
            // Its packets cross the veths and the agent joined them to it; the idle
            // QP's never did.
            o.figures += 1;
            let wire_packets = ["tx_packets", "rx_packets"]
                .iter()
                .filter_map(|f| q["wire"][f].as_u64())
                .sum::<u64>();
            let seen = q["seen_on_wire"] == true && wire_packets > 0;
            let unseen = q["seen_on_wire"] == false && q["wire"].is_null();
            if (role == IDLE && !unseen) || (role != IDLE && !seen) {
                o.problem(format!(
                    "{role}'s QP {}: seen_on_wire {}, wire {}",
                    qp_name(key),
                    q["seen_on_wire"],
                    q["wire"]
                ));
            }
        }
        seen.push(format!(
            "{role} pid {pid} {}",
            keys.iter()
                .map(|k| qp_name(k))
                .collect::<Vec<_>>()
                .join(" ")
        ));
    }
    o.notes.push(format!("owners: {}", seen.join("; ")));
}

/// The owner a flow should carry: the QP of the flow's interface's device that the
/// packets belong to. Ingress: the QP they are addressed to (dest_qp). Egress: the QP
/// that sent them, the one whose remote QP is dest_qp, when exactly one is; packets to
/// QP 1 (management datagrams: rdma_cm's handshake) come from the device's own QP 1,
/// the GSI QP.
fn expected_qp(
    rdma: &BTreeMap<QpKey, QpFigures>,
    device: &str,
    direction: &str,
    dest_qp: u64,
) -> Option<QpKey> {
    match direction {
        _ if dest_qp == 1 => {
            let k = (device.to_string(), 1);
            rdma.contains_key(&k).then_some(k)
        }
        "ingress" => {
            let k = (device.to_string(), dest_qp);
            rdma.contains_key(&k).then_some(k)
        }
        _ => {
            let senders: Vec<&QpKey> = rdma
                .iter()
                .filter(|(k, f)| {
                    k.0 == device && f.get("rqpn").and_then(Value::as_u64) == Some(dest_qp)
                })
                .map(|(k, _)| k)
                .collect();
            match senders.as_slice() {
                [one] => Some((*one).clone()),
                _ => None,
            }
        }
    }
}

/// The fields of `owner` on a flow, taken from the QP record it names.
const OWNER_FIELDS: [&str; 7] = [
    "device",
    "lqpn",
    "pid",
    "comm",
    "cgroup",
    "pod_uid",
    "container_id",
];

/// The flows on veth0 and veth1 of the moment the QP table was read carry the owner
/// of their QP; every tool's QP receives on a flow that names it.
fn flow_owners(
    dir: &Path,
    rdma: &BTreeMap<QpKey, QpFigures>,
    agent: &BTreeMap<QpKey, Value>,
    o: &mut Outcome,
) -> Result<()> {
    let doc = read_json(&dir.join("flows-running.json"))?;
    let flows = doc["flows"]
        .as_array()
        .ok_or_else(|| anyhow!("flows-running.json has no flows array"))?;
    let role_pids: Vec<u64> = ROLES
        .iter()
        .filter_map(|(role, _, _)| read_pid(dir, role))
        .collect();
    let mut judged = 0;
    let mut unjudged = BTreeMap::<String, u64>::new();
    let mut received_on = Vec::new();
    for f in flows {
        let (Some(ifname), Some(direction), Some(dest_qp)) = (
            f["ifname"].as_str(),
            f["direction"].as_str(),
            f["dest_qp"].as_u64(),
        ) else {
            continue;
        };
        let Some((device, _)) = DEVICES.iter().find(|(_, n)| *n == ifname) else {
            continue;
        };
        o.flows += 1;
        let Some(key) = expected_qp(rdma, device, direction, dest_qp) else {
            *unjudged
                .entry(format!(
                    "{ifname} {direction} qp {dest_qp} owner {}",
                    if f["owner"].is_null() {
                        "null".to_string()
                    } else {
                        format!("{}/{}", f["owner"]["device"], f["owner"]["lqpn"])
                    }
                ))
                .or_default() += 1;
            continue;
        };
        let Some(q) = agent.get(&key) else { continue };
        judged += 1;
        for field in OWNER_FIELDS {
            o.figures += 1;
            if f["owner"][field] != q[field] {
                o.problem(format!(
                    "flow {ifname} {direction} {}->{} qp {dest_qp}: owner.{field} {}, QP {}'s {}",
                    f["src"].as_str().unwrap_or("?"),
                    f["dst"].as_str().unwrap_or("?"),
                    f["owner"][field],
                    qp_name(&key),
                    q[field]
                ));
            }
        }
        if direction == "ingress" && q["pid"].as_u64().is_some_and(|p| role_pids.contains(&p)) {
            received_on.push(key);
        }
    }
    // Every tool's QP received on its device's veth, on a flow the judge checked.
    for (key, figs) in rdma {
        let pid = figs.get("pid").and_then(Value::as_u64);
        if pid.is_some_and(|p| role_pids.contains(&p)) && figs.get("state") == Some(&"RTS".into()) {
            o.figures += 1;
            if !received_on.contains(key) {
                o.problem(format!(
                    "QP {} (pid {}): no ingress flow to it on its veth",
                    qp_name(key),
                    pid.unwrap_or_default()
                ));
            }
        }
    }
    o.notes.push(format!(
        "flows: {judged} with their QP's owner judged; not judged (no single local QP): {}",
        if unjudged.is_empty() {
            "none".to_string()
        } else {
            unjudged
                .iter()
                .map(|(k, n)| format!("{k} x{n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    ));
    Ok(())
}

/// After the tools ended (and two intervals): rdma and the agent both show none of
/// their QPs.
fn ended(dir: &Path, o: &mut Outcome) -> Result<()> {
    let pids: Vec<u64> = ROLES
        .iter()
        .filter_map(|(role, _, _)| read_pid(dir, role))
        .collect();
    let of_tools = |f: &Value| f["pid"].as_u64().is_some_and(|p| pids.contains(&p));
    let rdma_left = rdma_qps(&dir.join("rdma-qp-ended-after.json"))?
        .into_iter()
        .filter(|(_, f)| {
            f.get("pid")
                .and_then(Value::as_u64)
                .is_some_and(|p| pids.contains(&p))
        })
        .count();
    let doc = read_json(&dir.join("qps-ended.json"))?;
    let agent = agent_qps(&doc)?;
    let left: Vec<String> = agent
        .iter()
        .filter(|(_, q)| of_tools(q))
        .map(|(k, q)| format!("{} (gone {})", qp_name(k), q["gone"]))
        .collect();
    o.figures += 1;
    if rdma_left > 0 {
        o.notes.push(format!(
            "rdma still lists {rdma_left} QPs of the ended tools 2.5 s after they ended"
        ));
    } else if !left.is_empty() {
        o.problem(format!(
            "2.5 s (5 intervals) after the tools ended the agent still lists their QPs: {}",
            left.join(", ")
        ));
    }
    o.notes.push(format!(
        "after the tools ended: the agent lists {} QPs, rdma {}",
        agent.len(),
        rdma_qps(&dir.join("rdma-qp-ended-after.json"))?.len()
    ));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qps(v: Value) -> BTreeMap<QpKey, QpFigures> {
        rdma_qps_of(&v).expect("an array of QPs")
    }

    #[test]
    fn rdma_rows_normalise_device_and_kernel_comm() {
        let t = qps(serde_json::json!([
            {"ifindex": 3, "ifname": "rxe0", "port": 1, "lqpn": 1, "type": "GSI",
             "state": "RTS", "sq-psn": 0, "comm": "[ib_core]"},
            {"ifindex": 3, "ifname": "rxe1/1", "lqpn": 17, "rqpn": 18, "type": "RC",
             "state": "RTS", "rq-psn": 5, "sq-psn": 9, "pid": 577, "comm": "ib_write_bw"}
        ]));
        let gsi = &t[&("rxe0".to_string(), 1)];
        assert_eq!(gsi["comm"], "ib_core");
        assert_eq!(gsi["pid"], Value::Null);
        assert_eq!(gsi["rqpn"], Value::Null);
        let rc = &t[&("rxe1".to_string(), 17)];
        assert_eq!(rc["device"], "rxe1");
        assert_eq!(rc["rq_psn"], 5);
        assert_eq!(rc["pid"], 577);
    }

    #[test]
    fn only_figures_equal_in_both_snapshots_are_kept() {
        let b = qps(serde_json::json!([
            {"ifname": "rxe0", "lqpn": 17, "type": "RC", "state": "RTS", "sq-psn": 1},
            {"ifname": "rxe0", "lqpn": 18, "type": "RC", "state": "RTS"}
        ]));
        let a = qps(serde_json::json!([
            {"ifname": "rxe0", "lqpn": 17, "type": "RC", "state": "RTS", "sq-psn": 2}
        ]));
        let s = stable(&b, &a);
        assert_eq!(s.len(), 1);
        let q = &s[&("rxe0".to_string(), 17)];
        assert!(!q.contains_key("sq_psn"));
        assert_eq!(q["state"], "RTS");
    }

    #[test]
    fn an_egress_flow_belongs_to_the_one_qp_whose_remote_is_its_destination() {
        let t = qps(serde_json::json!([
            {"ifname": "rxe0", "lqpn": 17, "rqpn": 18, "type": "RC", "state": "RTS"},
            {"ifname": "rxe1", "lqpn": 18, "rqpn": 17, "type": "RC", "state": "RTS"},
            {"ifname": "rxe0", "lqpn": 1, "type": "GSI", "state": "RTS"}
        ]));
        assert_eq!(
            expected_qp(&t, "rxe0", "egress", 18),
            Some(("rxe0".to_string(), 17))
        );
        assert_eq!(
            expected_qp(&t, "rxe0", "ingress", 17),
            Some(("rxe0".to_string(), 17))
        );
        // Management datagrams to the peer's QP 1 come from the device's own GSI QP.
        assert_eq!(
            expected_qp(&t, "rxe0", "egress", 1),
            Some(("rxe0".to_string(), 1))
        );
        assert_eq!(expected_qp(&t, "rxe1", "egress", 1), None);
        assert_eq!(expected_qp(&t, "rxe1", "ingress", 17), None);
    }

    #[test]
    fn cm_id_ends_are_read_joined_or_apart() {
        let joined =
            serde_json::json!({"src-addr": "198.18.0.1:7174", "dst-addr": "2001:db8::2:40000"});
        assert_eq!(
            endpoint(&joined, "src"),
            (Value::from("198.18.0.1"), Value::from(7174))
        );
        assert_eq!(
            endpoint(&joined, "dst"),
            (Value::from("2001:db8::2"), Value::from(40000))
        );
        let apart = serde_json::json!({"src-addr": "198.18.0.1", "src-port": 18516});
        assert_eq!(
            endpoint(&apart, "src"),
            (Value::from("198.18.0.1"), Value::from(18516))
        );
    }

    #[test]
    fn the_cgroup_v2_line_is_read() {
        assert_eq!(
            cgroup_v2_path("0::/kubepods.slice/x.scope\n").as_deref(),
            Some("/kubepods.slice/x.scope")
        );
        assert_eq!(cgroup_v2_path("1:name=systemd:/\n"), None);
    }
}
