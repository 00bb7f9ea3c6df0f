#[allow(unused_imports)]
use super::data::*;
use super::*;
use cudamem_trace::{DeviceTrace, TraceEvent};

fn ev(action: Action, addr: u64, size: u64) -> TraceEvent {
    TraceEvent {
        action,
        addr,
        size,
        stream: 0,
        time_us: 0,
        stack: None,
    }
}

fn small_trace() -> Trace {
    let mut t = Trace::new("t</script><script>alert(1)</script>");
    t.devices.push(DeviceTrace {
        device: 0,
        events: vec![
            ev(Action::SegmentAlloc, 1 << 30, 2 << 20),
            ev(Action::Alloc, 1 << 30, 1000),
            ev(Action::Alloc, (1 << 30) + 1024, 100),
            ev(Action::FreeRequested, 1 << 30, 1000),
            ev(Action::FreeCompleted, 1 << 30, 1000),
        ],
    });
    t
}

/// Every `src=`, `href=` and `import` in the page, with what follows.
fn references(html: &str) -> Vec<String> {
    let lower = html.to_ascii_lowercase();
    let mut out = Vec::new();
    for pat in ["src=", "href=", "import ", "import(", "@import", "url("] {
        let mut from = 0;
        while let Some(i) = lower[from..].find(pat) {
            let at = from + i;
            out.push(lower[at..(at + 80).min(lower.len())].to_string());
            from = at + pat.len();
        }
    }
    out
}

#[test]
fn html_is_self_contained_and_has_the_views() {
    let html = viz(&small_trace(), "unit <test>");
    for r in references(&html) {
        assert!(
            !r.contains("http://") && !r.contains("https://") && !r.contains("//"),
            "external reference: {r}"
        );
    }
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "a URL in the page"
    );
    for id in [
        "id=\"timeline\"",
        "id=\"segmap\"",
        "id=\"curve\"",
        "id=\"summary\"",
        "id=\"cudamem-data\"",
    ] {
        assert!(html.contains(id), "missing {id}");
    }
    assert!(html.contains("Active memory timeline"));
    assert!(html.contains("Reserved vs allocated"));
    assert!(html.contains("memory_summary()"));
    // The trace's name cannot close the data block.
    assert_eq!(
        html.matches("</script>").count(),
        2,
        "one data block and one code block"
    );
    assert!(html.contains("unit &lt;test&gt;"));
    // The summary tables are embedded.
    assert!(html.contains("PyTorch CUDA memory summary"));
}

#[test]
fn bands_pair_allocs_and_frees() {
    let t = small_trace();
    let mut ids = HashMap::new();
    let d = device_data(
        &t,
        &t.devices[0],
        None,
        &AllocatorConfig::default(),
        &VizOptions::default(),
        &mut ids,
    );
    assert_eq!(d["bands"]["s"], json!([1, 2]));
    assert_eq!(d["bands"]["fr"], json!([3, 5]));
    assert_eq!(d["bands"]["e"], json!([4, 5]));
    assert_eq!(d["bands"]["bsize"], json!([1024, 512]));
    assert_eq!(d["peak_reserved"], json!(2 << 20));
    assert_eq!(d["peak_active"], json!(1536));
}

#[test]
fn frees_without_allocs_and_unmaps_without_maps_start_live() {
    let mut t = Trace::new("t");
    t.devices.push(DeviceTrace {
        device: 0,
        events: vec![
            ev(Action::FreeRequested, 4096, 100),
            ev(Action::FreeCompleted, 4096, 100),
            ev(Action::SegmentUnmap, 1 << 21, 2 << 20),
            ev(Action::SegmentMap, 1 << 22, 2 << 20),
        ],
    });
    let mut ids = HashMap::new();
    let d = device_data(
        &t,
        &t.devices[0],
        None,
        &AllocatorConfig::default(),
        &VizOptions::default(),
        &mut ids,
    );
    assert_eq!(d["bands"]["s"], json!([-1]));
    assert_eq!(d["init_maps"].as_array().unwrap().len(), 1);
    // The unmapped range and the later map touch: one span of 4 MiB.
    assert_eq!(d["spans"].as_array().unwrap().len(), 1);
    assert_eq!(d["spans"][0][1], json!(4 << 20));
}

#[test]
fn timeline_is_downsampled() {
    let mut t = Trace::new("t");
    let mut events = vec![ev(Action::SegmentAlloc, 1 << 30, 1 << 30)];
    for i in 0..100u64 {
        events.push(ev(Action::Alloc, (1 << 30) + i * (1 << 20), (i + 1) * 4096));
    }
    t.devices.push(DeviceTrace { device: 0, events });
    let mut ids = HashMap::new();
    let opts = VizOptions {
        max_bands: 10,
        ..VizOptions::default()
    };
    let d = device_data(&t, &t.devices[0], None, &AllocatorConfig::default(), &opts, &mut ids);
    let kept = d["kept"].as_array().unwrap();
    assert_eq!(kept.len(), 10);
    assert_eq!(kept[0], json!(90)); // the largest ones
}

#[test]
fn empty_and_segmentless_traces_render() {
    let html = viz(&Trace::new("empty"), "empty");
    assert!(html.contains("\"devices\":[]"));
    let mut t = Trace::new("no segments");
    t.devices.push(DeviceTrace {
        device: 0,
        events: vec![],
    });
    assert!(viz(&t, "t").contains("\"n\":0"));
    t.devices[0].events = vec![ev(Action::Alloc, 4096, 100), ev(Action::FreeRequested, 4096, 100)];
    let html = viz(&t, "t");
    assert!(html.contains("\"init_segs\":[]"));
}

#[test]
fn ranges() {
    let mut r = Ranges::default();
    r.add(0, 10);
    r.add(20, 30);
    r.add(10, 20);
    assert_eq!(r.0.len(), 1);
    assert_eq!(r.remove(5, 35), vec![(30, 35)]);
    assert_eq!(r.0.iter().collect::<Vec<_>>(), vec![(&0, &5)]);
}
