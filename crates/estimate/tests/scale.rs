//! Scaling on synthetic jobs whose trace at any batch is known, so every prediction can be
//! checked against the replay of the job's own trace at that batch; plus a shipped real trace.

use cudamem_estimate::{fits, gpu_capacity, holdout, largest_batch, peak_at, ScaleModel};
use cudamem_replay::{replay, ReplayOptions};
use cudamem_trace::{Action, DeviceTrace, Frame, Stack, Trace, TraceEvent};

const MIB: u64 = 1 << 20;

/// The allocation a job makes only at batch 16 and up.
#[derive(Clone, Copy)]
enum Extra {
    None,
    /// Freed before the next allocation (a workspace).
    Transient,
    /// Alive while another allocation is made.
    Kept,
}

/// A small training-like job at `batch`: weights and optimizer state that do not depend on the
/// batch, then `steps` steps of forward activations kept for backward (growing with the batch),
/// a workspace whose size does not, gradients, and the activations freed in reverse order. With
/// `extra`, the job makes one more allocation per layer at large batches (as an algorithm choice
/// can), recorded with its own stack.
fn job(batch: u64, steps: usize, extra: Extra) -> Trace {
    let mut t = Trace::new(format!("job-b{batch}"));
    t.stacks = (0..8)
        .map(|i| Stack {
            frames: vec![Frame {
                name: format!("site{i}"),
                filename: "model.py".into(),
                line: i,
            }],
        })
        .collect();
    let mut ev = Vec::new();
    let mut next = 0x7f00_0000_0000u64;
    let mut alloc = |ev: &mut Vec<TraceEvent>, size: u64, site: u32| {
        next += 1 << 32;
        ev.push(TraceEvent {
            action: Action::Alloc,
            addr: next,
            size,
            stream: 7,
            time_us: ev.len() as i64,
            stack: Some(site),
        });
        (next, size)
    };
    let free = |ev: &mut Vec<TraceEvent>, (addr, size): (u64, u64)| {
        for action in [Action::FreeRequested, Action::FreeCompleted] {
            ev.push(TraceEvent {
                action,
                addr,
                size,
                stream: 7,
                time_us: ev.len() as i64,
                stack: None,
            });
        }
    };
    let weights: Vec<_> = (0..6)
        .map(|i| alloc(&mut ev, (40 + 7 * i) * MIB + 512 * i, 0))
        .collect();
    for _ in 0..steps {
        let input = alloc(&mut ev, batch * 3 * MIB, 1);
        let mut acts = Vec::new();
        for l in 0..6u64 {
            acts.push(alloc(&mut ev, batch * (5 + l) * MIB / 2 + 4096, 2));
            let ws = alloc(&mut ev, 32 * MIB, 3);
            match extra {
                Extra::Transient if batch >= 16 => {
                    free(&mut ev, ws);
                    let e = alloc(&mut ev, batch * MIB, 4);
                    free(&mut ev, e);
                }
                Extra::Kept if batch >= 16 => {
                    let e = alloc(&mut ev, batch * MIB, 4);
                    free(&mut ev, ws);
                    let w2 = alloc(&mut ev, 4096, 6);
                    free(&mut ev, e);
                    free(&mut ev, w2);
                }
                _ => free(&mut ev, ws),
            }
        }
        for a in acts.into_iter().rev() {
            let g = alloc(&mut ev, a.1, 5);
            free(&mut ev, a);
            free(&mut ev, g);
        }
        free(&mut ev, input);
    }
    drop(weights);
    t.devices.push(DeviceTrace { device: 0, events: ev });
    t
}

fn opts(policy: &str) -> ReplayOptions {
    ReplayOptions {
        policy: policy.into(),
        repeats: 0,
        plan_addresses: Some(false),
        ..ReplayOptions::default()
    }
}

fn own_peak(t: &Trace, policy: &str, capacity: u64) -> (u64, u64) {
    let r = replay(
        t,
        &ReplayOptions {
            capacity,
            ..opts(policy)
        },
    )
    .unwrap();
    (r.max(|d| d.peak_reserved_bytes), r.total(|d| d.ooms))
}

#[test]
fn linear_job_predicts_the_peak_of_its_own_trace_exactly() {
    let traces = vec![job(2, 3, Extra::None), job(4, 3, Extra::None), job(8, 3, Extra::None)];
    let m = ScaleModel::learn(&traces, &[2, 4, 8], 1).unwrap();
    let q = m.quality(64);
    assert!(q.exact_alignment);
    assert_eq!(q.matched, q.allocations);
    assert!(
        q.scaling > 0 && q.scaling < q.allocations,
        "weights and workspaces stay constant"
    );
    assert!(q.residual_share < 1e-9);
    for policy in ["pytorch", "pytorch-expandable", "cudamem"] {
        let p = peak_at(&m, 64, &opts(policy)).unwrap();
        assert_eq!(
            p.peak_reserved,
            own_peak(&job(64, 3, Extra::None), policy, 1 << 40).0,
            "{policy}"
        );
        assert_eq!(p.policy, policy);
    }
    assert_eq!(holdout(&traces, &[2, 4, 8], 1, &opts("pytorch")).unwrap(), Some(0.0));
}

#[test]
fn the_largest_batch_fits_and_the_next_does_not() {
    let m = ScaleModel::learn(&[job(2, 2, Extra::None), job(4, 2, Extra::None)], &[2, 4], 1).unwrap();
    let cap = gpu_capacity("24GiB").unwrap();
    for policy in ["pytorch", "cudamem"] {
        let l = largest_batch(&m, &opts(policy), cap, 1 << 16).unwrap();
        let b = l.batch.expect("some batch fits 24 GiB");
        assert!(!l.limit_reached);
        // Verified against the job's own traces, not the model's.
        assert_eq!(
            own_peak(&job(b, 2, Extra::None), policy, cap).1,
            0,
            "{policy}: batch {b} fits"
        );
        assert!(
            own_peak(&job(b + 1, 2, Extra::None), policy, cap).1 > 0,
            "{policy}: batch {} fails",
            b + 1
        );
        assert_eq!(l.spare, cap - own_peak(&job(b, 2, Extra::None), policy, cap).0);
        let (n, need) = l.next.unwrap();
        assert_eq!(n, b + 1);
        assert!(need > cap - l.spare);
        assert!(fits(&m, b, &opts(policy), cap).unwrap().0);
    }
    let tiny = largest_batch(&m, &opts("pytorch"), 64 * MIB, 100).unwrap();
    assert_eq!(tiny.batch, None);
    // A search limit below the recorded batches stops there.
    for limit in [0, 1, 3] {
        let l = largest_batch(&m, &opts("pytorch"), cap, limit).unwrap();
        assert_eq!(l.batch, Some(limit.max(1)));
        assert!(l.limit_reached);
    }
}

#[test]
fn an_allocation_seen_only_at_some_batches_is_aligned_by_call_site() {
    // At 16 and 32 each layer makes one more allocation that lives while others are made: the
    // signatures differ from batch 8's, with or without transient allocations.
    let traces = vec![job(8, 2, Extra::Kept), job(16, 2, Extra::Kept), job(32, 2, Extra::Kept)];
    let m = ScaleModel::learn(&traces, &[8, 16, 32], 1).unwrap();
    let q = m.quality(64);
    assert!(!q.exact_alignment);
    assert_eq!(q.alignment, "by call site");
    let unmatched = q.allocations - q.matched;
    // The 24 extra allocations have no counterpart at batch 8; a few neighbours whose lifetime
    // class they change may lose theirs too.
    assert!((24..=32).contains(&unmatched), "{unmatched} unmatched");
    assert_ne!(q.confidence, "high");
    // The unmatched ones keep their base size (32 MiB at batch 32) instead of scaling to 64 MiB:
    // the prediction stays within a few percent of the truth.
    let p = peak_at(&m, 64, &opts("pytorch")).unwrap().peak_reserved as f64;
    let truth = own_peak(&job(64, 2, Extra::Kept), "pytorch", 1 << 40).0 as f64;
    assert!((p - truth).abs() / truth < 0.05, "{p} vs {truth}");
}

#[test]
fn a_workspace_seen_only_at_some_batches_leaves_the_rest_aligned_one_to_one() {
    // The extra allocation is freed before the next one: without it the traces agree, so every
    // other allocation is matched and only the 12 workspaces of batch 8's missing algorithm are
    // not; they keep their base size.
    let traces = vec![
        job(8, 2, Extra::Transient),
        job(16, 2, Extra::Transient),
        job(32, 2, Extra::Transient),
    ];
    let m = ScaleModel::learn(&traces, &[8, 16, 32], 1).unwrap();
    let q = m.quality(64);
    assert_eq!(q.alignment, "exact except transient allocations");
    assert_eq!(q.allocations - q.matched, 12);
    assert_ne!(q.confidence, "high");
    let p = peak_at(&m, 64, &opts("pytorch")).unwrap().peak_reserved as f64;
    let truth = own_peak(&job(64, 2, Extra::Transient), "pytorch", 1 << 40).0 as f64;
    assert!((p - truth).abs() / truth < 0.05, "{p} vs {truth}");
    // A workspace matched at every batch but with sizes no line follows keeps its base size.
    let mut traces = vec![job(8, 2, Extra::None), job(16, 2, Extra::None), job(32, 2, Extra::None)];
    for (t, size) in traces.iter_mut().zip([48 * MIB, 2 * MIB, 40 * MIB]) {
        for e in t.devices[0].events.iter_mut().filter(|e| e.stack == Some(3)) {
            e.size = size;
        }
    }
    let m = ScaleModel::learn(&traces, &[8, 16, 32], 1).unwrap();
    assert!(m.quality(64).transient_kept > 0);
    assert_eq!(m.quality(64).alignment, "exact", "only sizes differ");
    let t = m.at(64);
    assert!(t.devices[0]
        .events
        .iter()
        .filter(|e| e.stack == Some(3))
        .all(|e| e.size == 40 * MIB));
}

#[test]
fn quadratic_fit_for_sequence_lengths() {
    // Sizes quadratic in the "batch" (a sequence length): degree 2 extrapolates them exactly.
    let sq = |l: u64| {
        let mut t = job(1, 1, Extra::None);
        for e in &mut t.devices[0].events {
            if e.stack == Some(2) || e.action != Action::Alloc {
                e.size = e.size.max(1);
            }
        }
        let mut sizes = std::collections::HashMap::new();
        for e in &mut t.devices[0].events {
            if e.action == Action::Alloc && e.stack == Some(2) {
                e.size = l * l * 64 + l * 4096;
                sizes.insert(e.addr, e.size);
            } else if let Some(s) = sizes.get(&e.addr) {
                e.size = *s;
            }
        }
        t
    };
    let traces = vec![sq(128), sq(256), sq(512)];
    let m = ScaleModel::learn(&traces, &[128, 256, 512], 2).unwrap();
    let p = peak_at(&m, 2048, &opts("pytorch")).unwrap();
    assert_eq!(p.peak_reserved, own_peak(&sq(2048), "pytorch", 1 << 40).0);
    let lin = ScaleModel::learn(&traces, &[128, 256, 512], 1).unwrap();
    assert!(lin.quality(2048).residual_share > 0.01, "a line does not fit a square");
}

#[test]
fn inputs_a_user_can_get_wrong_are_named() {
    let a = job(2, 1, Extra::None);
    let b = job(4, 1, Extra::None);
    let err = |r: Result<ScaleModel, String>| r.unwrap_err();
    assert!(err(ScaleModel::learn(std::slice::from_ref(&a), &[2], 1)).contains("two or more"));
    assert!(err(ScaleModel::learn(&[a.clone(), b.clone()], &[2], 1)).contains("one batch size per trace"));
    assert!(err(ScaleModel::learn(&[a.clone(), b.clone()], &[4, 4], 1)).contains("a batch size of its own"));
    assert!(err(ScaleModel::learn(&[a.clone(), b.clone()], &[0, 4], 1)).contains("start at 1"));
    assert!(err(ScaleModel::learn(&[a.clone(), b.clone()], &[2, 4], 2)).contains("3 or more"));
    let mut other = b.clone();
    other.devices[0].device = 1;
    assert!(err(ScaleModel::learn(&[a.clone(), other], &[2, 4], 1)).contains("not of the same job"));
    assert!(err(ScaleModel::learn(&[a, Trace::new("empty")], &[2, 4], 1)).contains("no events"));
}

#[test]
fn a_real_trace_recorded_twice_scales_to_itself() {
    // The same shipped H200 trace given as two batch sizes: nothing scales, and the prediction at
    // any batch is that trace's own replay.
    let t = cudamem_trace::read_path(std::path::Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/data/bert_varlen_infer.pickle.gz"
    )))
    .unwrap();
    let m = ScaleModel::learn(&[t.clone(), t.clone()], &[1, 2], 1).unwrap();
    let q = m.quality(8);
    assert!(q.exact_alignment && q.scaling == 0);
    for policy in ["pytorch", "cudamem"] {
        let p = peak_at(&m, 8, &opts(policy)).unwrap();
        assert_eq!(p.peak_reserved, own_peak(&t, policy, 1 << 40).0);
    }
}

fn fixture(b: u64) -> Trace {
    let p = format!("{}/tests/data/tiny_gpt_b{b}.pickle.gz", env!("CARGO_MANIFEST_DIR"));
    cudamem_trace::read_path(std::path::Path::new(&p)).unwrap()
}

#[test]
fn a_recorded_transformer_at_batch_1_2_3_predicts_its_batch_8() {
    // Shipped recordings of one small training job (tests/data/make.py): the op sequence of a
    // real model, with autocast casts, attention, optimizer state and cuBLAS workspaces.
    let traces = vec![fixture(1), fixture(2), fixture(3)];
    let truth = fixture(8);
    let m = ScaleModel::learn(&traces, &[1, 2, 3], 1).unwrap();
    let q = m.quality(8);
    assert!(q.exact_alignment, "the same program at every batch size aligns exactly");
    assert!(q.residual_share < 1e-9 && q.scaling > 0);
    for policy in ["pytorch", "pytorch-expandable", "cudamem"] {
        let p = peak_at(&m, 8, &opts(policy)).unwrap();
        assert_eq!(p.peak_reserved, own_peak(&truth, policy, 1 << 40).0, "{policy}");
    }
    assert_eq!(holdout(&traces, &[1, 2, 3], 1, &opts("pytorch")).unwrap(), Some(0.0));
    // On a GPU just big enough for batch 8, batch 8 is the largest that fits.
    let cap = own_peak(&truth, "pytorch", 1 << 40).0;
    let l = largest_batch(&m, &opts("pytorch"), cap, 1 << 10).unwrap();
    assert!(l.batch.unwrap() >= 8, "{l:?}");
    assert_eq!(own_peak(&truth, "pytorch", cap).1, 0);
}

fn resnet(b: u64) -> Trace {
    let p = format!(
        "{}/tests/data/resnet50_cudnn_b{b}.pickle.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    cudamem_trace::read_path(std::path::Path::new(&p)).unwrap()
}

#[test]
fn cudnn_autotuning_aligns_except_its_workspaces_and_predicts_the_recorded_peaks() {
    // ResNet-50 under cudnn.benchmark, recorded on an H200 at batch 8, 16, 24, 64 and 900: each
    // batch picks other convolution algorithms, so each trace has its own number of workspace
    // allocations, while the tensors the job keeps are the same allocations at every batch.
    let traces = vec![resnet(8), resnet(16), resnet(24)];
    let m = ScaleModel::learn(&traces, &[8, 16, 24], 1).unwrap();
    let q = m.quality(64);
    assert!(!q.exact_alignment);
    assert_eq!(q.alignment, "exact except transient allocations");
    let d = &m.alignment.devices[0];
    let unmatched_kept = d.matched.iter().zip(&d.transient).filter(|(m, t)| !**m && !**t).count();
    assert_eq!(
        unmatched_kept, 0,
        "every allocation that outlives the next one is matched"
    );
    assert!(q.transient_kept > 0 && q.residual_share < 0.01, "{q:?}");
    assert_eq!(q.confidence, "medium");
    // Against each trace's own replay: within 1% at batch 64 and 2% at batch 900 (37.5x the
    // largest recorded), for PyTorch's policy and cudamem's.
    for (batch, tolerance) in [(64, 0.01), (900, 0.02)] {
        let truth = resnet(batch);
        for policy in ["pytorch", "cudamem"] {
            let p = peak_at(&m, batch, &opts(policy)).unwrap().peak_reserved as f64;
            let t = own_peak(&truth, policy, 1 << 40).0 as f64;
            assert!((p - t).abs() / t < tolerance, "{policy} at {batch}: {p} vs {t}");
        }
    }
    let h = holdout(&traces, &[8, 16, 24], 1, &opts("pytorch")).unwrap().unwrap();
    assert!(h < 0.02, "hold-out error {h}");
}

/// Two cached 40 MiB blocks, one splitting a 100 MiB segment whose rest is live, one a whole
/// segment made first; a 40 MiB request takes the one at the lower address, then
/// `90 + batch` MiB must fit a 200 MiB cap, which it does only if the whole segment stayed free
/// for the out-of-memory retry to release. Lowest address first, the whole segment lies lower
/// and is taken: the job fails in the simulator's own order and fits in some shuffled ones.
fn tie_job(batch: u64) -> Trace {
    let mut t = Trace::new(format!("tie-b{batch}"));
    let mut events = Vec::new();
    let ev = |action, addr: u64, size: u64| TraceEvent {
        action,
        addr,
        size: size * MIB,
        stream: 0,
        time_us: 0,
        stack: None,
    };
    let free = |events: &mut Vec<TraceEvent>, addr: u64, size: u64| {
        events.push(ev(Action::FreeRequested, addr, size));
        events.push(ev(Action::FreeCompleted, addr, size));
    };
    events.push(ev(Action::Alloc, 0x1000_0000, 40));
    events.push(ev(Action::Alloc, 0x2000_0000, 100));
    free(&mut events, 0x1000_0000, 40);
    free(&mut events, 0x2000_0000, 100);
    events.push(ev(Action::Alloc, 0x3000_0000, 60));
    events.push(ev(Action::Alloc, 0x4000_0000, 40));
    events.push(ev(Action::Alloc, 0x5000_0000, 90 + batch));
    t.devices = vec![DeviceTrace { device: 0, events }];
    t
}

#[test]
fn the_largest_batch_is_the_one_that_fits_in_enough_segment_orders() {
    let cap = 200 * MIB;
    assert!(
        own_peak(&tie_job(10), "pytorch", cap).1 > 0,
        "lowest first, batch 10 fails"
    );
    let m = ScaleModel::learn(&[tie_job(1), tie_job(2), tie_job(3)], &[1, 2, 3], 1).unwrap();
    let l = largest_batch(&m, &opts("pytorch"), cap, 1 << 10).unwrap();
    let f = l.fits_in.expect("the orders are counted");
    assert_eq!(l.batch, Some(10), "{l:?}");
    assert!(
        f.likely() && f.fit < f.orders && f.orders == cudamem_estimate::ORDERS + 1,
        "{f:?}"
    );
    assert_eq!(
        (l.peak_reserved, l.spare),
        (cap, 0),
        "where it fits it reserves the whole cap"
    );
    let (_, at11) = cudamem_estimate::replay_in_orders(
        &tie_job(11),
        &ReplayOptions {
            capacity: cap,
            ..opts("pytorch")
        },
        24,
    )
    .unwrap();
    assert_eq!(at11.fit, 0, "batch 11 fits in no order");
}
