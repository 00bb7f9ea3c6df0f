#[allow(unused_imports)]
use super::read::*;
#[allow(unused_imports)]
use super::write::*;
use super::*;

/// A fuzz finding (the short fuzz run of CI): compact files whose annotation or event-list
/// device ordinals are out of range were returned by `read_compact` without the bound check
/// the pickle reader makes. They are rejected now, naming the entry.
#[test]
fn out_of_range_device_ordinals_are_rejected_on_read() {
    let mut t = Trace::new("fuzz.cmt");
    t.annotations.push(crate::Annotation {
        device: 1_179_648,
        stage: "START".into(),
        name: "x".into(),
        time_us: 0,
    });
    let e = read_compact(&encode(&t), "fuzz.cmt").unwrap_err().to_string();
    assert!(
        e.contains("external_annotations[0]") && e.contains("device ordinal 1179648"),
        "{e}"
    );
    let mut t = Trace::new("fuzz.cmt");
    t.devices.push(crate::DeviceTrace {
        device: 1 << 20,
        events: Vec::new(),
    });
    let e = read_compact(&encode(&t), "fuzz.cmt").unwrap_err().to_string();
    assert!(e.contains("devices[0]") && e.contains("device ordinal 1048576"), "{e}");
}

fn sample() -> Trace {
    let mut t = Trace::new("sample");
    t.stacks.push(Stack {
        frames: vec![Frame {
            name: "f".into(),
            filename: "a.py".into(),
            line: 3,
        }],
    });
    t.devices.push(DeviceTrace {
        device: 0,
        events: vec![
            TraceEvent {
                action: Action::SegmentAlloc,
                addr: 1 << 40,
                size: 2 << 20,
                stream: 0,
                time_us: 5,
                stack: Some(0),
            },
            TraceEvent {
                action: Action::Oom,
                addr: 123,
                size: u64::MAX,
                stream: 7,
                time_us: -1,
                stack: None,
            },
        ],
    });
    t.devices.push(DeviceTrace {
        device: 3,
        events: vec![],
    });
    t.segments.push(SegmentSnapshot {
        device: 0,
        address: 1 << 40,
        total_size: 2 << 20,
        segment_type: SegmentType::Small,
        pool_id: (1, -2),
        is_expandable: true,
        stack: Some(0),
        blocks: vec![BlockSnapshot {
            address: 1 << 40,
            size: 512,
            requested_size: 500,
            state: BlockState::ActivePendingFree,
            stack: None,
        }],
        ..Default::default()
    });
    t.segments.push(SegmentSnapshot {
        address: 2 << 40,
        total_size: 2 << 20,
        tag: Some("weights".into()),
        asleep: true,
        ..Default::default()
    });
    t.settings.conf = "expandable_segments:True,\nweird\\".into();
    t.settings.roundup_power2_divisions = vec![(1, 4), (2, 0)];
    t.settings.garbage_collection_threshold = 0.6;
    t.annotations.push(Annotation {
        device: 0,
        stage: "START".into(),
        name: "step".into(),
        time_us: 9,
    });
    t
}

#[test]
fn round_trip() {
    let t = sample();
    let b = to_compact_bytes(&t).unwrap();
    let r = read_compact(&b, "sample").unwrap();
    assert_eq!(r, t);
}

#[test]
fn truncation_and_corruption_are_reported() {
    let b = to_compact_bytes(&sample()).unwrap();
    let n = b.len();
    let e = read_compact(&b[..n - 10], "s.cmt").unwrap_err();
    assert_eq!(e.kind, ErrorKind::Truncated);
    assert_eq!(e.to_string(), format!("s.cmt: truncated at byte {} of {}", n - 10, n));
    let mut c = b.clone();
    c[40] ^= 1;
    let e = read_compact(&c, "s.cmt").unwrap_err();
    assert!(e.to_string().contains("checksum mismatch"), "{e}");
    let mut v = b.clone();
    v[8] = 9;
    assert!(read_compact(&v, "s").unwrap_err().to_string().contains("version 9"));
    let mut long = b.clone();
    long.push(0);
    assert!(read_compact(&long, "s").is_err());
    assert!(read_compact(b"CUDA", "s").is_err());
    assert!(read_compact(b"", "s").is_err());
    assert!(read_compact(b"NOTMAGIC________________________", "s").is_err());
}

/// Re-seal a modified body with a valid length and checksum, so that the
/// section parser itself sees hostile values.
fn reseal(mut body: Vec<u8>) -> Vec<u8> {
    let len = (body.len() + 8) as u64;
    body[16..24].copy_from_slice(&len.to_le_bytes());
    let h = hash64(&body);
    body.extend_from_slice(&h.to_le_bytes());
    body
}

#[test]
fn huge_counts_do_not_allocate() {
    // A DEVS section claiming 2^60 events.
    let mut body = Vec::new();
    body.extend_from_slice(MAGIC);
    put_u32(&mut body, VERSION);
    put_u32(&mut body, 0);
    put_u64(&mut body, 0);
    let mut devs = Vec::new();
    put_u32(&mut devs, 1);
    put_i32(&mut devs, 0);
    put_u64(&mut devs, 1 << 60);
    section(&mut body, b"DEVS", &devs);
    let e = read_compact(&reseal(body), "h").unwrap_err();
    assert!(e.to_string().contains("claims"), "{e}");
    // A section claiming more bytes than the file has.
    let mut body = Vec::new();
    body.extend_from_slice(MAGIC);
    put_u32(&mut body, VERSION);
    put_u32(&mut body, 0);
    put_u64(&mut body, 0);
    body.extend_from_slice(b"STRS");
    put_u64(&mut body, u64::MAX);
    assert!(read_compact(&reseal(body), "h").is_err());
}

#[test]
fn hostile_fields_inside_a_sealed_file() {
    let b = to_compact_bytes(&sample()).unwrap();
    let body = b[..b.len() - 8].to_vec();
    // Flip every byte of the body in turn (re-sealed): never panics.
    for i in 24..body.len() {
        for x in [0x01u8, 0x80, 0xff] {
            let mut m = body.clone();
            m[i] ^= x;
            let _ = read_compact(&reseal(m), "h");
        }
    }
}

#[test]
fn settings_text_round_trip() {
    let s = sample().settings;
    assert_eq!(settings_from_text(&settings_to_text(&s)).unwrap(), s);
    assert!(settings_from_text("expandable_segments=maybe").is_err());
    assert_eq!(
        settings_from_text("future_key=1\n").unwrap(),
        AllocatorSettings::default()
    );
}
