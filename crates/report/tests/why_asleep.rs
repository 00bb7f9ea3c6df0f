//! `cudamem why` on a snapshot of the simulated device with tags: a sleeping tag's segments are
//! left out of the reserved sums and listed per tag with their bytes, and an awake tag's cache
//! counts as releasable (`empty_cache()` releases it), not as held by a private pool.

use std::sync::Arc;

use cudamem_alloc::{AllocatorConfig, CachingAllocator};
use cudamem_device::sim::SimDevice;
use cudamem_device::{Device, StreamId};
use cudamem_report::why;

const MIB: u64 = 1 << 20;
const S0: StreamId = StreamId(0);

#[test]
fn why_names_each_sleeping_tag_and_leaves_it_out_of_reserved() {
    let dev: Arc<dyn Device> = Arc::new(SimDevice::default());
    let a = CachingAllocator::with_policy(dev, AllocatorConfig::default(), "pytorch").unwrap();
    let plain = a.malloc(10 * MIB, S0).unwrap();
    let w = a.with_tag("weights", || a.malloc(40 * MIB, S0).unwrap()).unwrap();
    let kv = a.with_tag("kv", || a.malloc(8 * MIB, S0).unwrap()).unwrap();
    a.free(kv).unwrap(); // the awake tag's cache, which empty_cache() would release
    a.sleep(&["weights"], true).unwrap();
    let slept = a.sleep_stats().sleeping_bytes;
    assert!(slept >= 40 * MIB);

    let r = why(&a.snapshot()).unwrap();
    assert_eq!(r.reserved, a.memory_reserved(), "asleep bytes are not reserved");
    assert_eq!(
        r.allocated,
        10 * MIB,
        "the sleeping tag's live blocks are counted apart"
    );
    assert_eq!(r.asleep.len(), 1);
    let t = &r.asleep[0];
    assert_eq!((t.tag.as_str(), t.bytes), ("weights", slept));
    assert_eq!(t.allocated, 40 * MIB);
    assert_eq!(r.reserved, r.allocated + r.releasable + r.pinned);
    let kv_seg = r
        .segments
        .iter()
        .find(|s| s.address <= kv && kv < s.address + s.total_size)
        .unwrap();
    assert_eq!(
        kv_seg.releasable, kv_seg.total_size,
        "an awake tag's free pages are released"
    );

    let text = r.to_text(10, 5, 6);
    assert!(
        text.contains(&format!("tag \"weights\": {} asleep", cudamem_report::human(slept))),
        "{text}"
    );
    let j = r.to_json();
    assert_eq!(j["asleep"][0]["tag"], "weights");
    assert_eq!(j["asleep"][0]["bytes"], slept);

    a.wake(&[]).unwrap();
    let r = why(&a.snapshot()).unwrap();
    assert!(r.asleep.is_empty() && !r.to_text(10, 5, 6).contains("asleep"));
    for p in [plain, w] {
        a.free(p).unwrap();
    }
}
