//! The keys of a replay's `--config` that a replay cannot honour as written are refused with
//! what to do instead; the keys it honours replay as before.

use cudamem_replay::{replay, ReplayOptions};
use cudamem_trace::{Action, DeviceTrace, Trace, TraceEvent};

fn trace() -> Trace {
    let ev = |action| TraceEvent {
        action,
        addr: 0x10_0000,
        size: 1 << 20,
        stream: 0,
        time_us: 0,
        stack: None,
    };
    Trace {
        source: "keys".into(),
        devices: vec![DeviceTrace {
            device: 0,
            events: vec![ev(Action::Alloc), ev(Action::FreeRequested), ev(Action::FreeCompleted)],
        }],
        ..Default::default()
    }
}

fn run(policy: &str, config: &str) -> Result<(), String> {
    let opts = ReplayOptions {
        policy: policy.into(),
        config: Some(config.into()),
        repeats: 0,
        ..ReplayOptions::default()
    };
    replay(&trace(), &opts).map(|_| ())
}

#[test]
fn a_backend_other_than_native_is_refused_without_talking_of_runtime() {
    let e = run("pytorch", "backend:cudaMallocAsync").unwrap_err();
    assert!(
        e.contains("backend:cudaMallocAsync") && e.contains("backend:native"),
        "{e}"
    );
    assert!(!e.contains("runtime"), "{e}");
    run("pytorch", "backend:native").unwrap();
}

#[test]
fn the_policy_key_names_a_known_policy_and_the_one_replayed() {
    let e = run("cudamem", "policy:nosuch").unwrap_err();
    assert!(e.contains("unknown policy") && e.contains("pytorch-expandable"), "{e}");
    let e = run("pytorch", "policy:cudamem").unwrap_err();
    assert!(
        e.contains("'cudamem'") && e.contains("'pytorch'") && e.contains("once"),
        "{e}"
    );
    run("cudamem", "policy:cudamem").unwrap();
}
