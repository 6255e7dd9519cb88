//! The table: each server's figures and their ratios to its floor measured in the same run (the
//! round-trip floor for MRTR rows, the single-call floor for single calls), then whether the goals
//! hold.

use crate::footprint::holds;
use crate::load::Figures;

/// The floor a row is measured against.
fn floor_of(name: &str) -> &'static str {
    match name {
        "floor-call" | "recommend" | "summarize" => "floor-call",
        _ => "floor",
    }
}

/// A row's figures as multiples of its floor's: throughput, p99 and CPU per round trip.
struct Ratios {
    throughput: f64,
    p99: f64,
    cpu: f64,
}

fn ratios(rows: &[(&str, Figures)], name: &str, figures: &Figures) -> Option<Ratios> {
    let floor_name = floor_of(name);
    let (_, floor) = rows.iter().find(|(row, _)| *row == floor_name)?;
    Some(Ratios {
        throughput: ratio(figures.per_second, floor.per_second),
        p99: ratio(figures.p99_ms, floor.p99_ms),
        cpu: ratio(figures.cpu_us, floor.cpu_us),
    })
}

/// Prints one row per server.
pub fn table(rows: &[(&str, Figures)]) {
    println!(
        "{:<12} {:>13} {:>8} {:>8} {:>7} {:>11} {:>10} {:>10} {:>10}",
        "server",
        "per second",
        "p50 ms",
        "p99 ms",
        "errors",
        "CPU us/rt",
        "rt/s xfl",
        "p99 xfl",
        "CPU xfl"
    );
    for (name, figures) in rows {
        let Some(r) = ratios(rows, name, figures) else {
            continue;
        };
        println!(
            "{name:<12} {:>13.0} {:>8.2} {:>8.2} {:>7} {:>11.1} {:>10.2} {:>10.2} {:>10.2}",
            figures.per_second,
            figures.p50_ms,
            figures.p99_ms,
            figures.errors,
            figures.cpu_us,
            r.throughput,
            r.p99,
            r.cpu,
        );
    }
}

/// Prints whether the goals hold for the rows that have one.
pub fn goals(rows: &[(&str, Figures)]) {
    for (name, figures) in rows {
        let Some(r) = ratios(rows, name, figures) else {
            continue;
        };
        let (throughput, p99, cpu) = (r.throughput, r.p99, r.cpu);
        match *name {
            "memory" => println!(
                "memory:       round trips/s {throughput:.2}x floor (goal >= 0.75x: {}), p99 {p99:.2}x \
                 (goal <= 2x: {}), CPU per round trip {cpu:.2}x (goal <= 1.5x: {})",
                holds(throughput >= 0.75),
                holds(p99 <= 2.0),
                holds(cpu <= 1.5)
            ),
            "redis" => println!(
                "redis:        round trips/s {throughput:.2}x floor (goal >= 0.6x: {})",
                holds(throughput >= 0.6)
            ),
            "watchlist" => println!(
                "watchlist:    round trips/s {throughput:.2}x floor (goal >= 0.15x: {}), p99 {p99:.2}x \
                 (goal <= 5x: {}), CPU per round trip {cpu:.2}x (goal <= 8x: {})",
                holds(throughput >= 0.15),
                holds(p99 <= 5.0),
                holds(cpu <= 8.0)
            ),
            "watchlist-otel" => {
                let plain = rows
                    .iter()
                    .find(|(row, _)| *row == "watchlist")
                    .map(|(_, plain)| ratio(figures.per_second, plain.per_second));
                println!(
                    "watchlist-otel: round trips/s {throughput:.2}x floor, {:.2}x watchlist without export; \
                     CPU per round trip {cpu:.2}x floor",
                    plain.unwrap_or_default()
                );
            }
            "memory-base" | "redis-base" => {
                let this = name.trim_end_matches("-base");
                let now = rows
                    .iter()
                    .find(|(row, _)| *row == this)
                    .map(|(_, now)| ratio(now.per_second, figures.per_second));
                if let Some(now) = now {
                    println!(
                        "{:<13} this build's {this} row runs at {now:.3}x the earlier build's \
                         round trips/s (goal >= 0.95x: {})",
                        format!("{name}:"),
                        holds(now >= 0.95)
                    );
                }
            }
            "watchlist-pg" => println!(
                "watchlist-pg: round trips/s {throughput:.2}x floor (goal >= 0.1x: {})",
                holds(throughput >= 0.1)
            ),
            "recommend" | "summarize" => println!(
                "{:<13} calls/s {throughput:.2}x the single-call floor (goal >= 0.5x: {})",
                format!("{name}:"),
                holds(throughput >= 0.5)
            ),
            _ => {}
        }
    }
}

fn ratio(value: f64, baseline: f64) -> f64 {
    if baseline > 0.0 {
        value / baseline
    } else {
        0.0
    }
}
