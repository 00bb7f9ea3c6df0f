//! Writes the seed corpora of the fuzz targets into `fuzz/corpus/<target>/` (run by
//! scripts/fuzz.sh when a corpus folder is missing or empty; nothing binary is committed):
//!
//! * `pickle`: the small shared trace whole (gzip'd and raw), cut prefixes of every shared
//!   trace's raw pickle, and valid snapshot pickles of each trace's first 20 / 200 events;
//! * `compact`: the compact conversion of those truncations, and of the small trace whole;
//! * `rmm_csv`: RMM logs made from the truncations, plus odd but valid variants;
//! * `config`: sample settings strings, valid and invalid;
//! * `allocator_ops`: op sequences made from each trace's first allocations and frees, plus
//!   deterministic random byte strings.
//!
//! Usage: `cargo run --release --example make_seeds -- <repo root>` (from `fuzz/`).

use std::fs;
use std::path::{Path, PathBuf};

use cudamem_trace::{Action, DeviceTrace, Trace};

const TRACES: [&str; 5] = ["seed_example", "resnet50_train", "gpt2_train", "multistream_prefetch", "bert_varlen_infer"];

fn truncate(t: &Trace, n: usize) -> Trace {
    let mut t = t.clone();
    for d in &mut t.devices {
        d.events.truncate(n);
    }
    t.devices.retain(|d: &DeviceTrace| !d.events.is_empty());
    t.segments.truncate(2);
    t.annotations.truncate(4);
    // Keep only the stacks still referred to would need renumbering; drop them all instead.
    t.stacks.clear();
    for d in &mut t.devices {
        for e in &mut d.events {
            e.stack = None;
        }
    }
    for s in &mut t.segments {
        s.stack = None;
        for b in &mut s.blocks {
            b.stack = None;
        }
    }
    t
}

fn rmm_csv(t: &Trace) -> String {
    let mut s = String::from("Thread,Time,Action,Pointer,Size,Stream\n");
    for e in t.events() {
        let action = match e.action {
            Action::Alloc => "allocate",
            Action::FreeRequested => "free",
            Action::Oom => "allocate failure",
            _ => continue,
        };
        let us = e.time_us.rem_euclid(86_400_000_000);
        let (h, m, sec, f) = (us / 3_600_000_000, us / 60_000_000 % 60, us / 1_000_000 % 60, us % 1_000_000);
        s.push_str(&format!("140573312345856,{h:02}:{m:02}:{sec:02}:{f:06},{action},{:#x},{},{:#x}\n", e.addr, e.size, e.stream));
    }
    s
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// An `allocator_ops` input replaying the first `n` allocs/frees of `t` (see
/// `cudamem_fuzz::decode` for the encoding).
fn ops_from_trace(t: &Trace, n: usize, policy: u8, settings: u8, capacity: u8, faults: &[u8]) -> Vec<u8> {
    let mut out = vec![policy, settings, capacity];
    out.extend_from_slice(faults);
    let mut order: Vec<u64> = Vec::new();
    let mut count = 0;
    for e in t.events() {
        if count >= n {
            break;
        }
        match e.action {
            Action::Alloc => {
                out.extend_from_slice(&[0, 14, 0, 0, 0, 0]);
                out.extend_from_slice(&e.size.to_le_bytes());
                out.push((e.stream % 4) as u8);
                order.push(e.addr);
                count += 1;
            }
            Action::FreeRequested => {
                if let Some(i) = order.iter().position(|&a| a == e.addr) {
                    order.remove(i);
                    out.push(10);
                    out.extend_from_slice(&(i as u16).to_le_bytes());
                    count += 1;
                }
            }
            Action::SegmentFree | Action::SegmentUnmap if out.last() != Some(&26) => out.push(26),
            _ => {}
        }
    }
    out
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    fs::write(dir.join(name), bytes).unwrap();
}

fn main() {
    let root = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "..".into()));
    let data = root.join("tests/data");
    let corpus = root.join("fuzz/corpus");
    let dir = |t: &str| {
        let d = corpus.join(t);
        fs::create_dir_all(&d).unwrap();
        d
    };
    let (pk, cp, csv, cfg, ops) = (dir("pickle"), dir("compact"), dir("rmm_csv"), dir("config"), dir("allocator_ops"));

    for (ti, name) in TRACES.iter().enumerate() {
        let gz = fs::read(data.join(format!("{name}.pickle.gz"))).unwrap();
        let raw = cudamem_trace::gunzip(&gz, name).unwrap();
        let t = cudamem_trace::read_bytes(&gz, name).unwrap();
        if gz.len() < 4096 {
            write(&pk, &format!("{name}.pickle.gz"), &gz);
            write(&pk, &format!("{name}.pickle"), &raw);
            let mut c = Vec::new();
            cudamem_trace::write_compact(&t, &mut c).unwrap();
            write(&cp, &format!("{name}.cmt"), &c);
        }
        for cut in [64usize, 512, 2048, 8192] {
            write(&pk, &format!("{name}.cut{cut}"), &raw[..cut.min(raw.len())]);
        }
        for n in [20usize, 200] {
            let small = truncate(&t, n);
            let mut p = Vec::new();
            cudamem_trace::write_snapshot_pickle(&small, &mut p).unwrap();
            write(&pk, &format!("{name}.first{n}.pickle"), &p);
            let mut c = Vec::new();
            cudamem_trace::write_compact(&small, &mut c).unwrap();
            write(&cp, &format!("{name}.first{n}.cmt"), &c);
            write(&csv, &format!("{name}.first{n}.csv"), rmm_csv(&small).as_bytes());
        }
        // Allocator op sequences from the trace: each policy, a small and a large device, with
        // and without faults.
        for (k, faults) in [&[0u8][..], &[0b1111, 40, 1, 2, 3, 4, 5, 6, 7, 8]].iter().enumerate() {
            for policy in 0..3u8 {
                let bytes = ops_from_trace(&t, 150, policy, (ti as u8 + policy) % 11, (ti % 4) as u8, faults);
                write(&ops, &format!("{name}.p{policy}.f{k}"), &bytes);
            }
        }
    }
    let csv_extra = [
        "Thread,Time,Action,Pointer,Size,Stream\n1,08:54:41:839541,allocate,0x7f8a40000000,1024,0x0\n1,08:54:41:839560,free,0x7f8a40000000,1024,0x0\n1,08:54:41:839600,allocate failure,0x0,1099511627776,0x0\n",
        "Thread,Time,Action,Pointer,Size,Stream,Device\r\n1,1700000000.5,allocate,140230000000000,512,7,0\r\n1,1700000000.6,deallocate,140230000000000,512,7,0\r\n",
        "\u{feff}Stream,Size,Pointer,Action,Time,Thread\n0x0,4096,0x10,allocate,23:59:59.999999,9\n0x0,4096,0x10,free,00:00:00.000001,9\n\n",
        "Thread,Time,Action,Pointer,Size,Stream\n1,5,allocate failure,(nil),99,0\n1,4,allocate failure,nullptr,1,0x1\n",
    ];
    for (i, s) in csv_extra.iter().enumerate() {
        write(&csv, &format!("extra{i}.csv"), s.as_bytes());
    }
    let configs = [
        "",
        "expandable_segments:True",
        "max_split_size_mb:64,garbage_collection_threshold:0.6",
        "roundup_power2_divisions:[1:8,256:4,>:1]",
        "roundup_power2_divisions:4,max_non_split_rounding_mb:40",
        "large_segment_size_mb:32,max_split_size_mb:32",
        "backend:cudaMallocAsync",
        "backend:native,policy:cudamem",
        "pinned_num_register_threads:8,pinned_use_cuda_host_register:True",
        "pinned_reserve_segment_size_mb:64,pinned_use_background_threads:True",
        "release_lock_on_cudamalloc:True,release_lock_on_hipmalloc:False",
        "graph_capture_record_stream_reuse:True,per_process_memory_fraction:0.5",
        " max_split_size_mb : 64 , ",
        "max_split_size_mb:18446744073709551615",
        "garbage_collection_threshold:nan",
        "roundup_power2_divisions:[>:2]",
        "expandable_segments:True max_split_size_mb:30",
        "max_split_size_mb:5",
        "bogus:1",
    ];
    for (i, s) in configs.iter().enumerate() {
        write(&cfg, &format!("config{i}"), s.as_bytes());
    }
    let mut rng = Rng(0x5eed_f022);
    for i in 0..32 {
        let len = 16 + (rng.next() % 600) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        write(&ops, &format!("random{i}"), &bytes);
    }
    for t in ["pickle", "compact", "rmm_csv", "config", "allocator_ops"] {
        println!("{t}: {} seeds", fs::read_dir(corpus.join(t)).unwrap().count());
    }
}
