//! The scaled trace, its replay, and the search for the largest batch that fits.
//!
//! A [`ScaleModel`] holds the base trace (the one at the largest recorded batch), the alignment
//! and one [`SizeFit`] per allocation. [`ScaleModel::at`] writes the base trace's events with
//! every allocation's size (on its alloc and its frees) replaced by the fitted size; the order of
//! events, streams, deferred frees and cache releases stay the base trace's. Segment events and
//! the dump-time segment list are dropped, and replays never plan the recorded segment
//! addresses, since they describe the recorded sizes, not the scaled ones.
//!
//! "Fits a capacity" means: the scaled trace replays on a simulated GPU of that capacity without
//! an out-of-memory error (the allocator may release its cache and retry on the way, as
//! PyTorch's does under `set_per_process_memory_fraction`). The largest batch is searched by
//! doubling from the largest recorded batch, then bisection, in the simulator's own segment
//! order; it assumes that a larger batch never needs less, and each answer is a replay, not an
//! interpolation. The same search then runs from that boundary with "fits in enough segment
//! orders" ([`crate::orders`]) as the test, which moves it by a few batches where it moves it.

use std::collections::HashMap;

use cudamem_alloc::size::human;
use cudamem_replay::{replay, ReplayOptions};
use cudamem_trace::{Action, Trace};

use crate::align::{align, Alignment};
use crate::fit::{fit_sizes, SizeFit};
use crate::orders::{replay_in_orders, OrdersFit, ORDERS};

/// A transient allocation (a workspace) whose fit misses one of its recorded sizes by more than
/// this share of its largest size keeps its base size: a size picked per batch (another
/// algorithm, another workspace) extrapolated along a line goes wherever the line goes, while
/// the base size is one the job really asked for near the target.
pub const TRANSIENT_FIT_TOLERANCE: f64 = 0.02;

/// What the scaling learned from the traces.
#[derive(Clone, Debug)]
pub struct ScaleModel {
    /// The trace at the largest recorded batch.
    pub base: Trace,
    /// The recorded batch sizes, in the order the traces were given.
    pub batches: Vec<u64>,
    /// The alignment of the traces' allocations.
    pub alignment: Alignment,
    /// Per device of the alignment, per allocation: its fitted size.
    pub fits: Vec<Vec<SizeFit>>,
    /// Per device, per allocation: whether it is a transient allocation kept at its base size
    /// because its recorded sizes follow no polynomial of the batch.
    pub kept: Vec<Vec<bool>>,
    /// Degree of the fitted polynomials.
    pub degree: usize,
}

/// What the answer rests on (see the crate doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Quality {
    /// Whether every trace had the same allocation sequence.
    pub exact_alignment: bool,
    /// How the allocations were matched ([`crate::AlignmentKind::label`]).
    pub alignment: &'static str,
    /// Transient allocations kept at their base size (their sizes follow no fit); left out of
    /// the residual figures.
    pub transient_kept: usize,
    /// Allocations of the base trace.
    pub allocations: usize,
    /// Of them, matched in every trace.
    pub matched: usize,
    /// Of them, with a size that changes with the batch.
    pub scaling: usize,
    /// Largest fit residual of one allocation over its largest recorded size.
    pub max_relative_residual: f64,
    /// Sum of the allocations' largest residuals over the sum of their base sizes.
    pub residual_share: f64,
    /// Target batch over the largest recorded batch (1 or less: interpolation).
    pub extrapolation: f64,
    /// With three or more traces: the relative error of the peak reserved predicted for the
    /// largest recorded batch from the others, against that trace's own replay.
    pub holdout_error: Option<f64>,
    /// Whether the traces are too few to judge the fit: a polynomial of degree d passes exactly
    /// through d + 1 traces, so their residuals are 0 whatever the job does.
    pub fit_exact_by_construction: bool,
    /// `high`, `medium`, `low`, or `unknown` (too few traces to judge, see
    /// `fit_exact_by_construction`).
    pub confidence: &'static str,
}

/// The peak of one replay of the scaled trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Peak {
    /// Batch size.
    pub batch: u64,
    /// Policy.
    pub policy: String,
    /// Peak reserved bytes (largest over devices).
    pub peak_reserved: u64,
    /// Peak requested bytes (largest over devices).
    pub peak_requested: u64,
    /// Simulated capacity it replayed on.
    pub capacity: u64,
    /// Allocations that failed at that capacity.
    pub ooms: u64,
}

/// The largest batch that fits a capacity.
#[derive(Clone, Debug, PartialEq)]
pub struct Largest {
    /// Policy.
    pub policy: String,
    /// The capacity.
    pub capacity: u64,
    /// The largest batch that fits; `None` when not even batch 1 does.
    pub batch: Option<u64>,
    /// Peak reserved at that batch on that capacity.
    pub peak_reserved: u64,
    /// Capacity minus that peak.
    pub spare: u64,
    /// The next batch (that does not fit) and what it would reserve on an unlimited GPU.
    pub next: Option<(u64, u64)>,
    /// The search stopped at its limit: even that batch fits.
    pub limit_reached: bool,
    /// In how many segment orders that batch fits ([`crate::orders`]); `None` when no batch
    /// fits.
    pub fits_in: Option<OrdersFit>,
}

impl ScaleModel {
    /// Learns the scaling from `traces[i]` recorded at `batches[i]`, fitting polynomials of
    /// `degree` (1 or 2).
    pub fn learn(traces: &[Trace], batches: &[u64], degree: usize) -> Result<ScaleModel, String> {
        if batches.contains(&0) {
            return Err("batch sizes start at 1: a batch of 0 records nothing to scale".into());
        }
        let refs: Vec<&Trace> = traces.iter().collect();
        let alignment = align(&refs, batches)?;
        let mut fits = Vec::new();
        let mut kept = Vec::new();
        for d in &alignment.devices {
            let (mut f, mut k) = (Vec::with_capacity(d.sizes.len()), Vec::with_capacity(d.sizes.len()));
            for (s, &transient) in d.sizes.iter().zip(&d.transient) {
                let fit = fit_sizes(batches, s, degree)?;
                let largest = s.iter().copied().max().unwrap_or(0).max(1) as f64;
                if transient && fit.max_residual > TRANSIENT_FIT_TOLERANCE * largest {
                    f.push(fit_sizes(batches, &vec![s[alignment.base]; s.len()], degree)?);
                    k.push(true);
                } else {
                    f.push(fit);
                    k.push(false);
                }
            }
            fits.push(f);
            kept.push(k);
        }
        falling_memory(&alignment, batches)?;
        Ok(ScaleModel {
            base: traces[alignment.base].clone(),
            batches: batches.to_vec(),
            alignment,
            fits,
            kept,
            degree,
        })
    }

    /// The largest recorded batch.
    pub fn base_batch(&self) -> u64 {
        self.batches[self.alignment.base]
    }

    /// The job's trace at `batch`.
    pub fn at(&self, batch: u64) -> Trace {
        let mut t = self.base.clone();
        t.source = format!("{} scaled to batch {batch}", self.base.source);
        t.segments.clear();
        for (d, fits) in self.alignment.devices.iter().zip(&self.fits) {
            let Some(dt) = t.devices.iter_mut().find(|x| x.device == d.device) else {
                continue;
            };
            dt.events
                .retain(|e| !matches!(e.action, Action::SegmentAlloc | Action::SegmentMap));
            let mut owner = d.owner.iter();
            // Owners were computed on the unfiltered events: walk both in step.
            let base = self.base.device(d.device).map(|x| x.events.as_slice()).unwrap_or(&[]);
            let mut out = dt.events.iter_mut();
            for e in base {
                let o = owner.next().copied().flatten();
                if matches!(e.action, Action::SegmentAlloc | Action::SegmentMap) {
                    continue;
                }
                let Some(x) = out.next() else { break };
                if let Some(k) = o {
                    x.size = fits[k as usize].at(batch);
                }
            }
        }
        t
    }

    /// The quality figures that need no replay, for a prediction at `target`.
    pub fn quality(&self, target: u64) -> Quality {
        let a = &self.alignment;
        let (mut scaling, mut max_rel, mut res, mut total) = (0usize, 0.0f64, 0.0f64, 0.0f64);
        let mut transient_kept = 0;
        for ((d, fits), kept) in a.devices.iter().zip(&self.fits).zip(&self.kept) {
            for ((s, f), &k) in d.sizes.iter().zip(fits).zip(kept) {
                if k {
                    transient_kept += 1;
                    continue;
                }
                if !f.constant {
                    scaling += 1;
                }
                let big = s.iter().copied().max().unwrap_or(0).max(1) as f64;
                max_rel = max_rel.max(f.max_residual / big);
                res += f.max_residual;
                total += s[a.base] as f64;
            }
        }
        let mut q = Quality {
            exact_alignment: a.kind == crate::AlignmentKind::Exact,
            alignment: a.kind.label(),
            transient_kept,
            allocations: a.allocations(),
            matched: a.matched(),
            scaling,
            max_relative_residual: max_rel,
            residual_share: if total > 0.0 { res / total } else { 0.0 },
            extrapolation: target as f64 / self.base_batch() as f64,
            holdout_error: None,
            fit_exact_by_construction: self.batches.len() <= self.degree + 1,
            confidence: "",
        };
        q.confidence = confidence(&q);
        q
    }
}

/// Refuses traces whose matched allocations total less at the largest batch than at the
/// smallest: memory that falls as the batch grows is almost always batch sizes given in
/// another order than the traces, and a fit through them predicts less memory for more work.
fn falling_memory(a: &Alignment, batches: &[u64]) -> Result<(), String> {
    let total = |i: usize| -> u128 {
        a.devices
            .iter()
            .flat_map(|d| d.sizes.iter().zip(&d.matched))
            .filter(|(_, &m)| m)
            .map(|(s, _)| u128::from(s.get(i).copied().unwrap_or(0)))
            .sum()
    };
    let lo = (0..batches.len()).min_by_key(|&i| batches[i]).unwrap_or(0);
    let hi = (0..batches.len()).max_by_key(|&i| batches[i]).unwrap_or(0);
    let (small, large) = (total(lo), total(hi));
    if large < small {
        let h = |b: u128| human(u64::try_from(b).unwrap_or(u64::MAX));
        return Err(format!(
            "memory falls as the batch grows: the allocations of trace {} (batch {}) total {}, those of \
             trace {} (batch {}) {}; give the batch sizes in the order of the traces",
            hi + 1,
            batches[hi],
            h(large),
            lo + 1,
            batches[lo],
            h(small)
        ));
    }
    Ok(())
}

/// The one-word confidence of a [`Quality`].
pub fn confidence(q: &Quality) -> &'static str {
    let matched = q.matched as f64 / q.allocations.max(1) as f64;
    let hold = q.holdout_error.unwrap_or(0.0);
    if matched < 0.9 || q.residual_share > 0.05 || hold > 0.05 || q.extrapolation > 32.0 {
        "low"
    } else if q.fit_exact_by_construction && q.holdout_error.is_none() {
        "unknown"
    } else if q.exact_alignment && q.residual_share <= 0.001 && hold <= 0.01 && q.extrapolation <= 8.0 {
        "high"
    } else {
        "medium"
    }
}

fn scaled_opts(opts: &ReplayOptions, capacity: u64) -> ReplayOptions {
    ReplayOptions {
        capacity,
        repeats: 0,
        plan_addresses: Some(false),
        ..opts.clone()
    }
}

fn run(t: &Trace, batch: u64, opts: &ReplayOptions, capacity: u64) -> Result<Peak, String> {
    let r = replay(t, &scaled_opts(opts, capacity))?;
    Ok(Peak {
        batch,
        policy: opts.policy.clone(),
        peak_reserved: r.max(|d| d.peak_reserved_bytes),
        peak_requested: r.max(|d| d.peak_requested_bytes),
        capacity,
        ooms: r.total(|d| d.ooms),
    })
}

/// Peak reserved at `batch` on a GPU large enough that nothing fails: `opts.capacity` first,
/// doubled while allocations fail (as far as the simulated GPU's address space allows).
pub fn peak_at(model: &ScaleModel, batch: u64, opts: &ReplayOptions) -> Result<Peak, String> {
    peak_of(&model.at(batch), batch, opts)
}

fn peak_of(t: &Trace, batch: u64, opts: &ReplayOptions) -> Result<Peak, String> {
    let first = opts.capacity.max(1 << 30);
    let mut cap = first;
    loop {
        // Past the first capacity the capacity is the search's, not the caller's: a replay
        // refused there (the simulated GPU cannot model that much memory for this job; any other
        // refusal would have come at the first) says that the batch does not fit, without
        // naming a capacity nobody gave.
        let p = match run(t, batch, opts, cap) {
            Ok(p) => p,
            Err(_) if cap > first => {
                return Err(format!(
                    "batch {batch} needs more than {} (it runs out of memory there), more than the \
                     simulated GPU can model for this job: predict at a smaller batch",
                    human(cap / 2)
                ))
            }
            Err(e) => return Err(e),
        };
        if p.ooms == 0 {
            return Ok(p);
        }
        cap = cap
            .checked_mul(2)
            .ok_or_else(|| format!("batch {batch} does not fit in any simulated GPU"))?;
    }
}

/// Whether `batch` replays on `capacity` without an out-of-memory error, and its peak there.
pub fn fits(model: &ScaleModel, batch: u64, opts: &ReplayOptions, capacity: u64) -> Result<(bool, Peak), String> {
    let p = run(&model.at(batch), batch, opts, capacity)?;
    Ok((p.ooms == 0, p))
}

/// The largest batch up to `limit` that fits `capacity` (see the module doc).
pub fn largest_batch(model: &ScaleModel, opts: &ReplayOptions, capacity: u64, limit: u64) -> Result<Largest, String> {
    let limit = limit.max(1);
    let none = |model: &ScaleModel| -> Result<Largest, String> {
        Ok(Largest {
            policy: opts.policy.clone(),
            capacity,
            batch: None,
            peak_reserved: 0,
            spare: 0,
            next: Some((1, peak_at(model, 1, opts)?.peak_reserved)),
            limit_reached: false,
            fits_in: None,
        })
    };
    // The boundary in the simulator's own order first (one replay a probe), then the boundary
    // in enough segment orders searched from there (25 replays a probe, few probes: the orders
    // move it by a few batches at most).
    let (own, _) = boundary(model.base_batch(), limit, |b| Ok(fits(model, b, opts, capacity)?.0))?;
    let mut counted: HashMap<u64, OrdersFit> = HashMap::new();
    let (lo, limit_reached) = boundary(own.max(1), limit, |b| {
        let f = replay_in_orders(&model.at(b), &scaled_opts(opts, capacity), ORDERS)?.1;
        counted.insert(b, f);
        Ok(f.likely())
    })?;
    if lo == 0 {
        return none(model);
    }
    let fit = counted[&lo];
    let peak = match fit.peak_when_fit {
        Some(p) => p,
        None => fits(model, lo, opts, capacity)?.1.peak_reserved,
    };
    let next = if limit_reached {
        None
    } else {
        Some((lo + 1, peak_at(model, lo + 1, opts)?.peak_reserved))
    };
    Ok(Largest {
        policy: opts.policy.clone(),
        capacity,
        batch: Some(lo),
        peak_reserved: peak,
        spare: capacity.saturating_sub(peak),
        next,
        limit_reached,
        fits_in: Some(fit),
    })
}

/// The largest batch `b` in `1..=limit` with `fits(b)` and not `fits(b + 1)` (0 when not even
/// batch 1 fits), found by galloping from `from` (up by 1, 2, 4, ... while it fits, down while
/// it does not) and bisecting; and whether the search stopped at `limit` with that batch
/// fitting. Assumes `fits` is monotone (a larger batch never needs less); where it is not, the
/// answer is still a batch seen to fit whose successor was seen to fail.
fn boundary(from: u64, limit: u64, mut fits: impl FnMut(u64) -> Result<bool, String>) -> Result<(u64, bool), String> {
    let from = from.clamp(1, limit);
    let (mut lo, mut hi) = (0u64, None::<u64>); // lo fits (0: none seen); hi fails
    let mut step = 1u64;
    if fits(from)? {
        lo = from;
        while hi.is_none() {
            if lo == limit {
                return Ok((lo, true));
            }
            let b = lo.saturating_add(step).min(limit);
            if fits(b)? {
                lo = b;
                step = step.saturating_mul(2);
            } else {
                hi = Some(b);
            }
        }
    } else {
        hi = Some(from);
        while lo == 0 && hi > Some(1) {
            let b = hi.unwrap().saturating_sub(step).max(1);
            if fits(b)? {
                lo = b;
            } else {
                hi = Some(b);
                step = step.saturating_mul(2);
            }
        }
        if lo == 0 {
            return Ok((0, false));
        }
    }
    let mut hi = hi.expect("a failing batch above the fitting one");
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid)? {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Ok((lo, false))
}

/// With three or more traces: the largest recorded trace's peak reserved predicted from the
/// others, and its relative error against that trace's own replay (with `opts`).
pub fn holdout(traces: &[Trace], batches: &[u64], degree: usize, opts: &ReplayOptions) -> Result<Option<f64>, String> {
    if traces.len() < 3 || traces.len() <= degree + 1 {
        return Ok(None);
    }
    let top = (0..batches.len()).max_by_key(|&i| batches[i]).unwrap_or(0);
    let (mut ts, mut bs) = (Vec::new(), Vec::new());
    for i in (0..traces.len()).filter(|&i| i != top) {
        ts.push(traces[i].clone());
        bs.push(batches[i]);
    }
    let m = ScaleModel::learn(&ts, &bs, degree)?;
    let predicted = peak_at(&m, batches[top], opts)?.peak_reserved as f64;
    let actual = peak_of(&traces[top], batches[top], opts)?.peak_reserved as f64;
    Ok(Some((predicted - actual).abs() / actual.max(1.0)))
}
