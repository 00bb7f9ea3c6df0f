//! # Will it fit: a job's memory at a batch size it has not run at
//!
//! Given traces of one job recorded at two or more batch sizes (or sequence lengths), this crate
//! builds the trace of the same job at another size, replays it, and answers: how much memory
//! does the job reserve at batch `B` under each policy, and what is the largest batch that fits a
//! GPU of a given capacity, with how much to spare.
//!
//! ## How
//! 1. **Align** ([`align`](mod@align)): each trace's allocation events become a signature: the order of
//!    allocs, frees (naming the alloc they free) and cache releases, with streams by order of
//!    first use. When all traces have the same signature, the `k`-th allocation of one is the
//!    `k`-th of every other: the alignment is exact. Otherwise allocations are matched by their
//!    call site (stream and recorded stack) and occurrence number, and what stays unmatched keeps
//!    the size it has in the base trace (the one at the largest batch); the report says so.
//!    Between the two, when the traces differ only in *transient* allocations (freed before the
//!    next alloc: workspaces of kernels picked by size, as cuDNN autotuning picks them), the
//!    others correspond one to one and the transient ones are matched by their place.
//! 2. **Fit** ([`fit`]): each allocation's size as a polynomial of the batch (`a + b·B` by
//!    default, least squares over the traces), so allocations that do not depend on the batch
//!    (weights, optimizer state, workspaces) come out constant. A transient allocation whose
//!    sizes no polynomial follows (another algorithm at each size) keeps its base size.
//! 3. **Build and replay** ([`predict`]): the base trace with every allocation's size replaced by
//!    the fitted size at the new batch is replayed on the simulated GPU with `cudamem-replay`;
//!    the largest batch that fits a capacity is found by search, each candidate verified by a
//!    replay at that capacity (no out-of-memory error), near the cap in several segment orders
//!    ([`orders`]).
//!
//! ## How sure
//! [`Quality`] carries what the answer rests on: whether the alignment was exact, how many
//! allocations scale, the fit residuals, how far the target lies beyond the recorded batches,
//! and, with three or more traces, a hold-out check (the largest recorded trace predicted from
//! the others and compared with its own replay). It ends in a one-word confidence.
//!
//! Every input a user can get wrong (fewer than two traces, equal batch sizes, traces of
//! different devices, an unknown GPU name) is an error naming the problem.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod align;
pub mod fit;
pub mod gpus;
pub mod orders;
pub mod predict;
pub mod report;

pub use align::{align, Alignment, AlignmentKind};
pub use fit::{fit_sizes, SizeFit};
pub use gpus::{check_capacity, gpu_capacity, gpu_names, GPUS, MIN_CAPACITY};
pub use orders::{replay_in_orders, OrdersFit, LIKELY_SHARE, ORDERS};
pub use predict::{confidence, fits, holdout, largest_batch, peak_at, Largest, Peak, Quality, ScaleModel};
pub use report::{replay_report, scale_report, ScaleRequest};
