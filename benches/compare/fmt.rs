//! Formatting of numbers and tables shared by the sections.

use super::*;

// ---------------------------------------------------------------- formatting

/// Median, p90 and maximum of `v` (NaN when empty).
pub(super) fn stats(v: &[f64]) -> (f64, f64, f64) {
    let s = support::stats::summarize(v);
    (s.median, s.p90, s.max)
}

/// `a ÷ b` with two significant digits, "—" when undefined.
pub(super) fn ratio(a: f64, b: f64) -> String {
    if !(a.is_finite() && b.is_finite()) || b <= 0.0 {
        return "—".into();
    }
    let r = a / b;
    if r == 0.0 {
        return "0×".into();
    }
    let digits = (1 - r.abs().log10().floor() as i32).clamp(0, 6) as usize;
    format!("{r:.digits$}×")
}

pub(super) fn fmt_ms(ms: f64) -> String {
    if !ms.is_finite() {
        "—".into()
    } else if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else {
        format!("{ms:.2} ms")
    }
}

pub(super) fn fmt_rate(r: f64) -> String {
    if r == 0.0 {
        "0".into()
    } else if r < 0.1 {
        format!("{r:.3}")
    } else {
        format!("{r:.1}")
    }
}

pub(super) fn stats_json(v: &[f64]) -> Value {
    let (m, p, x) = stats(v);
    let min = v.iter().copied().fold(f64::INFINITY, f64::min);
    json!({"median": m, "p90": p, "max": x, "min": min, "n": v.len(), "all": v})
}

pub(super) fn jf(v: &Value, path: &[&str]) -> f64 {
    let mut cur = v;
    for p in path {
        cur = &cur[*p];
    }
    cur.as_f64().unwrap_or(f64::NAN)
}

pub(super) struct Section {
    pub(super) title: String,
    pub(super) md: String,
    pub(super) json: Value,
}

// ---------------------------------------------------------------- sections

pub(super) fn election_table(
    md: &mut String,
    res: &BTreeMap<Tool, Vec<f64>>,
    notes: &BTreeMap<Tool, String>,
) {
    md.push_str("| tool | trials | median | p90 | max | ours ÷ this (median) |\n");
    md.push_str("|---|---|---|---|---|---|\n");
    for tool in TOOLS {
        let Some(v) = res.get(&tool) else {
            continue;
        };
        let (m, p, x) = stats(v);
        let ours = res
            .get(&tool.ours_here())
            .map(|o| stats(o).0)
            .unwrap_or(f64::NAN);
        let r = if tool.ours() {
            "—".into()
        } else {
            ratio(ours, m)
        };
        let note = notes
            .get(&tool)
            .map(|n| format!(" {n}"))
            .unwrap_or_default();
        let _ = writeln!(
            md,
            "| {}{note} | {} | {} | {} | {} | {r} |",
            tool.label(),
            v.len(),
            fmt_ms(m),
            fmt_ms(p),
            fmt_ms(x)
        );
    }
}
