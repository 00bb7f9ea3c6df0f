//! Segment orders: near a cap, whether a job fits depends on where the driver put its segments.
//!
//! PyTorch's best fit takes the lowest-addressed of the free blocks of one size, so the order
//! of segments in the address space decides which segments hold the live blocks, and with it
//! how much the out-of-memory retry can release when memory runs short. The driver's order is
//! not known without running the job, and it differs from run to run. So a replay that decides
//! "fits" runs in several segment orders: the simulator's own (lowest address first) and
//! seeded shuffles ([`Placement::Shuffled`]); a job fits when it fits in at least
//! [`LIKELY_SHARE`] of them.
//!
//! [`LIKELY_SHARE`] is set from runs on an H200 (`docs/guide/will-it-fit.md`): every batch that
//! fit in 7 or more of 25 orders ran under the cap every time, the two that fit in 6 ran in most
//! runs, and every one that fit in 1 or none failed.

use cudamem_replay::{replay, Placement, ReplayOptions, ReplayResult};
use cudamem_trace::Trace;

/// Seeded shuffles a replay runs in beside the simulator's own order.
pub const ORDERS: u32 = 24;

/// The share of segment orders a job must fit in to count as fitting.
pub const LIKELY_SHARE: f64 = 0.1;

/// In how many segment orders a replay fitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrdersFit {
    /// Orders tried, the simulator's own included.
    pub orders: u32,
    /// Orders in which nothing failed.
    pub fit: u32,
    /// The highest peak reserved among those orders (what the job reserves where it fits).
    pub peak_when_fit: Option<u64>,
}

impl OrdersFit {
    /// Whether the job fits in at least [`LIKELY_SHARE`] of the orders (at least one).
    pub fn likely(&self) -> bool {
        self.fit >= ((LIKELY_SHARE * f64::from(self.orders)).ceil() as u32).max(1)
    }
}

/// `trace` replayed with `opts` in the simulator's own order and in `shuffles` seeded shuffles
/// (seeds 1..=`shuffles`, spread over the machine's cores; each replay is independent).
/// Returns the replay in the simulator's own order and the count. Requires a simulated device
/// (`opts.device == "sim"`); `opts.placement` is ignored.
pub fn replay_in_orders(
    trace: &Trace,
    opts: &ReplayOptions,
    shuffles: u32,
) -> Result<(ReplayResult, OrdersFit), String> {
    let run = |placement: Placement| {
        replay(
            trace,
            &ReplayOptions {
                placement,
                ..opts.clone()
            },
        )
    };
    let own = run(Placement::LowestFree)?;
    let mut count = OrdersFit {
        orders: shuffles + 1,
        fit: 0,
        peak_when_fit: None,
    };
    let mut add = |r: &ReplayResult| {
        if r.total(|d| d.ooms) == 0 {
            count.fit += 1;
            count.peak_when_fit = count.peak_when_fit.max(Some(r.max(|d| d.peak_reserved_bytes)));
        }
    };
    add(&own);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(shuffles as usize);
    let shuffled: Vec<Result<Vec<ReplayResult>, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads as u64)
            .map(|t| {
                let run = &run;
                scope.spawn(move || {
                    (1 + t..=u64::from(shuffles))
                        .step_by(threads)
                        .map(|seed| run(Placement::Shuffled(seed)))
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("a replay thread panicked".to_string())))
            .collect()
    });
    for part in shuffled {
        part?.iter().for_each(&mut add);
    }
    Ok((own, count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn likely_needs_the_share_and_at_least_one_order() {
        let f = |fit, orders| OrdersFit {
            orders,
            fit,
            peak_when_fit: None,
        };
        assert!(f(3, 25).likely() && !f(2, 25).likely());
        assert!(f(1, 1).likely() && !f(0, 1).likely());
        assert!(f(1, 10).likely() && !f(0, 10).likely());
    }
}
