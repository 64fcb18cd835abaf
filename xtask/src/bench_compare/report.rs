//! The table of `bench-compare`: median, p90, p99, the ratio to and distance from the bare
//! interpreter of the row's language, warm starts; then the isolation overhead figures.

use crate::bench::stats::Summary;
use crate::bench::Lang;

use super::rows::{Kind, Row};

pub fn print(rows: &[Row], notes: &[String], runs: usize) {
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(0) + 2;
    println!(
        "\n{runs} runs each, alternating; wall time in ms per start (MCP rows: per tools/call round trip)\n"
    );
    println!(
        "{:width$} {:>8} {:>8} {:>8} {:>8} {:>11}  start",
        "", "median", "p90", "p99", "vs bare", "over bare"
    );
    for r in rows {
        let s = Summary::of(&r.samples);
        let bare = bare_median(rows, r.lang);
        let over = match r.kind {
            Kind::Bare => "-".to_string(),
            _ => format!("{:+.2} ms", s.median - bare),
        };
        let line = format!(
            "{:width$} {:8.2} {:8.2} {:8.2} {:>7.2}x {over:>11}  {}",
            r.name,
            s.median,
            s.p90,
            s.p99,
            s.median / bare,
            starts(r),
        );
        println!("{}", line.trim_end());
    }
    println!("\nisolation overhead over the bare interpreter (medians):");
    for lang in [Lang::Python, Lang::TypeScript] {
        let over = |kind| {
            rows.iter()
                .find(|r| r.lang == lang && r.kind == kind)
                .map(|r| Summary::of(&r.samples).median - bare_median(rows, lang))
        };
        let line = match (over(Kind::Exec), over(Kind::Bwrap)) {
            (Some(e), Some(b)) => format!(
                "codebox exec {e:+.2} ms vs bwrap {b:+.2} ms (codebox exec - bwrap: {:+.2} ms)",
                e - b
            ),
            (None, Some(b)) => format!("bwrap {b:+.2} ms; codebox exec not measured"),
            _ => "not measured".into(),
        };
        println!("  {:11} {line}", format!("{}:", lang.name()));
    }
    for r in rows.iter().filter(|r| r.kind == Kind::Pooled) {
        let warm = r.starts.get("warm").copied().unwrap_or(0);
        if warm * 2 < r.samples.len() {
            println!(
                "note: {warm} of {} pooled {} calls were warm: the pool did not keep up",
                r.samples.len(),
                r.lang.tool()
            );
        }
    }
    for n in notes {
        println!("note: {n}");
    }
}

fn bare_median(rows: &[Row], lang: Lang) -> f64 {
    rows.iter()
        .find(|r| r.lang == lang && r.kind == Kind::Bare)
        .map_or(f64::NAN, |r| Summary::of(&r.samples).median)
}

/// `warm 98/100` for pooled rows, `cold 100/100` for the pool-off server.
fn starts(r: &Row) -> String {
    let want = match r.kind {
        Kind::Pooled => "warm",
        Kind::ServeCold => "cold",
        _ => return String::new(),
    };
    let n = r.samples.len();
    if r.starts.get("").copied() == Some(n) {
        return "start not reported".into();
    }
    format!("{want} {}/{n}", r.starts.get(want).copied().unwrap_or(0))
}
