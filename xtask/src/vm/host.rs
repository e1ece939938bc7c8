//! Judges the scenarios about the host's RDMA devices, on what the guest left:
//!
//! - `rnic_metrics`: every file of rxe's `ports/1/hw_counters/`, copied right before
//!   and right after one scrape of `/metrics`, is a `roce_rnic_*` sample of that port
//!   (labels device, port, netdev) whose value lies between the two readings. The
//!   names are stated here on their own, from the rule the agent follows: node_exporter's
//!   infiniband collector's name where it has one (of rxe's files, `duplicate_request`
//!   and `lifespan`), else `roce_rnic_FILE_total`.
//! - `check_rdma`: `roce-agent check --json` runs of the guest, each against the
//!   findings and exit code it should give on two rxe devices over a veth pair.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use super::judge::Outcome;

/// The lab's RDMA devices and the netdev behind each.
const DEVICES: [(&str, &str); 2] = [("rxe0", "veth0"), ("rxe1", "veth1")];

// ---------------------------------------------------------------------------------
// rnic_metrics

/// How a hw_counters file shows in /metrics.
#[derive(Debug, PartialEq)]
enum Expect {
    /// A counter: `roce_rnic_NAME_total`, the file's value.
    Counter(String),
    /// `lifespan` (ms): the gauge `roce_rnic_lifespan_seconds`.
    Seconds(String),
}

/// The sample a hw_counters file should be.
fn expected_metric(file: &str) -> Expect {
    match file {
        "duplicate_request" => Expect::Counter("roce_rnic_duplicate_requests_packets_total".into()),
        "lifespan" => Expect::Seconds("roce_rnic_lifespan_seconds".into()),
        _ => Expect::Counter(format!("roce_rnic_{file}_total")),
    }
}

/// One sample of a Prometheus text exposition: its name and labels.
type SampleKey = (String, BTreeMap<String, String>);

/// The samples of a Prometheus text exposition (format 0.0.4): name, labels, value.
fn parse_exposition(text: &str) -> BTreeMap<SampleKey, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, parse_labels(rest.trim_end_matches('}'))),
            None => (series, BTreeMap::new()),
        };
        out.insert((name.to_string(), labels), value);
    }
    out
}

/// `a="x",b="y"` (values without quotes or backslashes inside, as the agent's RNIC
/// labels are).
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    text.split(',')
        .filter_map(|pair| {
            let (k, v) = pair.split_once('=')?;
            Some((k.trim().to_string(), v.trim().trim_matches('"').to_string()))
        })
        .collect()
}

/// The files of `dir` and their values (None: unreadable in the guest).
fn counter_files(dir: &Path) -> BTreeMap<String, Option<u64>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| {
            let value = std::fs::read_to_string(e.path())
                .ok()
                .and_then(|t| t.trim().parse().ok());
            (e.file_name().to_string_lossy().into_owned(), value)
        })
        .collect()
}

pub fn rnic_metrics(dir: &Path, o: &mut Outcome) -> Result<()> {
    let text = std::fs::read_to_string(dir.join("metrics.txt")).context("reading metrics.txt")?;
    let samples = parse_exposition(&text);
    for (device, netdev) in DEVICES {
        let before = counter_files(&dir.join("hw-before").join(device));
        let after = counter_files(&dir.join("hw-after").join(device));
        if before.is_empty() {
            o.problem(format!("{device}: no hw_counters files were copied"));
            continue;
        }
        let labels: BTreeMap<String, String> =
            [("device", device), ("port", "1"), ("netdev", netdev)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        let mut missing = Vec::new();
        for (file, b) in &before {
            o.figures += 1;
            let (Some(b), Some(a)) = (*b, after.get(file).copied().flatten()) else {
                o.problem(format!(
                    "{device}: hw_counters/{file} did not read as a number"
                ));
                continue;
            };
            let (name, low, high) = match expected_metric(file) {
                Expect::Counter(name) => (name, b as f64, a as f64),
                Expect::Seconds(name) => (name, b as f64 / 1000.0, a as f64 / 1000.0),
            };
            match samples.get(&(name.clone(), labels.clone())) {
                None => missing.push(format!("{file} (as {name})")),
                Some(v) if *v < low || *v > high => o.problem(format!(
                    "{device}: {name} is {v}, not between hw_counters/{file} before ({low}) and after ({high}) the scrape"
                )),
                Some(_) => {}
            }
        }
        if !missing.is_empty() {
            o.problem(format!(
                "{device}: hw_counters files the agent does not export: {}",
                missing.join(", ")
            ));
        }
        // Every roce_rnic_* sample of the device carries the netdev behind it.
        let wrong_netdev: Vec<String> = samples
            .keys()
            .filter(|(name, l)| {
                name.starts_with("roce_rnic_")
                    && l.get("device").map(String::as_str) == Some(device)
                    && l.get("netdev").map(String::as_str) != Some(netdev)
            })
            .map(|(name, l)| format!("{name}{l:?}"))
            .collect();
        if !wrong_netdev.is_empty() {
            o.problem(format!(
                "{device}: samples without netdev=\"{netdev}\": {}",
                wrong_netdev.join(", ")
            ));
        }
        let exported = samples
            .keys()
            .filter(|(name, l)| {
                name.starts_with("roce_rnic_")
                    && l.get("device").map(String::as_str) == Some(device)
            })
            .count();
        let show = |f: &str| {
            format!(
                "{f} {}",
                before
                    .get(f)
                    .copied()
                    .flatten()
                    .map_or("?".into(), |v| v.to_string())
            )
        };
        o.notes.push(format!(
            "{device} ({netdev}): {} hw_counters files, {exported} roce_rnic samples; {}, {}, {}",
            before.len(),
            show("sent_pkts"),
            show("rcvd_pkts"),
            show("duplicate_request"),
        ));
        if device == "rxe0" {
            let names: Vec<&str> = before.keys().map(String::as_str).collect();
            o.notes
                .push(format!("hw_counters files: {}", names.join(" ")));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// check_rdma

/// One finding as (check, interface, severity).
type Key = (String, String, String);

fn findings(doc: &Value) -> Vec<&Value> {
    doc["findings"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn key(f: &Value) -> Key {
    let s = |k: &str| f[k].as_str().unwrap_or("-").to_string();
    (s("check"), s("interface"), s("severity"))
}

/// What every run on the lab finds on each veth: no DCB (info) and no ECN knobs
/// (info), and the MTU (3000: an error below the default required 4192, else an info).
fn veth_baseline(mtu_error: bool) -> Vec<Key> {
    let mut want = Vec::new();
    for ifname in ["veth0", "veth1"] {
        for (check, severity) in [
            ("dcb_unsupported", "info"),
            ("ecn_np", "info"),
            ("mtu", if mtu_error { "error" } else { "info" }),
        ] {
            want.push((check.into(), ifname.into(), severity.into()));
        }
    }
    want
}

/// A run of `check --json`, by the name the guest gave it.
struct Run {
    name: &'static str,
    doc: Value,
    rc: Option<i32>,
}

fn load(dir: &Path, name: &'static str) -> Result<Run> {
    let text = std::fs::read_to_string(dir.join(format!("{name}.json")))
        .with_context(|| format!("reading {name}.json"))?;
    let doc = serde_json::from_str(&text).with_context(|| {
        format!(
            "{name}.json is not JSON ({})",
            std::fs::read_to_string(dir.join(format!("{name}.err"))).unwrap_or_default()
        )
    })?;
    let rc = std::fs::read_to_string(dir.join(format!("{name}.rc")))
        .ok()
        .and_then(|t| t.trim().parse().ok());
    Ok(Run { name, doc, rc })
}

/// The run's findings are `want` (as a multiset) and its exit code the documented one:
/// 1 when a finding is at error level, else 0.
fn expect_findings(run: &Run, mut want: Vec<Key>, o: &mut Outcome) {
    let mut got: Vec<Key> = findings(&run.doc).into_iter().map(key).collect();
    got.sort();
    want.sort();
    o.figures += 2;
    if got != want {
        o.problem(format!("{}: findings {got:?}, expected {want:?}", run.name));
    }
    let errors = got.iter().filter(|k| k.2 == "error").count();
    let summary = run.doc["summary"]["error"].as_u64();
    let want_rc = if errors > 0 { 1 } else { 0 };
    if run.rc != Some(want_rc) || summary != Some(errors as u64) {
        o.problem(format!(
            "{}: exit code {:?} with {errors} error finding(s) (summary.error {summary:?}): expected {want_rc}",
            run.name, run.rc
        ));
    }
}

/// The finding of `run` with this check and interface.
fn finding_of<'a>(run: &'a Run, check: &str, ifname: &str) -> Option<&'a Value> {
    findings(&run.doc)
        .into_iter()
        .find(|f| f["check"] == check && f["interface"] == ifname)
}

fn expect_text(run: &Run, check: &str, field: &str, want: &str, o: &mut Outcome) {
    o.figures += 1;
    let got = finding_of(run, check, "veth1")
        .and_then(|f| f[field].as_str())
        .unwrap_or_default();
    if !got.starts_with(want) {
        o.problem(format!(
            "{}: {check} on veth1: {field} {got:?}, expected it to start with {want:?}",
            run.name
        ));
    }
}

pub fn check_rdma(dir: &Path, o: &mut Outcome) -> Result<()> {
    // Both veths named, the default required MTU: the veths' MTU 3000 is an error.
    let named = load(dir, "named")?;
    expect_findings(&named, veth_baseline(true), o);
    o.figures += 1;
    let want_named = serde_json::json!([
        {"ifname": "veth0", "why": "named"},
        {"ifname": "veth1", "why": "named"},
    ]);
    if named.doc["interfaces"] != want_named {
        o.problem(format!("named: interfaces {}", named.doc["interfaces"]));
    }
    // None named: the netdev behind each RDMA port, found in its GID table.
    let found = load(dir, "found")?;
    expect_findings(&found, veth_baseline(true), o);
    o.figures += 1;
    let want_found = serde_json::json!([
        {"ifname": "veth0", "why": "rdma_device", "rdma_device": "rxe0"},
        {"ifname": "veth1", "why": "rdma_device", "rdma_device": "rxe1"},
    ]);
    if found.doc["interfaces"] != want_found {
        o.problem(format!(
            "found: interfaces {}, expected {want_found}",
            found.doc["interfaces"]
        ));
    }
    o.notes.push(format!(
        "audited without --iface: {}",
        found.doc["interfaces"]
    ));
    // --mtu 3000: only infos; and the same after each change is undone.
    for name in ["named_mtu", "mode_v1", "ipv6", "restored"] {
        expect_findings(&load(dir, name)?, veth_baseline(false), o);
    }
    // rdma_cm's group of rxe1 removed: the ToS in use is unknown, likely 0: an error
    // whose text says so, and whose fix makes the group and writes the ToS.
    let no_group = load(dir, "no_cm_group")?;
    let mut want = veth_baseline(false);
    want.push(("roce_tos".into(), "veth1".into(), "error".into()));
    expect_findings(&no_group, want, o);
    expect_text(
        &no_group,
        "roce_tos",
        "found",
        "default_roce_tos 0 (DSCP 0, Not-ECT): rdma_cm's default, /sys/kernel/config/rdma_cm/rxe1 \
         does not exist (a ToS set before the group was removed still applies",
        o,
    );
    expect_text(
        &no_group,
        "roce_tos",
        "fix",
        "mkdir -p /sys/kernel/config/rdma_cm/rxe1 && echo 106 > /sys/kernel/config/rdma_cm/rxe1/ports/1/default_roce_tos",
        o,
    );
    // The group made again: rdma_cm kept the device's ToS (106) and mode meanwhile.
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    o.notes.push(format!(
        "rxe1's rdma_cm group removed and made again: default_roce_tos {}, default_roce_mode {}",
        read("regrouped_default_roce_tos.txt").trim(),
        read("regrouped_default_roce_mode.txt").trim()
    ));
    // rdma_cm refuses RoCE v1 on rxe (its GIDs are v2 only): nothing changes, nothing
    // is found (mode_v1 is one of the clean runs above).
    let write = read("mode_v1_write.txt");
    o.figures += 1;
    if write.contains("exit 0\n") || !write.trim_end().ends_with("RoCE v2") {
        o.problem(format!(
            "writing IB/RoCE v1 into rxe1's default_roce_mode: {write:?} (expected a refusal, the mode still RoCE v2)"
        ));
    } else {
        o.notes.push(format!(
            "rdma_cm refuses RoCE v1 on rxe1: {}",
            write.lines().next().unwrap_or_default().trim()
        ));
    }
    // An IPv6 address on veth1: rxe gave it a RoCE v2 GID, so nothing is found.
    o.figures += 1;
    let record = std::fs::read_to_string(dir.join("sysfs-rxe1-ipv6.txt")).unwrap_or_default();
    match v2_gid_index(&record, "2001:0db8:0000:0000:0000:0000:0000:0002") {
        Some(i) => o
            .notes
            .push(format!("2001:db8::2 on veth1: RoCE v2 GID at rxe1 index {i}")),
        None => o.problem(
            "2001:db8::2 on veth1 has no RoCE v2 GID in the recorded table: the ipv6 run proves nothing"
                .to_string(),
        ),
    }
    Ok(())
}

/// The index of the RoCE v2 GID `gid` in a `sysfs_record` of one device (`grep -H`
/// lines: PATH:CONTENT; sysfs paths hold no colon).
fn v2_gid_index(record: &str, gid: &str) -> Option<String> {
    let line = |l: &'_ str| -> Option<(String, String)> {
        let (path, v) = l.split_once(':')?;
        (!l.starts_with("grep: ")).then(|| (path.to_string(), v.to_string()))
    };
    let files: Vec<(String, String)> = record.lines().filter_map(line).collect();
    let value = |suffix: &str| {
        files
            .iter()
            .find(|(p, _)| p.ends_with(suffix))
            .map(|(_, v)| v.as_str())
    };
    files.iter().find_map(|(path, v)| {
        let (_, index) = path.rsplit_once("/gids/")?;
        (v == gid && value(&format!("/gid_attrs/types/{index}")) == Some("RoCE v2"))
            .then(|| index.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expositions_parse_into_names_labels_and_values() {
        let s = parse_exposition(
            "# HELP x y\nroce_rnic_sent_pkts_total{device=\"rxe0\",port=\"1\",netdev=\"veth0\"} 6742\nup 1\n",
        );
        let labels: BTreeMap<String, String> =
            [("device", "rxe0"), ("port", "1"), ("netdev", "veth0")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        assert_eq!(
            s.get(&("roce_rnic_sent_pkts_total".into(), labels)),
            Some(&6742.0)
        );
        assert_eq!(s.get(&("up".into(), BTreeMap::new())), Some(&1.0));
    }

    #[test]
    fn rxe_files_map_to_node_exporter_names_else_the_generic_rule() {
        assert_eq!(
            expected_metric("duplicate_request"),
            Expect::Counter("roce_rnic_duplicate_requests_packets_total".into())
        );
        assert_eq!(
            expected_metric("lifespan"),
            Expect::Seconds("roce_rnic_lifespan_seconds".into())
        );
        assert_eq!(
            expected_metric("rcvd_seq_err"),
            Expect::Counter("roce_rnic_rcvd_seq_err_total".into())
        );
    }

    #[test]
    fn the_v2_gid_of_an_address_is_found_in_a_record() {
        let record = "/s/rxe1/ports/1/gids/2:2001:0db8:0000:0000:0000:0000:0000:0002\n\
                      /s/rxe1/ports/1/gid_attrs/types/2:IB/RoCE v1\n\
                      grep: /s/rxe1/ports/1/gid_attrs/types/4: Invalid argument\n\
                      /s/rxe1/ports/1/gids/3:2001:0db8:0000:0000:0000:0000:0000:0002\n\
                      /s/rxe1/ports/1/gid_attrs/types/3:RoCE v2\n";
        assert_eq!(
            v2_gid_index(record, "2001:0db8:0000:0000:0000:0000:0000:0002").as_deref(),
            Some("3")
        );
        assert_eq!(v2_gid_index(record, "::1"), None);
    }
}
