//! `cudamem scale`: traces of one job at small batch sizes, scaled to a larger batch and
//! replayed: the peak reserved there per policy, and the largest batch that fits a GPU.
//! The work is `cudamem-estimate`'s; this file parses, prints and writes JSON.

use std::path::{Path, PathBuf};

use clap::Args;
use cudamem_alloc::size::human;
use cudamem_estimate::report::{largest_json, peak_json, quality_json};
use cudamem_estimate::{gpu_capacity, holdout, largest_batch, peak_at, Largest, Peak, ScaleModel};
use cudamem_replay::ReplayOptions;
use serde_json::json;

use crate::files::{output, Output};
use crate::{load, CliResult};

/// The arguments of `cudamem scale`.
#[derive(Args)]
pub struct ScaleArgs {
    /// Traces of the same job at different batch sizes (two or more).
    #[arg(required = true, num_args = 2..)]
    traces: Vec<PathBuf>,
    /// The batch size (or sequence length) of each trace, comma-separated, in the same order.
    #[arg(long, required = true, value_delimiter = ',', allow_hyphen_values = true, value_parser = crate::whole::<u64>)]
    batch: Vec<u64>,
    /// The batch to predict the peak reserved memory at.
    #[arg(long, allow_hyphen_values = true, value_parser = crate::whole::<u64>)]
    at: Option<u64>,
    /// A GPU to find the largest batch for.
    #[arg(long, allow_hyphen_values = true, help = crate::capacity_help("A GPU to find the largest batch for"))]
    capacity: Option<String>,
    /// Comma-separated policies (default: those `compare` runs).
    #[arg(long, alias = "policies")]
    policy: Option<String>,
    /// Allocator settings over the traces' own, in PYTORCH_CUDA_ALLOC_CONF syntax.
    #[arg(long)]
    config: Option<String>,
    /// Degree of the size fit: 1 (a + b*B, batch sizes) or 2 (for sequence lengths).
    #[arg(long, default_value_t = 1, allow_hyphen_values = true, value_parser = crate::whole::<usize>)]
    degree: usize,
    /// The largest batch the search for --capacity tries.
    #[arg(long, default_value_t = 1 << 20, allow_hyphen_values = true, value_parser = crate::whole::<u64>)]
    limit: u64,
    /// Write the trace scaled to --at (a PyTorch snapshot pickle, for replay, why, viz) to this
    /// file, never one of the inputs.
    #[arg(long)]
    write: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// The one-line answer: what the target batch needs and what fits the capacity.
pub fn headline(at: Option<&Peak>, l: Option<&Largest>) -> String {
    let mut parts = Vec::new();
    if let Some(p) = at {
        parts.push(format!(
            "at batch {} this job needs {} reserved",
            p.batch,
            human(p.peak_reserved)
        ));
    }
    if let Some(l) = l {
        parts.push(match (l.batch, l.limit_reached) {
            (None, _) => format!("not even batch 1 fits {}", human(l.capacity)),
            (Some(b), true) => format!("{b} (the search limit) fits with {} to spare", human(l.spare)),
            (Some(b), false) => format!("{b} fits with {} to spare", human(l.spare)),
        });
    }
    let policy = at
        .map(|p| &p.policy)
        .or(l.map(|l| &l.policy))
        .cloned()
        .unwrap_or_default();
    format!("{} ({policy})", parts.join("; "))
}

fn name(p: &Path) -> String {
    p.file_name()
        .map_or(p.display().to_string(), |n| n.to_string_lossy().into_owned())
}

/// Runs `cudamem scale`.
pub fn run(a: ScaleArgs) -> CliResult {
    let pols = crate::chosen_policies(a.policy.as_deref(), a.config.as_deref(), &crate::DEFAULT_POLICIES)?;
    if a.batch.len() != a.traces.len() {
        return Err(format!(
            "--batch gives {} sizes for {} traces: give one batch size per trace, in the same order",
            a.batch.len(),
            a.traces.len()
        )
        .into());
    }
    if a.at.is_none() && a.capacity.is_none() {
        return Err("nothing to predict: give --at BATCH, --capacity GPU, or both".into());
    }
    if a.at == Some(0) {
        return Err("--at 0: a batch of 0 allocates nothing".into());
    }
    if a.write.is_some() && a.at.is_none() {
        return Err("--write writes the trace scaled to --at: give --at too".into());
    }
    let write = match &a.write {
        Some(p) => match output("--write", p, &a.traces)? {
            Output::File(p) => Some(p),
            Output::Stdout => {
                return Err("--write -: the pickle would mix with the report on stdout; give a file name".into())
            }
        },
        None => None,
    };
    let capacity = a.capacity.as_deref().map(gpu_capacity).transpose()?;
    let traces = a.traces.iter().map(|p| load(p)).collect::<Result<Vec<_>, _>>()?;
    let model = ScaleModel::learn(&traces, &a.batch, a.degree)?;
    let opts = |p: &str| ReplayOptions {
        policy: p.to_string(),
        config: a.config.clone(),
        ..ReplayOptions::default()
    };
    let target = a.at.unwrap_or(model.base_batch());
    let mut q = model.quality(target);
    q.holdout_error = holdout(&traces, &a.batch, a.degree, &opts(&pols[0]))?;
    q.confidence = cudamem_estimate::confidence(&q);
    let mut peaks = Vec::new();
    if let Some(b) = a.at {
        for p in &pols {
            peaks.push(peak_at(&model, b, &opts(p))?);
        }
    }
    let mut larg = Vec::new();
    if let Some(c) = capacity {
        for p in &pols {
            larg.push(largest_batch(&model, &opts(p), c, a.limit)?);
        }
    }
    if let (Some(path), Some(b)) = (&write, a.at) {
        let f = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        cudamem_trace::write_snapshot_pickle(&model.at(b), std::io::BufWriter::new(f))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let line = headline(peaks.first(), larg.first());
    if a.json {
        outln!(
            "{}",
            json!({
                "traces": a.traces.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
                "batches": a.batch, "degree": a.degree, "quality": quality_json(&q),
                "at": peaks.iter().map(peak_json).collect::<Vec<_>>(),
                "largest": larg.iter().map(largest_json).collect::<Vec<_>>(),
                "headline": line,
            })
        );
        return Ok(());
    }
    let bs: Vec<String> = a.batch.iter().map(u64::to_string).collect();
    outln!(
        "{} traces at batch {} (base {}); alignment {}: {} allocations, {} matched, {} scale with the batch{}",
        traces.len(),
        bs.join(", "),
        name(&a.traces[model.alignment.base]),
        q.alignment,
        q.allocations,
        q.matched,
        q.scaling,
        if q.transient_kept > 0 {
            format!(", {} transient kept at their recorded size", q.transient_kept)
        } else {
            String::new()
        }
    );
    let hold = q
        .holdout_error
        .map_or("n/a (needs 3 traces)".to_string(), |e| format!("{:.2}%", 100.0 * e));
    if q.fit_exact_by_construction {
        outln!(
            "fit residuals: none by construction ({} traces for a degree-{} fit: it passes through each exactly); \
             hold-out error {hold}; confidence {}: a fit through {} traces cannot be judged, give one more trace",
            traces.len(),
            a.degree,
            q.confidence,
            traces.len()
        );
    } else {
        outln!(
            "fit residuals: {:.3}% of one allocation at most, {:.3}% of all bytes; hold-out error {hold}; confidence {}",
            100.0 * q.max_relative_residual,
            100.0 * q.residual_share,
            q.confidence
        );
    }
    if let Some(b) = a.at {
        outln!("at batch {b} ({:.2}x the largest recorded):", q.extrapolation);
        for p in &peaks {
            outln!(
                "  {:<20} peak reserved {:>12}  peak requested {:>12}",
                p.policy,
                human(p.peak_reserved),
                human(p.peak_requested)
            );
        }
    }
    if let Some(c) = capacity {
        outln!(
            "largest batch on {} ({}):",
            a.capacity.as_deref().unwrap_or(""),
            human(c)
        );
        for l in &larg {
            let next = l
                .next
                .map_or(String::new(), |(n, need)| format!("; batch {n} needs {}", human(need)));
            match l.batch {
                None => outln!("  {:<20} none fits{next}", l.policy),
                Some(b) => outln!(
                    "  {:<20} batch {b:<7} reserves {:>12} ({} to spare{}){next}{}",
                    l.policy,
                    human(l.peak_reserved),
                    human(l.spare),
                    l.fits_in.map_or(String::new(), |f| format!(
                        "; fits in {} of {} segment orders",
                        f.fit, f.orders
                    )),
                    if l.limit_reached { " (search limit reached)" } else { "" }
                ),
            }
        }
    }
    if q.scaling == 0 {
        outln!("no allocation changes size between the traces: the batch does not change this job's memory");
    }
    outln!("{line}");
    Ok(())
}
