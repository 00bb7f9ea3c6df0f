//! The whole scaling answer as one JSON value, for bindings that hand it on (the Python
//! package's `cudamem.estimate.scale`), and the replay of one trace under several policies, for
//! the GPU-free estimate. The keys are those of `cudamem scale --json`.

use cudamem_replay::ReplayOptions;
use cudamem_trace::Trace;
use serde_json::{json, Value};

use crate::orders::replay_in_orders;
use crate::predict::{confidence, holdout, largest_batch, peak_at, Largest, Peak, Quality, ScaleModel};

/// What to predict from traces at several batch sizes.
#[derive(Clone, Debug)]
pub struct ScaleRequest {
    /// Batch size of each trace.
    pub batches: Vec<u64>,
    /// Batch to predict the peak at.
    pub at: Option<u64>,
    /// Capacity to find the largest batch for.
    pub capacity: Option<u64>,
    /// Policies, the first one's answer in the headline.
    pub policies: Vec<String>,
    /// Settings over the traces' own.
    pub config: Option<String>,
    /// Degree of the size fit.
    pub degree: usize,
    /// The largest batch the search tries.
    pub limit: u64,
}

/// A [`Peak`] as JSON.
pub fn peak_json(p: &Peak) -> Value {
    json!({"batch": p.batch, "policy": p.policy, "peak_reserved_bytes": p.peak_reserved, "peak_requested_bytes": p.peak_requested})
}

/// A [`Largest`] as JSON.
pub fn largest_json(l: &Largest) -> Value {
    json!({
        "policy": l.policy, "capacity_bytes": l.capacity, "largest_batch": l.batch,
        "peak_reserved_bytes": l.peak_reserved, "spare_bytes": l.spare,
        "next_batch": l.next.map(|n| n.0), "next_batch_needs_bytes": l.next.map(|n| n.1),
        "limit_reached": l.limit_reached,
        "orders": l.fits_in.map(|f| f.orders), "largest_fits_in": l.fits_in.map(|f| f.fit),
    })
}

/// A [`Quality`] as JSON.
pub fn quality_json(q: &Quality) -> Value {
    json!({
        "exact_alignment": q.exact_alignment, "alignment": q.alignment, "transient_kept": q.transient_kept,
        "allocations": q.allocations, "matched": q.matched,
        "scaling": q.scaling, "max_relative_residual": q.max_relative_residual,
        "residual_share": q.residual_share, "extrapolation": q.extrapolation,
        "holdout_error": q.holdout_error, "confidence": q.confidence,
    })
}

/// Frame names the GPU-free recorder (`cudamem.estimate`) gives the cuDNN workspaces it models.
/// PyTorch catches an out-of-memory error on them and asks for less (cuDNN's benchmark halves
/// its trial workspace; a plan whose workspace does not fit gives way to the next), so the
/// replays of an estimate shrink them instead of failing.
pub const SHRINKING_FRAMES: [&str; 2] = ["cuDNN workspace", "cuDNN benchmark workspace"];

fn opts(policy: &str, config: &Option<String>) -> ReplayOptions {
    ReplayOptions {
        policy: policy.to_string(),
        config: config.clone(),
        shrink_on_oom: SHRINKING_FRAMES.iter().map(|s| s.to_string()).collect(),
        ..ReplayOptions::default()
    }
}

/// Everything `cudamem scale` computes, as its `--json` object (without `traces`).
pub fn scale_report(traces: &[Trace], r: &ScaleRequest) -> Result<Value, String> {
    if r.policies.is_empty() {
        return Err("no policy given".into());
    }
    if r.at.is_none() && r.capacity.is_none() {
        return Err("nothing to predict: give a batch to predict at, a capacity, or both".into());
    }
    if r.at == Some(0) {
        return Err("a batch of 0 allocates nothing: predict at batch 1 or more".into());
    }
    let model = ScaleModel::learn(traces, &r.batches, r.degree)?;
    let mut q = model.quality(r.at.unwrap_or(model.base_batch()));
    q.holdout_error = holdout(traces, &r.batches, r.degree, &opts(&r.policies[0], &r.config))?;
    q.confidence = confidence(&q);
    let mut at = Vec::new();
    if let Some(b) = r.at {
        for p in &r.policies {
            at.push(peak_at(&model, b, &opts(p, &r.config))?);
        }
    }
    let mut largest = Vec::new();
    if let Some(c) = r.capacity {
        for p in &r.policies {
            largest.push(largest_batch(&model, &opts(p, &r.config), c, r.limit)?);
        }
    }
    Ok(json!({
        "batches": r.batches, "degree": r.degree, "quality": quality_json(&q),
        "at": at.iter().map(peak_json).collect::<Vec<_>>(),
        "largest": largest.iter().map(largest_json).collect::<Vec<_>>(),
    }))
}

/// The trace replayed with each policy on `capacity`: peaks, device allocations and failed
/// allocations per policy, with segments placed lowest first. With `orders` > 0 each row also
/// says in how many of `orders` + 1 segment orders (that one and `orders` seeded shuffles) the
/// trace ran without a failed allocation, the highest peak among those, and whether that is
/// enough to count as fitting ([`crate::orders`]).
pub fn replay_report(
    trace: &Trace,
    policies: &[String],
    capacity: u64,
    config: Option<String>,
    orders: u32,
) -> Result<Value, String> {
    let mut rows = Vec::new();
    for p in policies {
        let o = ReplayOptions {
            capacity,
            repeats: 0,
            plan_addresses: Some(false),
            ..opts(p, &config)
        };
        let (res, fit) = replay_in_orders(trace, &o, orders)?;
        let mut row = json!({
            "policy": p,
            "capacity_bytes": capacity,
            "peak_reserved_bytes": res.max(|d| d.peak_reserved_bytes),
            "peak_requested_bytes": res.max(|d| d.peak_requested_bytes),
            "peak_allocated_bytes": res.max(|d| d.peak_allocated_bytes),
            "device_allocs": res.total(|d| d.device_allocs),
            "ooms": res.total(|d| d.ooms),
        });
        if orders > 0 {
            row["orders"] = json!(fit.orders);
            row["orders_fit"] = json!(fit.fit);
            row["orders_fit_peak_reserved_bytes"] = json!(fit.peak_when_fit);
            row["orders_likely"] = json!(fit.likely());
        }
        rows.push(row);
    }
    Ok(Value::Array(rows))
}
