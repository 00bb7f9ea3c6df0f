//! What the scaling says about its own answer on the shipped BERT traces (batch 4 and 8):
//! batch sizes given in the wrong order are refused, two traces leave the fit's quality
//! unjudged, and a batch beyond what the simulated GPU models is said to be so.

use cudamem_estimate::{confidence, peak_at, ScaleModel};
use cudamem_replay::ReplayOptions;
use cudamem_trace::Trace;

fn bert(b: u64) -> Trace {
    let p = format!(
        "{}/../../tests/data/est/bert_b{b}.pickle.gz",
        env!("CARGO_MANIFEST_DIR")
    );
    cudamem_trace::read_path(std::path::Path::new(&p)).unwrap()
}

#[test]
fn batch_sizes_in_the_wrong_order_are_refused() {
    let e = ScaleModel::learn(&[bert(4), bert(8)], &[8, 4], 1).unwrap_err();
    assert!(
        e.contains("memory falls as the batch grows") && e.contains("order of the traces"),
        "{e}"
    );
    ScaleModel::learn(&[bert(4), bert(8)], &[4, 8], 1).unwrap();
}

#[test]
fn two_traces_leave_the_confidence_unknown() {
    let m = ScaleModel::learn(&[bert(4), bert(8)], &[4, 8], 1).unwrap();
    let q = m.quality(16);
    assert!(q.fit_exact_by_construction);
    assert_eq!(q.confidence, "unknown");
    assert_eq!(confidence(&q), "unknown");
}

#[test]
fn a_batch_past_the_simulated_gpu_names_no_capacity_nobody_gave() {
    let m = ScaleModel::learn(&[bert(4), bert(8)], &[4, 8], 1).unwrap();
    let opts = ReplayOptions {
        policy: "pytorch".into(),
        ..ReplayOptions::default()
    };
    let e = peak_at(&m, 1_000_000_000, &opts).unwrap_err();
    assert!(e.contains("batch 1000000000") && e.contains("smaller batch"), "{e}");
    assert!(!e.contains("capacity of"), "{e}");
}
