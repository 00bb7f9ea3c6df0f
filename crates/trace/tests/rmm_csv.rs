//! RMM `logging_resource_adaptor` CSV logs.

mod common;

use common::Rng;
use cudamem_trace::{read_bytes, read_rmm_csv, Action, ErrorKind, TraceEvent};

const SAMPLE: &str = "\
Thread,Time,Action,Pointer,Size,Stream
140573312345856,08:54:41:839541,allocate,0x7f8a40000000,1024,0x0

140573312345856,08:54:41:839560,allocate,0x7f8a40000400,2048,0x7f8a38001020
140573312345857,08:54:41.839600,free,0x7f8a40000000,1024,0x0
140573312345857,08:54:41:839650,allocate failure,0x0,1099511627776,0x0,extra
140573312345857,08:54:41:839700,free,0x7f8a40000400,2048,0x7f8a38001020\r
";

fn ev(action: Action, addr: u64, size: u64, stream: u64, time_us: i64) -> TraceEvent {
    TraceEvent {
        action,
        addr,
        size,
        stream,
        time_us,
        stack: None,
    }
}

#[test]
fn rmm_sample_parses() {
    let t = read_rmm_csv(SAMPLE, "run.csv").unwrap();
    let base = ((8 * 60 + 54) * 60 + 41) * 1_000_000i64;
    let s = 0x7f8a38001020;
    assert_eq!(t.source, "run.csv");
    assert_eq!(t.devices.len(), 1);
    assert_eq!(t.devices[0].device, 0);
    assert_eq!(
        t.devices[0].events,
        vec![
            ev(Action::Alloc, 0x7f8a40000000, 1024, 0, base + 839541),
            ev(Action::Alloc, 0x7f8a40000400, 2048, s, base + 839560),
            ev(Action::FreeRequested, 0x7f8a40000000, 1024, 0, base + 839600),
            ev(Action::FreeCompleted, 0x7f8a40000000, 1024, 0, base + 839600),
            ev(Action::Oom, 0, 1 << 40, 0, base + 839650),
            ev(Action::FreeRequested, 0x7f8a40000400, 2048, s, base + 839700),
            ev(Action::FreeCompleted, 0x7f8a40000400, 2048, s, base + 839700),
        ]
    );
    assert!(t.segments.is_empty() && t.stacks.is_empty());
    // Detected by content.
    assert_eq!(read_bytes(SAMPLE.as_bytes(), "run.csv").unwrap(), t);
}

#[test]
fn rmm_epoch_seconds_reordered_columns_and_device_suffix() {
    let text = "Thread,Time,Action,Pointer,Size,Stream,Device\n\
                1,1634567890.123456,allocate,0x100,512,2,0\n\
                1,1634567890.000001,free,256,512,2,0\n\
                1,garbage,allocate failure,(nil),4096,2,0\n";
    let t = read_rmm_csv(text, "log.csv.dev3").unwrap();
    assert_eq!(t.devices[0].device, 3);
    let times: Vec<i64> = t.devices[0].events.iter().map(|e| e.time_us).collect();
    // Time never goes backwards; unparseable times keep the previous one.
    assert_eq!(times, vec![1634567890123456; 4]);
    assert_eq!(t.devices[0].events[1].addr, 256);
    // Columns are found by name.
    let t2 = read_rmm_csv("Action,Size,Pointer,Stream,Time,Thread\nallocate,512,0x10,0,5,1\n", "x").unwrap();
    assert_eq!(t2.devices[0].events[0], ev(Action::Alloc, 0x10, 512, 0, 5));
    // Header only: an empty trace.
    assert_eq!(
        read_rmm_csv("Thread,Time,Action,Pointer,Size,Stream\n\n", "x")
            .unwrap()
            .num_events(),
        0
    );
}

#[test]
fn bad_rmm_lines_give_line_numbers() {
    let head = "Thread,Time,Action,Pointer,Size,Stream\n1,1,allocate,0x10,16,0\n\n";
    let cases = [
        ("1,2,allocate,0x20,sixteen,0\n", "bad Size 'sixteen'"),
        ("1,2,allocate,0xZZ,16,0\n", "bad Pointer '0xZZ'"),
        (
            "1,2,allocate,0x20,16\n",
            "expected at least 6 comma-separated fields, found 5",
        ),
        (
            "1,2,reallocate,0x20,16,0\n",
            "unknown Action 'reallocate', expected 'allocate', 'free' or 'allocate failure'",
        ),
        ("1,2,free,0x20,16,stream7\n", "bad Stream 'stream7'"),
        ("1,2,allocate,0x20,-16,0\n", "bad Size '-16'"),
    ];
    for (line, msg) in cases {
        let text = format!("{head}{line}");
        let e = read_rmm_csv(&text, "log.csv").unwrap_err();
        assert_eq!(e.kind, ErrorKind::Csv);
        assert_eq!(e.to_string(), format!("log.csv:4: {msg}"));
    }
    let e = read_rmm_csv("", "empty.csv").unwrap_err();
    assert!(e.to_string().starts_with("empty.csv:1: empty file"), "{e}");
    let e = read_bytes(
        b"Thread,Time,Action,Pointer,Size,Stream\n1,2,allocate,0x1,1,0\n\xff\n",
        "bin.csv",
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "bin.csv:3: line is not valid UTF-8");
}

#[test]
fn corrupted_csv_never_panics() {
    let mut rng = Rng(0x5eed_0004);
    for _ in 0..3000 {
        let mut b = SAMPLE.as_bytes().to_vec();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(b.len());
            b[i] = match rng.below(3) {
                0 => b',',
                1 => b'\n',
                _ => rng.next() as u8,
            };
        }
        let cut = rng.below(b.len() + 1);
        let _ = read_bytes(&b[..cut], "fuzz.csv");
        if let Ok(s) = std::str::from_utf8(&b) {
            let _ = read_rmm_csv(s, "fuzz.csv");
        }
    }
}
