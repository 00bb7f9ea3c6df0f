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

/// Runs the command with its stdout a pipe whose reading end is already closed, as after
/// `cudamem ... | head -1` once `head` has exited.
fn with_closed_stdout(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cudamem"))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the cudamem binary runs");
    drop(child.stdout.take());
    child.wait_with_output().expect("the command ends")
}

#[test]
fn a_closed_stdout_ends_the_command_quietly() {
    let trace = data("seed_example.pickle.gz");
    let trace = trace.to_str().unwrap();
    for args in [
        &["fidelity", trace, trace][..],
        &["compare", trace, "--repeats", "0"],
        &["compare", trace, "--repeats", "0", "--json"],
        &["replay", trace, "--repeats", "0"],
        &["fit", trace, "--policy", "pytorch"],
        &["summary", trace],
        &["demo"],
    ] {
        let out = with_closed_stdout(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?} printed to stderr: {err}");
    }
}

#[test]
fn head_reads_the_first_line_and_the_command_exits_zero() {
    let trace = data("seed_example.pickle.gz");
    let trace = trace.to_str().unwrap();
    let bin = env!("CARGO_BIN_EXE_cudamem");
    let script = format!(
        "set -o pipefail; '{bin}' fidelity '{trace}' '{trace}' '{trace}' | head -1 && '{bin}' compare '{trace}' --repeats 0 | head -1"
    );
    let out = Command::new("bash").args(["-c", &script]).output().expect("bash runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{err}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.starts_with("| trace |"), "{text}");
}

#[test]
fn a_capacity_the_simulated_gpu_cannot_serve_is_refused_before_the_replay() {
    let trace = data("seed_example.pickle.gz");
    let trace = trace.to_str().unwrap();
    for cap in ["500TiB", "15EiB", "18446744073709551615"] {
        let out = cudamem(&["replay", trace, "--capacity", cap]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cap}: {err}");
        assert!(out.stdout.is_empty(), "{cap}: nothing is replayed");
        assert!(
            err.contains("cannot serve a capacity") && err.contains("the largest capacity it serves"),
            "{cap}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    // The largest capacity the message names replays with every policy.
    let out = cudamem(&["replay", trace, "--capacity", "500TiB"]);
    let err = String::from_utf8_lossy(&out.stderr);
    let largest = err
        .rsplit('(')
        .next()
        .and_then(|s| s.strip_suffix(" bytes)\n"))
        .unwrap_or_else(|| panic!("no byte count at the end of: {err}"));
    for policy in ["pytorch", "pytorch-expandable", "cudamem", "cudamem-compact"] {
        let out = cudamem(&[
            "replay",
            trace,
            "--capacity",
            largest,
            "--policy",
            policy,
            "--repeats",
            "0",
            "--json",
        ]);
        let v = json_rows_of(&out);
        assert_eq!(v["capacity"].as_u64().unwrap().to_string(), largest, "{policy}");
        assert_eq!(v["ooms"], 0, "{policy}");
    }
}

fn json_rows_of(out: &Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("replay --json prints one JSON object")
}

#[test]
fn bad_sizes_get_a_message_that_says_what_is_wrong() {
    let trace = data("seed_example.pickle.gz");
    let trace = trace.to_str().unwrap();
    for (args, want) in [
        (&["replay", trace, "--capacity", "-1"][..], "negative"),
        (&["replay", trace, "--capacity=-1"], "negative"),
        (&["demo", "--capacity", "-8GiB"], "negative"),
        (&["replay", trace, "--capacity", "0"], "out of range"),
        (&["replay", trace, "--capacity", "16EiB"], "out of range"),
        (&["replay", trace, "--capacity", "8XB"], "unknown size unit 'XB'"),
    ] {
        let out = cudamem(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("'-- -1'") && !err.contains("panicked"), "{args:?}: {err}");
    }
    // Either case, and the units up to EiB.
    for cap in ["80gib", "80GB", "80gb", "1PiB", "0.25pib"] {
        let out = cudamem(&["demo", "--capacity", cap]);
        assert!(out.status.success(), "{cap}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn errors_print_their_message_not_a_debug_dump() {
    let out = cudamem(&["demo", "--capacity", "1MiB"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("cudamem: CUDA out of memory."), "{err}");
    assert!(!err.contains("OutOfMemory {") && !err.contains("Alloc("), "{err}");
}

#[test]
fn compare_keeps_its_columns_aligned_with_a_long_trace_name() {
    let dir = std::env::temp_dir().join(format!("cudamem-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let long = dir.join("a_trace_with_a_much_longer_name_than_the_column_had_room_for.pickle.gz");
    std::fs::copy(data("seed_example.pickle.gz"), &long).unwrap();
    let out = cudamem(&[
        "compare",
        data("seed_example.pickle.gz").to_str().unwrap(),
        long.to_str().unwrap(),
        "--policies",
        "pytorch,cudamem-compact",
        "--repeats",
        "0",
    ]);
    std::fs::remove_dir_all(&dir).ok();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    // Every row is as long as the header, its policy starts under "policy", and each number
    // ends under the end of its right-aligned header.
    let head = lines[0];
    let policy_at = head.find("policy").unwrap();
    for (l, policy) in lines[1..].iter().zip(["pytorch", "cudamem-compact"].iter().cycle()) {
        assert_eq!(l.len(), head.len(), "{text}");
        assert!(l[policy_at..].starts_with(policy), "{text}");
        assert_eq!(l.as_bytes()[policy_at - 1], b' ', "{text}");
        for label in [
            "peak req",
            "peak resv",
            "resv/req",
            "dev alloc",
            "maps+unm",
            "OOMs",
            "ns/op",
        ] {
            let end = head.find(label).unwrap() + label.len() - 1;
            let b = l.as_bytes();
            assert!(
                b[end] != b' ' && (end + 1 == b.len() || b[end + 1] == b' '),
                "{label}: {text}"
            );
        }
    }
}

#[test]
fn every_policy_option_lists_the_registrys_policies_and_takes_either_spelling() {
    for cmd in ["replay", "compare", "fit", "viz"] {
        let out = cudamem(&[cmd, "--help"]);
        assert!(out.status.success());
        let help = String::from_utf8_lossy(&out.stdout);
        for name in cudamem_alloc::policy::POLICY_NAMES {
            assert!(help.contains(name), "{cmd} --help does not list {name}:\n{help}");
        }
    }
    let trace = data("seed_example.pickle.gz");
    let trace = trace.to_str().unwrap();
    let rows = json_rows(&cudamem(&[
        "compare",
        trace,
        "--policy",
        "pytorch,cudamem-compact",
        "--repeats",
        "0",
        "--json",
    ]));
    assert_eq!(rows.len(), 2);
    assert_eq!(rows[1]["policy"], "cudamem-compact");
    let rows = json_rows(&cudamem(&["fit", trace, "--policies", "pytorch,cudamem", "--json"]));
    assert_eq!(rows.len(), 2);
    let out = cudamem(&["replay", trace, "--policy", "pytorch,cudamem"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("replay takes one policy"));
}

#[test]
fn a_trace_that_frees_unallocated_addresses_gets_a_warning_with_the_count() {
    use cudamem_trace::{Action, DeviceTrace, Trace, TraceEvent};
    let ev = |action, addr| TraceEvent {
        action,
        addr,
        size: 1 << 20,
        stream: 0,
        time_us: 0,
        stack: None,
    };
    let mut events = vec![ev(Action::Alloc, 0x10_0000)];
    for addr in [0xdead_0000, 0x10_0000, 0xbeef_0000] {
        events.push(ev(Action::FreeRequested, addr));
        events.push(ev(Action::FreeCompleted, addr));
    }
    let trace = Trace {
        source: "unmatched".into(),
        devices: vec![DeviceTrace { device: 0, events }],
        ..Default::default()
    };
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("unmatched_frees.cmt");
    cudamem_trace::write_compact(&trace, std::fs::File::create(&path).unwrap()).unwrap();
    let path = path.to_str().unwrap();

    let out = cudamem(&["replay", path, "--repeats", "1"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("warning:") && err.contains("2 frees of addresses the trace never allocated"),
        "{err}"
    );
    let out = cudamem(&["replay", path, "--repeats", "1", "--json"]);
    let j = json_rows_of(&out);
    assert_eq!(j["unmatched_frees"], 2);
    assert_eq!(j["devices"][0]["unmatched_frees"], 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("2 frees"));

    // A trace without such frees gets no warning.
    let out = cudamem(&[
        "replay",
        data("seed_example.pickle.gz").to_str().unwrap(),
        "--repeats",
        "1",
    ]);
    assert!(out.status.success());
    assert!(!String::from_utf8_lossy(&out.stderr).contains("warning"));
}
