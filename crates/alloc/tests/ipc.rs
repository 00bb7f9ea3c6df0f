//! `Engine::share` on the simulated device: what can be shared is decided before the device is
//! asked, and a device that cannot share says so.

use std::sync::Arc;

use cudamem_alloc::{AllocError, AllocatorConfig, CachingAllocator};
use cudamem_device::sim::SimDevice;
use cudamem_device::{DeviceError, StreamId};

fn allocator(conf: &str) -> CachingAllocator {
    let dev = Arc::new(SimDevice::with_capacity(8 << 30));
    let cfg = AllocatorConfig::parse(conf).unwrap();
    CachingAllocator::with_policy(dev, cfg, "pytorch").unwrap()
}

#[test]
fn only_live_allocations_are_shared() {
    let a = allocator("");
    let p = a.malloc(4 << 20, StreamId(0)).unwrap();
    for bad in [p + 512, p + (64 << 20), 0] {
        let e = a.lock().share(bad).unwrap_err();
        assert!(
            matches!(e, AllocError::InvalidArgument(ref m) if m.contains("not a live allocation")),
            "{e:?}"
        );
    }
    a.free(p).unwrap();
    assert!(
        matches!(a.lock().share(p), Err(AllocError::InvalidArgument(_))),
        "a freed block is not shared"
    );
}

#[test]
fn the_simulated_device_says_it_cannot_share_either_kind() {
    for conf in ["", "expandable_segments:True"] {
        let a = allocator(conf);
        let p = a.malloc(4 << 20, StreamId(0)).unwrap();
        match a.lock().share(p) {
            Err(AllocError::Device(DeviceError::Unavailable(m))) => {
                assert!(m.contains("another process") || m.contains("other processes"), "{m}")
            }
            other => panic!("{conf}: {other:?}"),
        }
        a.free(p).unwrap();
    }
}
