//! The `cudamem` command as a user runs it: exit codes, the errors a wrong argument gets, and the
//! `compare` options (the replay itself is tested in `cudamem-replay`).
use std::path::PathBuf;
use std::process::{Command, Output};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(name)
}

fn cudamem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cudamem"))
        .args(args)
        .output()
        .expect("the cudamem binary runs")
}

fn json_rows(out: &Output) -> Vec<serde_json::Value> {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("compare --json prints a JSON array")
}

#[test]
fn compare_warm_changes_the_timing_not_the_replay() {
    let trace = data("seed_example.pickle.gz");
    let trace = trace.to_str().unwrap();
    let base = [
        "compare",
        trace,
        "--policies",
        "pytorch,cudamem",
        "--repeats",
        "3",
        "--json",
    ];
    let fresh = json_rows(&cudamem(&base));
    let warm = json_rows(&cudamem(&[&base[..], &["--warm"]].concat()));
    assert_eq!(fresh.len(), 2);
    assert_eq!(warm.len(), 2);
    for (f, w) in fresh.iter().zip(&warm) {
        assert_eq!(f["policy"], w["policy"]);
        for key in ["peak_reserved_bytes", "peak_requested_bytes", "device_allocs", "ooms"] {
            assert_eq!(f[key], w[key], "{key} of {}", f["policy"]);
        }
        assert!(w["replay_ns_per_op"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn a_wrong_argument_names_what_is_wrong() {
    let trace = data("seed_example.pickle.gz");
    let out = cudamem(&["compare", trace.to_str().unwrap(), "--policies", "pytorch,nope"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown policy 'nope'") && err.contains("pytorch-expandable"),
        "{err}"
    );

    let out = cudamem(&["replay", "no-such-trace.pickle"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-such-trace.pickle"), "{err}");

    let out = cudamem(&["compare", trace.to_str().unwrap(), "--repeats", "many"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--repeats"));
}
