//! Judges the `overhead` scenario: perftest on real soft-RoCE traffic with the agent
//! attached (on: `run --mode enforce` on both veths) and without it (off), in rounds
//! off, on, off, on, ... of one boot. Each round gives a ratio on/off for
//! `ib_write_bw`'s average bandwidth and for `ib_send_lat`'s typical latency; the
//! figure is the median ratio over the rounds.
//!
//! Under TCG the absolute figures mean nothing and move by tens of percent from run to
//! run (the guest shares two host cores with whatever else runs), so this is a
//! benchmark, not a timed test: it fails only on a ratio no noise explains, bandwidth
//! on/off below [`MIN_BW_RATIO`] or latency on/off above [`MAX_LAT_RATIO`], i.e. the
//! agent halving the traffic. perftest's clock calibration sometimes fails under TCG
//! and prints 0.00: such a run is discarded (and counted), its round left out of
//! that figure's median.

use std::path::Path;

use anyhow::{Context, Result};

use super::judge::Outcome;

/// Bandwidth with the agent over without it, below which the run fails.
pub const MIN_BW_RATIO: f64 = 0.5;
/// Latency with the agent over without it, above which the run fails.
pub const MAX_LAT_RATIO: f64 = 2.0;

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

/// One figure over the rounds: off and on per round (None: discarded).
#[derive(Debug, Default)]
struct Figure {
    off: Vec<Option<f64>>,
    on: Vec<Option<f64>>,
}

impl Figure {
    fn ratios(&self) -> Vec<f64> {
        self.off
            .iter()
            .zip(&self.on)
            .filter_map(|(off, on)| Some((*on)? / (*off)?))
            .collect()
    }
    fn discarded(&self) -> usize {
        self.off
            .iter()
            .chain(&self.on)
            .filter(|v| v.is_none())
            .count()
    }
    fn describe(&self, unit: &str) -> String {
        let show = |v: &[Option<f64>]| {
            v.iter()
                .map(|x| x.map_or("discarded".to_string(), |x| format!("{x:.2}")))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let ratios: Vec<String> = self.ratios().iter().map(|r| format!("{r:.3}")).collect();
        format!(
            "off [{}] on [{}] {unit}; on/off per round [{}]; {} run(s) discarded (perftest printed 0.00 or no result)",
            show(&self.off),
            show(&self.on),
            ratios.join(" "),
            self.discarded()
        )
    }
}

pub fn judge(dir: &Path, o: &mut Outcome) -> Result<()> {
    let runs = std::fs::read_to_string(dir.join("runs.txt")).context("reading runs.txt")?;
    let mut bw = Figure::default();
    let mut lat = Figure::default();
    let mut rounds = 0;
    let ticks_per_s: f64 = std::fs::read_to_string(dir.join("clk_tck"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(100.0);
    let (mut cpu_bw, mut cpu_lat) = (Vec::new(), Vec::new());
    for line in runs.lines() {
        // MODE ROUND bw T0 T1 C0 C1 lat T1 T2 C1 C2 (T: seconds of uptime, C: the
        // agent's CPU clock ticks, "-" when off)
        let w: Vec<&str> = line.split_whitespace().collect();
        let (Some(mode), Some(round)) = (w.first(), w.get(1)) else {
            continue;
        };
        if let [_, _, _, t0, t1, c0, c1, _, _, t2, _, c2] = w.as_slice() {
            cpu_bw.extend(cpu_share(t0, t1, c0, c1, ticks_per_s));
            cpu_lat.extend(cpu_share(t1, t2, c1, c2, ticks_per_s));
        }
        let read = |t: &str| {
            std::fs::read_to_string(dir.join(format!("{t}-{mode}-{round}-client.txt")))
                .unwrap_or_default()
        };
        let (b, l) = (bandwidth(&read("bw")), latency(&read("lat")));
        // The agent attached exactly in the rounds that say so.
        let link = std::fs::read_to_string(dir.join(format!("link-{mode}-{round}.txt")))
            .unwrap_or_default();
        o.figures += 1;
        if link.contains("xdp") != (*mode == "on") {
            o.problem(format!(
                "round {round} {mode}: XDP {} on veth0",
                if link.contains("xdp") {
                    "attached"
                } else {
                    "not attached"
                }
            ));
        }
        match *mode {
            "off" => {
                bw.off.push(b);
                lat.off.push(l);
            }
            _ => {
                bw.on.push(b);
                lat.on.push(l);
                rounds += 1;
            }
        }
    }
    let bw_ratio = median(&mut bw.ratios());
    let lat_ratio = median(&mut lat.ratios());
    o.notes.push(format!(
        "ib_write_bw 64 KiB x 2000, BW average[MB/sec]: {}",
        bw.describe("MB/s")
    ));
    o.notes.push(format!(
        "ib_send_lat 64 B x 2000, t_typical[usec]: {}",
        lat.describe("us")
    ));
    let show = |r: Option<f64>| r.map_or("none".to_string(), |r| format!("{r:.3}"));
    let pct =
        |v: &mut Vec<f64>| median(v).map_or("?".to_string(), |m| format!("{:.0} %", m * 100.0));
    o.notes.push(format!(
        "the agent's CPU (user + system, of one CPU) while on, median: {} during ib_write_bw, {} during ib_send_lat",
        pct(&mut cpu_bw),
        pct(&mut cpu_lat)
    ));
    o.notes.push(format!(
        "{rounds} rounds; median on/off: bandwidth {}, latency {} (fails only below {MIN_BW_RATIO} / above {MAX_LAT_RATIO})",
        show(bw_ratio),
        show(lat_ratio)
    ));
    o.figures += 2;
    match bw_ratio {
        None => o.problem("no round gave a bandwidth with and without the agent".into()),
        Some(r) if r < MIN_BW_RATIO => o.problem(format!(
            "bandwidth with the agent {r:.3} of without it (below {MIN_BW_RATIO})"
        )),
        Some(_) => {}
    }
    match lat_ratio {
        None => o.problem("no round gave a latency with and without the agent".into()),
        Some(r) if r > MAX_LAT_RATIO => o.problem(format!(
            "latency with the agent {r:.3} times without it (above {MAX_LAT_RATIO})"
        )),
        Some(_) => {}
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
        let f = Figure {
            off: vec![Some(20.0), None, Some(25.0)],
            on: vec![Some(19.0), Some(30.0), Some(25.0)],
        };
        assert_eq!(f.ratios(), [0.95, 1.0]);
        assert_eq!(f.discarded(), 1);
        assert_eq!(median(&mut f.ratios()), Some(0.975));
        assert_eq!(median(&mut []), None);
    }
}
