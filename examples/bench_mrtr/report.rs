//! The table: each server's figures and their ratios to the floor measured in the same run, then
//! whether the goals hold (memory store: at least half the floor's round trips per second, p99
//! within 2x and server CPU per round trip within 2.5x; Redis store: at least 0.3x the floor's
//! round trips per second).

use crate::footprint::holds;
use crate::load::Figures;

/// Prints one row per server; the first row is the floor.
pub fn table(rows: &[(&str, Figures)]) {
    let Some((_, floor)) = rows.first() else {
        return;
    };
    println!(
        "{:<10} {:>13} {:>8} {:>8} {:>7} {:>11} {:>10} {:>10} {:>10}",
        "server",
        "round trips/s",
        "p50 ms",
        "p99 ms",
        "errors",
        "CPU us/rt",
        "rt/s xfl",
        "p99 xfl",
        "CPU xfl"
    );
    for (name, figures) in rows {
        println!(
            "{name:<10} {:>13.0} {:>8.2} {:>8.2} {:>7} {:>11.1} {:>10.2} {:>10.2} {:>10.2}",
            figures.per_second,
            figures.p50_ms,
            figures.p99_ms,
            figures.errors,
            figures.cpu_us,
            ratio(figures.per_second, floor.per_second),
            ratio(figures.p99_ms, floor.p99_ms),
            ratio(figures.cpu_us, floor.cpu_us),
        );
    }
}

/// Prints whether the goals hold for the rows that have one.
pub fn goals(rows: &[(&str, Figures)]) {
    let Some((_, floor)) = rows.first() else {
        return;
    };
    for (name, figures) in rows {
        let throughput = ratio(figures.per_second, floor.per_second);
        let p99 = ratio(figures.p99_ms, floor.p99_ms);
        let cpu = ratio(figures.cpu_us, floor.cpu_us);
        match *name {
            "memory" => println!(
                "memory: round trips/s {throughput:.2}x floor (goal >= 0.5x: {}), p99 {p99:.2}x (goal <= 2x: {}), \
                 CPU per round trip {cpu:.2}x (goal <= 2.5x: {})",
                holds(throughput >= 0.5),
                holds(p99 <= 2.0),
                holds(cpu <= 2.5)
            ),
            "redis" => println!(
                "redis:  round trips/s {throughput:.2}x floor (goal >= 0.3x: {})",
                holds(throughput >= 0.3)
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
