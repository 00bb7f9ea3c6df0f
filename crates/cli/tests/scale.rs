//! `cudamem scale` as a user runs it: its JSON, its written trace, and the errors of wrong input.
mod common;

use std::process::Output;

use common::{cudamem, data};

fn stderr(o: &Output) -> String {
    assert!(!o.status.success(), "expected a failure");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn scale_json_and_written_trace() {
    let t = data("seed_example.pickle.gz");
    let dir = std::env::temp_dir().join(format!("cudamem-scale-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out_path = dir.join("scaled.pickle");
    let o = cudamem(&[
        "scale",
        &t,
        &t,
        "--batch",
        "1,2",
        "--at",
        "4",
        "--capacity",
        "h200",
        "--policy",
        "pytorch",
        "--json",
        "--write",
        out_path.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["quality"]["exact_alignment"], true);
    assert_eq!(v["at"][0]["batch"], 4);
    assert!(v["at"][0]["peak_reserved_bytes"].as_u64().unwrap() > 0);
    assert!(v["headline"].as_str().unwrap().starts_with("at batch 4 this job needs"));
    // The written trace is a snapshot the other commands read.
    let r = cudamem(&["replay", out_path.to_str().unwrap(), "--policy", "pytorch", "--json"]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn scale_errors_name_the_problem() {
    let t = data("seed_example.pickle.gz");
    assert!(stderr(&cudamem(&["scale", &t, &t, "--batch", "1", "--at", "4"])).contains("one batch size per trace"));
    assert!(stderr(&cudamem(&["scale", &t, &t, "--batch", "1,2"])).contains("nothing to predict"));
    assert!(stderr(&cudamem(&["scale", &t, &t, "--batch", "2,2", "--at", "4"])).contains("a batch size of its own"));
    assert!(stderr(&cudamem(&["scale", &t, &t, "--batch", "1,2", "--capacity", "h300"])).contains("known GPUs"));
    assert!(stderr(&cudamem(&["scale", &t, &t, "--batch", "1,2", "--at", "0"])).contains("--at 0"));
    assert!(stderr(&cudamem(&[
        "scale",
        &t,
        "/nonexistent.pickle",
        "--batch",
        "1,2",
        "--at",
        "3"
    ]))
    .contains("nonexistent"));
}
