//! Unit tests of `sharded`: they use its private items.

use super::*;

#[test]
fn the_written_out_values_follow_the_stats_arrays_order() {
    let mut st = DeviceStats::new(0);
    for (k, arr) in st.arrays_mut().into_iter().enumerate() {
        arr.increase(true, 1 + 2 * k as u64);
        arr.increase(false, 100 + k as u64);
    }
    st.oversize_allocations.increase(7);
    st.oversize_segments.increase(9);
    assert_eq!(currents(&st)[..], series(&st).0[..N]);
}

proptest::proptest! {
    /// What the shards read instead of all twenty values: after every operation of every
    /// policy — hits, splits, merges, new segments and pages, frees deferred by
    /// `record_stream`, emptied caches, out-of-memory retries — a value whose bit is clear
    /// did not change, every value moved by its noted amount, and a value that ended higher
    /// raised the flag that a bounded shard's check reads, its ceilings being its values
    /// before the operation.
    #[test]
    fn every_change_of_a_tracked_value_is_noted(
        policy in proptest::sample::select(cudamem_alloc::policy::POLICY_NAMES),
        max_split in proptest::bool::ANY,
        ops in proptest::collection::vec((0u8..8, 0u64..48 << 20, 0usize..64, proptest::num::u32::ANY), 1..120),
    ) {
        let device = Arc::new(cudamem_device::sim::SimDevice::with_capacity(160 << 20));
        // With a `max_split_size`, large blocks and segments count as oversize.
        let mut config = AllocatorConfig::parse(if max_split { "max_split_size_mb:20" } else { "" }).unwrap();
        let p = policy::by_name(policy, &mut config).unwrap();
        let mut e = Engine::<Changes>::new(device.clone(), config, p);
        let mut live: Vec<(u64, StreamId)> = Vec::new();
        let mut before = currents(e.kept_stats());
        for (kind, size, pick, loose) in ops {
            // Ceilings at the values before the operation, some (bit `k` of `loose`) far
            // above: so that a value may pass its own while its `all` does not, and back.
            e.sink_mut().clear();
            let pre = series_of(&before);
            let ceiling: [i64; S] = std::array::from_fn(|k| pre[k] + if loose & (1 << k) != 0 { 1 << 50 } else { 0 });
            for (k, &c) in ceiling.iter().enumerate() {
                e.sink_mut().set_ceiling(k, c);
            }
            match kind {
                0..=3 => {
                    let stream = StreamId(1 + (pick % 2) as u64);
                    // (Size 0 gives address 0: nothing to free or record.)
                    if let Ok(p @ 1..) = e.malloc(size >> (pick % 16), stream) {
                        live.push((p, stream));
                    }
                }
                4 | 5 if !live.is_empty() => {
                    let (p, _) = live.swap_remove(pick % live.len());
                    e.free(p).unwrap();
                }
                6 if !live.is_empty() => {
                    let (p, stream) = live[pick % live.len()];
                    e.record_stream(p, StreamId(stream.0 + 2)).unwrap();
                    if pick % 3 == 0 {
                        device.complete_all();
                    }
                }
                _ => e.empty_cache().unwrap(),
            }
            let now = currents(e.kept_stats());
            for i in 0..N {
                if e.sink().mask & (1 << i) == 0 {
                    proptest::prop_assert_eq!(now[i], before[i], "value {} changed unnoted", i);
                }
                proptest::prop_assert_eq!(now[i] - before[i], e.sink().delta[i], "value {}'s amount", i);
            }
            let passed = series_of(&now).iter().zip(&ceiling).any(|(n, c)| n > c);
            if passed {
                proptest::prop_assert!(e.sink().over, "a series ended above its ceiling unflagged");
            }
            before = now;
        }
    }

    /// Whatever the values and demands, the shares are ≥ 0 and sum to at most the headroom
    /// (the ceilings to at most the peak); when the headroom covers every demand, every
    /// shard gets at least its demand.
    #[test]
    fn headroom_shares_never_exceed_the_peak(
        shards in proptest::collection::vec((0i64..1 << 40, 0i64..1 << 40), 1..70),
        peak in 0i64..1 << 46,
    ) {
        let current: Vec<i64> = shards.iter().map(|s| s.0).collect();
        let demand: Vec<i64> = shards.iter().map(|s| s.1).collect();
        let mut share = vec![0; shards.len()];
        headroom_shares(peak, &current, &demand, &mut share);
        let total: i64 = current.iter().sum();
        let headroom = peak.max(total) - total;
        proptest::prop_assert!(share.iter().all(|&s| s >= 0));
        proptest::prop_assert!(share.iter().sum::<i64>() <= headroom);
        if demand.iter().sum::<i64>() <= headroom {
            for (s, d) in share.iter().zip(&demand) {
                proptest::prop_assert!(s >= d);
            }
        }
    }
}

#[test]
fn changes_round_trip_through_the_compact_log() {
    let values = [
        0,
        1,
        -1,
        512,
        i32::MAX as i64,
        i32::MIN as i64,
        i32::MIN as i64 + 1,
        1 << 40,
        -(1 << 40),
        i64::MAX,
        i64::MIN,
    ];
    let mut deltas = Vec::new();
    for &v in &values {
        push_delta(&mut deltas, v);
    }
    assert_eq!(deltas.len(), values.len() + 2 * 5, "5 values need the escape");
    let mut at = 0;
    for &v in &values {
        assert_eq!(read_delta(&deltas, &mut at), v);
    }
    assert_eq!(at, deltas.len());
    // The hot path's writer produces the same words.
    let mut written = Vec::new();
    for &v in &values {
        let mut out = [std::mem::MaybeUninit::<i32>::uninit(); 3];
        let n = write_delta(&mut out, v);
        // SAFETY: `write_delta` wrote the first `n` words.
        written.extend(out[..n].iter().map(|w| unsafe { w.assume_init() }));
    }
    assert_eq!(written, deltas);
}

#[test]
fn a_rebase_entry_moves_the_stamps_base() {
    let mut log = Log {
        base: 100,
        ..Log::default()
    };
    log.entries.push((5, 1));
    push_delta(&mut log.deltas, 7);
    log.entries.push((0, REBASE));
    push_delta(&mut log.deltas, 1 << 40);
    log.entries.push((3, 1));
    push_delta(&mut log.deltas, -7);
    let mut pos = (0, 0, log.base);
    assert_eq!(next_stamp(&log, &mut pos), 105);
    assert_eq!(read_delta(&log.deltas, &mut pos.1), 7);
    pos.0 += 1;
    assert_eq!(next_stamp(&log, &mut pos), (1 << 40) + 3);
    assert_eq!(read_delta(&log.deltas, &mut pos.1), -7);
    pos.0 += 1;
    assert_eq!(next_stamp(&log, &mut pos), u64::MAX);
}
