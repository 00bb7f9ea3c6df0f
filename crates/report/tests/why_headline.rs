//! `cudamem why`'s headline is computed from the same numbers as its rows: what stays reserved
//! after `empty_cache()` is `reserved - releasable`, the allocated bytes plus the free bytes of
//! the pinned segments' rows.

use std::path::PathBuf;

use cudamem_report::{human, why};

const MIB: u64 = 1 << 20;

fn load(name: &str) -> cudamem_trace::Trace {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(name);
    cudamem_trace::read_path(&path).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn the_headline_says_reserved_minus_releasable_on_bert_varlen_infer() {
    let r = why(&load("bert_varlen_infer.pickle.gz")).unwrap();
    let stays = r.reserved - r.releasable;
    assert_eq!(
        stays,
        92 * MIB,
        "the trace's end: 33 MiB allocated, 59 MiB pinned by them"
    );
    assert_eq!(r.stays_reserved(), stays);
    let rows = r.pinned_segments();
    let row_free: u64 = rows.iter().map(|s| s.pinned).sum();
    assert_eq!(row_free, r.pinned);
    assert_eq!(r.allocated + row_free, stays);
    let h = r.headline();
    assert!(
        h.contains(&format!(
            "; {} stays reserved: {} allocated and {} free that",
            human(stays),
            human(r.allocated),
            human(row_free)
        )),
        "{h}"
    );
    assert!(
        h.contains("92.0 MiB stays reserved: 33.0 MiB allocated and 59.0 MiB free"),
        "{h}"
    );
    let j = r.to_json();
    assert_eq!(j["stays_reserved"], stays);
    assert_eq!(j["headline"], h);
}

#[test]
fn the_relation_holds_on_every_shared_trace() {
    for name in [
        "seed_example.pickle.gz",
        "gpt2_train.pickle.gz",
        "resnet50_train.pickle.gz",
        "bert_varlen_infer.pickle.gz",
        "multistream_prefetch.pickle.gz",
    ] {
        let r = why(&load(name)).unwrap();
        let segs = &r.segments;
        assert_eq!(r.reserved, segs.iter().map(|s| s.total_size).sum::<u64>(), "{name}");
        for s in segs {
            assert_eq!(
                s.total_size,
                s.allocated + s.releasable + s.pinned,
                "{name}: {:#x}",
                s.address
            );
        }
        let stays = r.reserved - r.releasable;
        assert_eq!(r.stays_reserved(), stays, "{name}");
        let h = r.headline();
        if stays > 0 {
            assert!(h.contains(&format!("; {} stays reserved", human(stays))), "{name}: {h}");
        }
    }
}
