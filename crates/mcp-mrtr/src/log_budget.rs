//! Log lines a client can cause at will (a refused Origin, a legacy session opened or ended, an
//! answer nobody waits for, no room for a task), let through a few a second each. A client
//! sending such requests as fast as it can would otherwise make the log grow as fast, and bury
//! everything else in it.
//! The lines held back are counted, and the next line let through says how many there were;
//! with metrics enabled, `mcp_log_lines_held_back_total{kind}` counts them too, so that those
//! of a flood's last second, which no later line may report, are not lost.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Lines of one kind let through each second.
const LINES_PER_SECOND: u32 = 5;

/// The budget of one kind of line, kept in a `static`:
///
/// ```
/// use mcp_mrtr::log_budget::LogBudget;
///
/// static DECLINED: LogBudget = LogBudget::new("declined");
///
/// if let Some(held_back) = DECLINED.take() {
///     tracing::info!(held_back, "a user declined");
/// }
/// ```
pub struct LogBudget {
    /// The `kind` label of the lines it holds back.
    kind: &'static str,
    window: Mutex<Window>,
}

struct Window {
    /// The second (since the Unix epoch) the count is for.
    second: u64,
    /// Lines let through in that second.
    written: u32,
    /// Lines held back since the last one let through.
    held_back: u64,
}

impl LogBudget {
    /// A budget of 5 lines a second for lines of `kind` (a fixed name, such as
    /// `"refused_origin"`: the label of the lines it holds back in the metrics).
    pub const fn new(kind: &'static str) -> Self {
        Self {
            kind,
            window: Mutex::new(Window {
                second: 0,
                written: 0,
                held_back: 0,
            }),
        }
    }

    /// `Some` with how many lines of this kind were held back before it, when a line may be
    /// written now; `None` when it is held back.
    pub fn take(&self) -> Option<u64> {
        let second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs());
        self.take_at(second)
    }

    fn take_at(&self, second: u64) -> Option<u64> {
        let mut window = self.window.lock().unwrap_or_else(|p| p.into_inner());
        if window.second != second {
            window.second = second;
            window.written = 0;
        }
        if window.written >= LINES_PER_SECOND {
            window.held_back += 1;
            crate::observe::log_line_held_back(self.kind);
            return None;
        }
        window.written += 1;
        Some(std::mem::take(&mut window.held_back))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_lines_a_second_go_through_and_the_next_one_counts_the_rest() {
        let budget = LogBudget::new("test");
        let first_second: Vec<_> = (0..8).map(|_| budget.take_at(100)).collect();
        assert_eq!(
            first_second,
            [
                Some(0),
                Some(0),
                Some(0),
                Some(0),
                Some(0),
                None,
                None,
                None
            ]
        );
        assert_eq!(budget.take_at(101), Some(3), "the three held back");
        assert_eq!(budget.take_at(101), Some(0));
    }
}
