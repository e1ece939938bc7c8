//! Reading samples out of a Prometheus text exposition (`GET /metrics`).

/// The value of the sample written exactly `series` (a name, with its labels when it
/// has any: `roce_events_total{kind="ce"}`); None when the exposition has no such line.
pub fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_exact_series_only() {
        let text = "# HELP a_total x\na_total 3\na_total_more 9\nb{k=\"v\"} 2.5\n";
        assert_eq!(value(text, "a_total"), Some(3.0));
        assert_eq!(value(text, "b{k=\"v\"}"), Some(2.5));
        assert_eq!(value(text, "b"), None);
        assert_eq!(value(text, "c"), None);
    }
}
