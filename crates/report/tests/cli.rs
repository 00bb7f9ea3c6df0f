//! Tests of `cudamem summary | leaks | why | viz`: the real binary, run on the shared traces.
//!
//! The binary belongs to `cudamem-cli`, so this test builds it with the cargo that runs the
//! tests (same profile, same target directory; a no-op when it is up to date) and runs it.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `target/<profile>/cudamem`, built for the profile of this test binary.
fn binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("test executable path");
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile>/deps")
            .to_path_buf();
        let profile = profile_dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("debug")
            .to_string();
        let target_dir = profile_dir.parent().expect("target dir").to_path_buf();
        let cargo_profile = if profile == "debug" { "dev" } else { profile.as_str() };
        let status = Command::new(env!("CARGO"))
            .current_dir(root())
            .args([
                "build",
                "-q",
                "-p",
                "cudamem-cli",
                "--bin",
                "cudamem",
                "--profile",
                cargo_profile,
                "--target-dir",
            ])
            .arg(&target_dir)
            .status()
            .expect("run cargo");
        assert!(status.success(), "cargo build -p cudamem-cli failed");
        profile_dir.join(format!("cudamem{}", std::env::consts::EXE_SUFFIX))
    })
}

fn cudamem(args: &[&str]) -> Output {
    Command::new(binary())
        .current_dir(root())
        .args(args)
        .output()
        .expect("run cudamem")
}

fn ok(args: &[&str]) -> String {
    let o = cudamem(args);
    assert!(
        o.status.success(),
        "cudamem {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("utf-8 output")
}

const SEED: &str = "tests/data/seed_example.pickle.gz";

#[test]
fn summary_prints_both_tables() {
    let out = ok(&["summary", SEED]);
    assert_eq!(
        out.matches("PyTorch CUDA memory summary, device ID 0").count(),
        2,
        "{out}"
    );
    assert!(out.contains("at the end of the trace"));
    assert!(out.contains("when reserved memory peaked at 86.0 MiB"), "{out}");
    let j: serde_json::Value = serde_json::from_str(&ok(&["summary", SEED, "--json"])).unwrap();
    assert_eq!(j["devices"][0]["peak_reserved_bytes"], 90_177_536);
}

#[test]
fn leaks_text_json_top_and_at() {
    let out = ok(&["leaks", SEED]);
    assert!(
        out.starts_with("seed_example.pickle.gz: 3 live allocations (65.0 MiB) at the end of the trace"),
        "{out}"
    );
    assert!(
        out.contains("linear.py:134") && out.contains("<no stack recorded>"),
        "{out}"
    );
    let top1 = ok(&["leaks", SEED, "--top", "1"]);
    assert!(
        !top1.contains("<no stack recorded>") && top1.contains("... 1 more call sites: 32.0 MiB in 1 allocations"),
        "{top1}"
    );
    let at0 = ok(&["leaks", SEED, "--at", "0"]);
    assert!(at0.lines().next().unwrap().contains(") after event 0 from "), "{at0}");
    assert!(!at0.contains("at after"), "{at0}");
    let j: serde_json::Value = serde_json::from_str(&ok(&["leaks", SEED, "--json", "--at", "20"])).unwrap();
    assert_eq!((j["count"].as_u64(), j["bytes"].as_u64()), (Some(9), Some(46_607_516)));
    assert_eq!(j["basis"], "trace events");
}

#[test]
fn why_text_and_json() {
    let out = ok(&["why", SEED]);
    assert!(out.contains("empty_cache() would release 20.0 MiB now (1 segment); 66.0 MiB stays reserved: 65.0 MiB allocated and 1.0 MiB free that 1 live block pins in 1 segment:"), "{out}");
    let j: serde_json::Value = serde_json::from_str(&ok(&["why", SEED, "--json"])).unwrap();
    assert_eq!(j["releasable"], 20 << 20);
    assert_eq!(j["pinned"], 1 << 20);
    assert_eq!(j["segments"].as_array().unwrap().len(), 4);
}

#[test]
fn viz_writes_one_html_file() {
    let dir = std::env::temp_dir().join(format!("cudamem-viz-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("seed.html");
    let o = cudamem(&["viz", SEED, "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let html = std::fs::read_to_string(&out).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("Active memory timeline"));
    let out2 = dir.join("seed-cudamem.html");
    let o = cudamem(&["viz", SEED, "--policy", "cudamem", "-o", out2.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read_to_string(&out2)
        .unwrap()
        .contains("replay with policy cudamem"));
    let o = cudamem(&["viz", SEED, "--policy", "nope", "-o", out2.to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("unknown policy 'nope'"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn errors_name_the_file() {
    let o = cudamem(&["leaks", "tests/data/no-such-trace.pickle.gz"]);
    assert_eq!(o.status.code(), Some(2));
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.starts_with("cudamem: no-such-trace.pickle.gz: "), "{e}");
    let o = cudamem(&["leaks", SEED, "--at", "no-such-mark"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(
        e.starts_with("cudamem: seed_example.pickle.gz: no annotation named 'no-such-mark'"),
        "{e}"
    );
    let o = cudamem(&["why", "Cargo.toml"]);
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.starts_with("cudamem: Cargo.toml: "), "{e}");
}
