//! Judges the `overhead` scenario: perftest on real soft-RoCE traffic in three arms,
//! in rounds of one boot: `off` (nothing attached), `empty` (empty XDP and tc egress
//! programs attached as the agent attaches its own: [`empty_programs_object`]) and `on`
//! (the agent, `run --mode enforce` on both veths). Each round gives ratios for
//! `ib_write_bw`'s average bandwidth and `ib_send_lat`'s typical (median) latency; a
//! figure is the median of a ratio over the rounds. `on/off` is what the agent costs
//! as deployed here; `on/empty` is what its programs and its process cost beyond the
//! hooks themselves. The two differ because on a veth native XDP changes the receive
//! path (the frame is copied into a page with XDP headroom and polled by the veth's
//! NAPI): in the VM lab an empty XDP program costs more than the agent's code does.
//!
//! Under TCG the absolute figures mean nothing and move by tens of percent from run
//! to run (the guest shares two host cores with whatever else runs), so this is a
//! benchmark, not a timed test. It fails only on what no noise explains: the agent's
//! bandwidth below [`MIN_BW_RATIO`] of the empty programs', its latency above
//! [`MAX_LAT_RATIO`] times theirs, or the agent's own process above
//! [`MAX_AGENT_CPU`] of a CPU while perftest runs (perftest busy-polls both vCPUs, so
//! whatever the agent burns comes out of the traffic). perftest's clock calibration
//! sometimes fails under TCG and prints 0.00 (bandwidth) or `inf` (latency): such a run
//! is discarded and counted, its round left out of that figure's median.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};

use super::judge::Outcome;

/// The agent's bandwidth over the empty programs', below which the run fails.
pub const MIN_BW_RATIO: f64 = 0.5;
/// The agent's latency over the empty programs', above which the run fails.
pub const MAX_LAT_RATIO: f64 = 2.0;
/// The agent's CPU (user + system) while perftest runs, as a share of one CPU, above
/// which the run fails (its audit reading rxe's GID tables every second took 0.7).
pub const MAX_AGENT_CPU: f64 = 0.25;

/// The arms, in the order each round runs them.
const ARMS: [&str; 3] = ["off", "empty", "on"];

/// `BW average[MB/sec]` of an `ib_write_bw` client's output (None: no result line, or
/// 0.00).
fn bandwidth(text: &str) -> Option<f64> {
    column(text, "BW average[MB/sec]", 3)
}

/// `t_typical[usec]` (the median) of an `ib_send_lat` client's output.
fn latency(text: &str) -> Option<f64> {
    column(text, "t_typical[usec]", 4)
}

/// Column `index` of the line after the header that names `header`, when positive and
/// finite (a failed calibration prints 0.00 bandwidth and `inf` latencies).
fn column(text: &str, header: &str, index: usize) -> Option<f64> {
    let mut lines = text.lines().skip_while(|l| !l.contains(header));
    lines.next()?;
    let row = lines.next()?;
    let value: f64 = row.split_whitespace().nth(index)?.parse().ok()?;
    (value.is_finite() && value > 0.0).then_some(value)
}

/// The agent's share of one CPU over a run: clock ticks used over the run's seconds.
fn cpu_share(t0: &str, t1: &str, c0: &str, c1: &str, ticks_per_s: f64) -> Option<f64> {
    let secs = t1.parse::<f64>().ok()? - t0.parse::<f64>().ok()?;
    let ticks = c1.parse::<f64>().ok()? - c0.parse::<f64>().ok()?;
    (secs > 0.0).then(|| ticks / ticks_per_s / secs)
}

/// An ELF object of two empty programs for the `empty` arm, loaded by iproute2 as the
/// agent's programs are attached: section `xdp` (`ip link set dev IF xdpdrv obj F sec
/// xdp`: return XDP_PASS) and section `tc` (`tc filter add dev IF egress bpf da obj F
/// sec tc`: return TC_ACT_UNSPEC, the next filter). The agent's own empty programs
/// (`xdp_baseline`, `tc_baseline`) sit in an object whose legacy `maps` section the
/// guest's libbpf 1.x refuses, hence this one, written byte by byte.
pub fn empty_programs_object() -> Vec<u8> {
    // r0 = 2 (XDP_PASS); exit. r0 = -1 (TC_ACT_UNSPEC); exit.
    const XDP: [u8; 16] = [0xb7, 0, 0, 0, 2, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    const TC: [u8; 16] = [
        0xb7, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x95, 0, 0, 0, 0, 0, 0, 0,
    ];
    const LICENSE: &[u8] = b"GPL\0";
    const STRTAB: &[u8] = b"\0xdp_pass\0tc_pass\0";
    const SHSTRTAB: &[u8] = b"\0xdp\0tc\0license\0.symtab\0.strtab\0.shstrtab\0";
    // The offset of NAME in a string table (every name used is in it).
    let at = |table: &[u8], name: &str| -> u32 {
        let mut needle = name.as_bytes().to_vec();
        needle.push(0);
        table
            .windows(needle.len())
            .position(|w| w == needle.as_slice())
            .unwrap_or(0) as u32
    };
    let symbol = |name: u32, shndx: u16| -> Vec<u8> {
        let mut s = Vec::with_capacity(24);
        s.extend(name.to_le_bytes());
        s.push(if name == 0 { 0 } else { 0x12 }); // STB_GLOBAL, STT_FUNC
        s.push(0);
        s.extend(shndx.to_le_bytes());
        s.extend(0u64.to_le_bytes());
        s.extend(if name == 0 { 0u64 } else { 16u64 }.to_le_bytes());
        s
    };
    let mut symtab = symbol(0, 0);
    symtab.extend(symbol(at(STRTAB, "xdp_pass"), 1));
    symtab.extend(symbol(at(STRTAB, "tc_pass"), 2));
    // Body: the sections after the 64-byte ELF header, each 8-aligned.
    let mut body: Vec<u8> = Vec::new();
    let mut place = |data: &[u8]| -> u64 {
        while !body.len().is_multiple_of(8) {
            body.push(0);
        }
        let offset = 64 + body.len() as u64;
        body.extend_from_slice(data);
        offset
    };
    let offsets = [
        place(&XDP),
        place(&TC),
        place(LICENSE),
        place(&symtab),
        place(STRTAB),
        place(SHSTRTAB),
    ];
    while !body.len().is_multiple_of(8) {
        body.push(0);
    }
    let shoff = 64 + body.len() as u64;
    // A section header's fields but its name's offset, its address (0) and the data's
    // offset: type, flags, size, link, info, align, entsize.
    struct Header(&'static str, u32, u64, usize, u32, u32, u64, u64);
    let headers = [
        Header("xdp", 1, 6, XDP.len(), 0, 0, 8, 0), // PROGBITS, ALLOC|EXECINSTR
        Header("tc", 1, 6, TC.len(), 0, 0, 8, 0),
        Header("license", 1, 3, LICENSE.len(), 0, 0, 1, 0), // WRITE|ALLOC
        Header(".symtab", 2, 0, symtab.len(), 5, 1, 8, 24),
        Header(".strtab", 3, 0, STRTAB.len(), 0, 0, 1, 0),
        Header(".shstrtab", 3, 0, SHSTRTAB.len(), 0, 0, 1, 0),
    ];
    let mut out = Vec::new();
    out.extend(b"\x7fELF");
    out.extend([2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]); // 64-bit, little endian, version 1
    out.extend(1u16.to_le_bytes()); // ET_REL
    out.extend(247u16.to_le_bytes()); // EM_BPF
    out.extend(1u32.to_le_bytes());
    out.extend(0u64.to_le_bytes()); // entry
    out.extend(0u64.to_le_bytes()); // phoff
    out.extend(shoff.to_le_bytes());
    out.extend(0u32.to_le_bytes()); // flags
    for half in [64u16, 0, 0, 64, 7, 6] {
        // ehsize, phentsize, phnum, shentsize, shnum, shstrndx
        out.extend(half.to_le_bytes());
    }
    out.extend(body);
    out.extend([0u8; 64]); // the null section header
    for (Header(name, kind, flags, size, link, info, align, entsize), offset) in
        headers.iter().zip(offsets)
    {
        out.extend(at(SHSTRTAB, name).to_le_bytes());
        out.extend(kind.to_le_bytes());
        out.extend(flags.to_le_bytes());
        out.extend(0u64.to_le_bytes()); // addr
        out.extend(offset.to_le_bytes());
        out.extend((*size as u64).to_le_bytes());
        out.extend(link.to_le_bytes());
        out.extend(info.to_le_bytes());
        out.extend(align.to_le_bytes());
        out.extend(entsize.to_le_bytes());
    }
    out
}

fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

/// One figure over the rounds: each arm's value per round (None: discarded).
#[derive(Debug, Default)]
struct Figure {
    arms: BTreeMap<&'static str, BTreeMap<u32, Option<f64>>>,
}

impl Figure {
    fn add(&mut self, arm: &'static str, round: u32, value: Option<f64>) {
        self.arms.entry(arm).or_default().insert(round, value);
    }
    /// `a` over `b`, round by round, where both have a value.
    fn ratios(&self, a: &str, b: &str) -> Vec<f64> {
        let (Some(a), Some(b)) = (self.arms.get(a), self.arms.get(b)) else {
            return Vec::new();
        };
        a.iter()
            .filter_map(|(round, x)| Some((*x)? / (*b.get(round)?)?))
            .collect()
    }
    fn discarded(&self) -> usize {
        self.arms
            .values()
            .flat_map(|r| r.values())
            .filter(|v| v.is_none())
            .count()
    }
    fn describe(&self, unit: &str) -> String {
        let arms: Vec<String> = ARMS
            .iter()
            .map(|arm| {
                let values: Vec<String> = self
                    .arms
                    .get(arm)
                    .map(|r| {
                        r.values()
                            .map(|x| x.map_or("discarded".to_string(), |x| format!("{x:.2}")))
                            .collect()
                    })
                    .unwrap_or_default();
                format!("{arm} [{}]", values.join(" "))
            })
            .collect();
        let ratio = |a, b| {
            let rounds: Vec<String> = self
                .ratios(a, b)
                .iter()
                .map(|r| format!("{r:.2}"))
                .collect();
            format!(
                "{a}/{b} {} [{}]",
                show(median(&mut self.ratios(a, b))),
                rounds.join(" ")
            )
        };
        format!(
            "{} {unit}; median (per round): {}, {}, {}; {} run(s) discarded",
            arms.join(" "),
            ratio("on", "off"),
            ratio("empty", "off"),
            ratio("on", "empty"),
            self.discarded()
        )
    }
}

fn show(r: Option<f64>) -> String {
    r.map_or("none".to_string(), |r| format!("{r:.3}"))
}

pub fn judge(dir: &Path, o: &mut Outcome) -> Result<()> {
    let runs = std::fs::read_to_string(dir.join("runs.txt")).context("reading runs.txt")?;
    let mut bw = Figure::default();
    let mut lat = Figure::default();
    let ticks_per_s: f64 = std::fs::read_to_string(dir.join("clk_tck"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(100.0);
    let (mut cpu_bw, mut cpu_lat) = (Vec::new(), Vec::new());
    let mut rounds = 0;
    for line in runs.lines() {
        // ARM ROUND bw T0 T1 C0 C1 lat T1 T2 C1 C2 (T: seconds of uptime, C: the
        // agent's CPU clock ticks, "-" without the agent)
        let w: Vec<&str> = line.split_whitespace().collect();
        let (Some(arm), Some(round)) = (
            w.first().and_then(|a| ARMS.iter().find(|x| *x == a)),
            w.get(1).and_then(|r| r.parse::<u32>().ok()),
        ) else {
            continue;
        };
        if let [_, _, _, t0, t1, c0, c1, _, _, t2, _, c2] = w.as_slice() {
            cpu_bw.extend(cpu_share(t0, t1, c0, c1, ticks_per_s));
            cpu_lat.extend(cpu_share(t1, t2, c1, c2, ticks_per_s));
        }
        let read = |t: &str| {
            std::fs::read_to_string(dir.join(format!("{t}-{arm}-{round}-client.txt")))
                .unwrap_or_default()
        };
        bw.add(arm, round, bandwidth(&read("bw")));
        lat.add(arm, round, latency(&read("lat")));
        rounds = rounds.max(round);
        // XDP attached exactly in the arms that attach it.
        let link = std::fs::read_to_string(dir.join(format!("link-{arm}-{round}.txt")))
            .unwrap_or_default();
        o.figures += 1;
        if link.contains("xdp") != (*arm != "off") {
            o.problem(format!(
                "round {round} {arm}: XDP {} on veth0",
                if link.contains("xdp") {
                    "attached"
                } else {
                    "not attached"
                }
            ));
        }
    }
    o.notes.push(format!(
        "ib_write_bw 64 KiB x 2000, BW average[MB/sec]: {}",
        bw.describe("MB/s")
    ));
    o.notes.push(format!(
        "ib_send_lat 64 B x 2000, t_typical[usec]: {}",
        lat.describe("us")
    ));
    let cpu = (median(&mut cpu_bw), median(&mut cpu_lat));
    let pct = |v: Option<f64>| v.map_or("?".to_string(), |m| format!("{:.0} %", m * 100.0));
    o.notes.push(format!(
        "{rounds} rounds; the agent's CPU (user + system, of one CPU), median: {} during ib_write_bw, {} during ib_send_lat",
        pct(cpu.0),
        pct(cpu.1)
    ));
    let (bw_ratio, lat_ratio) = (
        median(&mut bw.ratios("on", "empty")),
        median(&mut lat.ratios("on", "empty")),
    );
    o.figures += 3;
    match bw_ratio {
        None => {
            o.problem("no round gave a bandwidth with the agent and with the empty programs".into())
        }
        Some(r) if r < MIN_BW_RATIO => o.problem(format!(
            "bandwidth with the agent {r:.3} of the empty programs' (below {MIN_BW_RATIO})"
        )),
        Some(_) => {}
    }
    match lat_ratio {
        None => {
            o.problem("no round gave a latency with the agent and with the empty programs".into())
        }
        Some(r) if r > MAX_LAT_RATIO => o.problem(format!(
            "latency with the agent {r:.3} times the empty programs' (above {MAX_LAT_RATIO})"
        )),
        Some(_) => {}
    }
    if let Some(c) = [cpu.0, cpu.1].into_iter().flatten().reduce(f64::max) {
        if c > MAX_AGENT_CPU {
            o.problem(format!(
                "the agent used {:.0} % of a CPU while perftest ran (above {:.0} %)",
                c * 100.0,
                MAX_AGENT_CPU * 100.0
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BW: &str = "\
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]
 65536      2000             25.12              24.98              0.000400
---------------------------------------------------------------------------------------
";
    const LAT: &str = "\
 #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] 
 64      2000          301.10         9000.52      412.33             450.01         80.22           900.00                 4000.00
";

    #[test]
    fn perftest_results_are_read_by_their_header_and_zero_is_discarded() {
        assert_eq!(bandwidth(BW), Some(24.98));
        assert_eq!(latency(LAT), Some(412.33));
        assert_eq!(bandwidth(&BW.replace("24.98", "0.00")), None);
        assert_eq!(latency(&LAT.replace("412.33", "inf")), None);
        assert_eq!(latency(&LAT.replace("412.33", "-nan")), None);
        assert_eq!(bandwidth("Couldn't connect"), None);
    }

    #[test]
    fn the_agents_cpu_share_is_its_ticks_over_the_runs_seconds() {
        assert_eq!(cpu_share("10.0", "12.0", "100", "150", 100.0), Some(0.25));
        assert_eq!(cpu_share("10.0", "12.0", "-", "-", 100.0), None);
    }

    #[test]
    fn ratios_pair_rounds_and_skip_discarded_runs() {
        let mut f = Figure::default();
        for (round, off, on) in [
            (1, Some(20.0), Some(19.0)),
            (2, None, Some(30.0)),
            (3, Some(25.0), Some(25.0)),
        ] {
            f.add("off", round, off);
            f.add("on", round, on);
        }
        assert_eq!(f.ratios("on", "off"), [0.95, 1.0]);
        assert_eq!(f.ratios("on", "empty"), Vec::<f64>::new());
        assert_eq!(f.discarded(), 1);
        assert_eq!(median(&mut f.ratios("on", "off")), Some(0.975));
        assert_eq!(median(&mut []), None);
    }

    #[test]
    fn the_empty_programs_object_is_an_elf_of_bpf_code_with_its_two_sections() {
        let o = empty_programs_object();
        assert_eq!(&o[..4], b"\x7fELF");
        assert_eq!(u16::from_le_bytes([o[18], o[19]]), 247); // EM_BPF
        let shoff = u64::from_le_bytes(o[40..48].try_into().unwrap_or_default()) as usize;
        assert_eq!(o.len(), shoff + 7 * 64);
        let text = String::from_utf8_lossy(&o);
        for name in ["xdp_pass", "tc_pass", ".symtab", "license", "GPL"] {
            assert!(text.contains(name), "{name}");
        }
        // XDP_PASS and exit at the start of the body (section xdp).
        assert_eq!(
            &o[64..80],
            &[0xb7, 0, 0, 0, 2, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0]
        );
    }
}
