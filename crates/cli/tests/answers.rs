//! The command says what it did and refuses what it cannot do as asked: configuration keys,
//! sizes, GPU names and device strings read the same way in every command, negative event
//! indexes, traces that allocate an address twice, and the scaling's judgement of itself.
mod common;

use common::{cudamem, data};

fn fails(args: &[&str]) -> String {
    let o = cudamem(args);
    assert_eq!(o.status.code(), Some(2), "{args:?} did not fail with 2");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(args: &[&str]) -> (String, String) {
    let o = cudamem(args);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{args:?}: {err}");
    (String::from_utf8_lossy(&o.stdout).into_owned(), err)
}

#[test]
fn config_keys_a_replay_cannot_follow_are_refused_or_warned() {
    let t = data("seed_example.pickle.gz");
    let e = fails(&["replay", &t, "--config", "backend:cudaMallocAsync"]);
    assert!(e.contains("backend:native") && !e.contains("runtime"), "{e}");
    let e = fails(&["replay", &t, "--config", "policy:nosuch"]);
    assert!(e.contains("unknown policy") && e.contains("pytorch-expandable"), "{e}");
    let e = fails(&["replay", &t, "--policy", "pytorch", "--config", "policy:cudamem"]);
    assert!(e.contains("once"), "{e}");
    // The policy key alone chooses the policy.
    let (out, _) = ok(&["replay", &t, "--config", "policy:pytorch", "--json"]);
    assert!(out.contains("\"policy\":\"pytorch\""), "{out}");
    let (_, err) = ok(&[
        "replay",
        &t,
        "--policy",
        "cudamem",
        "--config",
        "expandable_segments:False",
        "--json",
    ]);
    assert!(err.contains("warning") && err.contains("no effect"), "{err}");
    let (_, err) = ok(&[
        "replay",
        &t,
        "--policy",
        "pytorch",
        "--config",
        "expandable_segments:False",
        "--json",
    ]);
    assert!(!err.contains("warning"), "{err}");
}

#[test]
fn sizes_gpu_names_and_devices_read_the_same_everywhere() {
    let t = data("seed_example.pickle.gz");
    let e = fails(&["replay", &t, "--capacity", "8"]);
    assert!(
        e.contains("less than 1 MiB") && e.contains("bare number is bytes"),
        "{e}"
    );
    let e = fails(&["replay", &t, "--capacity", "8XB"]);
    assert!(e.contains("1GB = 10^9") && e.contains("8G = 8GiB"), "{e}");
    let (out, _) = ok(&["replay", &t, "--capacity", "h100-80gb", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["capacity"].as_u64(), Some(84_943_715_696));
    let (out, _) = ok(&["replay", &t, "--device", "sim:8GiB", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["capacity"].as_u64(), Some(8 << 30));
    ok(&["replay", &t, "--device", "auto", "--json"]);
    let e = fails(&["replay", &t, "--device", "sim:8GiB", "--capacity", "8GiB"]);
    assert!(e.contains("once"), "{e}");
    let e = fails(&["replay", &t, "--device", "tpu"]);
    assert!(e.contains("sim:<capacity>"), "{e}");
    let e = fails(&["demo", "--capacity", "100"]);
    assert!(e.contains("less than 1 MiB"), "{e}");
    let (help, _) = ok(&["replay", "--help"]);
    assert!(
        help.contains("a bare number is bytes") && help.contains("h100-80gb"),
        "{help}"
    );
}

#[test]
fn a_negative_event_index_gets_a_clear_error() {
    let t = data("seed_example.pickle.gz");
    let e = String::from_utf8_lossy(&cudamem(&["leaks", &t, "--at", "-1"]).stderr).into_owned();
    assert!(e.contains("0 or more") && !e.contains("-- -1"), "{e}");
    let e = fails(&["leaks", "nosuch.pickle.gz"]);
    assert_eq!(e.matches("nosuch.pickle.gz").count(), 1, "{e}");
}

#[test]
fn negative_counts_get_a_clear_error_everywhere() {
    let t = data("seed_example.pickle.gz");
    let cases: [&[&str]; 8] = [
        &["leaks", &t, "--top", "-1"],
        &["leaks", &t, "--frames", "-2"],
        &["why", &t, "--top", "-1"],
        &["replay", &t, "--repeats", "-1"],
        &["compare", &t, "--repeats", "-3"],
        &["scale", &t, &t, "--batch", "2,-4"],
        &["scale", &t, &t, "--batch", "2,4", "--at", "-5"],
        &["scale", &t, &t, "--batch", "2,4", "--degree", "-1"],
    ];
    for args in cases {
        let e = fails(args);
        assert!(e.contains("must be 0 or more") && !e.contains("-- -"), "{args:?}: {e}");
    }
    let e = fails(&["leaks", &t, "--top", "ten"]);
    assert!(e.contains("not a whole number"), "{e}");
}

#[test]
fn a_trace_allocating_an_address_twice_is_reported() {
    let dir = std::env::temp_dir().join(format!("cudamem-double-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join("double.csv");
    std::fs::write(
        &p,
        "Thread,Time,Action,Pointer,Size,Stream\n1,08:54:41:000001,allocate,0x1000,4096,0x0\n1,08:54:41:000002,allocate,0x1000,4096,0x0\n1,08:54:41:000003,free,0x1000,4096,0x0\n",
    )
    .unwrap();
    let (_, err) = ok(&["replay", p.to_str().unwrap(), "--json"]);
    assert!(
        err.contains("0x1000") && err.contains("event 1") && err.contains("event 0"),
        "{err}"
    );
    // compare and fit say it too, once per trace whatever the number of policies.
    for cmd in ["compare", "fit"] {
        let (_, err) = ok(&[cmd, p.to_str().unwrap(), "--policy", "pytorch,cudamem"]);
        assert_eq!(err.matches("allocates address 0x1000").count(), 1, "{cmd}: {err}");
    }
    // The shipped traces allocate no address twice.
    for t in ["seed_example.pickle.gz", "gpt2_train.pickle.gz"] {
        let (_, err) = ok(&["replay", &data(t), "--policy", "pytorch", "--json", "--repeats", "0"]);
        assert!(!err.contains("no event freed"), "{t}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn expandable_memory_is_explained_under_memory_summary() {
    let (out, _) = ok(&["replay", &data("seed_example.pickle.gz"), "--policy", "cudamem"]);
    assert!(out.contains("mapped into expandable segments"), "{out}");
    let (out, _) = ok(&["replay", &data("seed_example.pickle.gz"), "--policy", "pytorch"]);
    assert!(!out.contains("mapped into expandable segments"), "{out}");
}

#[test]
fn scale_judges_its_own_answer() {
    let (b4, b8) = (data("est/bert_b4.pickle.gz"), data("est/bert_b8.pickle.gz"));
    let e = fails(&["scale", &b4, &b8, "--batch", "8,4", "--at", "16", "--policy", "pytorch"]);
    assert!(e.contains("memory falls as the batch grows"), "{e}");
    let (out, _) = ok(&["scale", &b4, &b8, "--batch", "4,8", "--at", "16", "--policy", "pytorch"]);
    assert!(
        out.contains("cannot be judged") && !out.contains("confidence high"),
        "{out}"
    );
    let e = fails(&[
        "scale",
        &b4,
        &b8,
        "--batch",
        "4,8",
        "--at",
        "1000000000",
        "--policy",
        "pytorch",
    ]);
    assert!(e.contains("smaller batch") && !e.contains("capacity of"), "{e}");
}
