//! What the `cudamem` command does with inputs that are not what it expects and outputs that
//! would destroy an input: it never panics, never reads without end, never writes onto one of
//! its inputs, and ends each such case with exit status 2 and a message.
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data")
        .join(name)
}

/// A fresh directory of this test's own.
fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cudamem-inputs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn cudamem() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cudamem"))
}

fn run(args: &[&str]) -> Output {
    cudamem().args(args).output().expect("the cudamem binary runs")
}

/// The failure's message, after checking that it is a clean one (exit 2, no panic).
fn refused(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// Waits for `child` at most `limit`; a child still running then is killed and fails the test.
fn wait_within(mut child: Child, limit: Duration) -> Output {
    let start = Instant::now();
    while child.try_wait().expect("wait works").is_none() {
        if start.elapsed() > limit {
            child.kill().expect("kill works");
            let _ = child.wait();
            panic!("the command was still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("the output is collected")
}

/// `cudamem ARGS /dev/stdin` with `head` and then `fill` repeated without end on stdin.
fn with_endless_stdin(args: &[&str], env: &[(&str, &str)], head: &[u8], fill: Vec<u8>) -> Output {
    let mut child = cudamem()
        .args(args)
        .arg("/dev/stdin")
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the cudamem binary runs");
    let mut stdin = child.stdin.take().unwrap();
    let head = head.to_vec();
    // The writer stops when the command closes its end of the pipe.
    std::thread::spawn(move || {
        if stdin.write_all(&head).is_ok() {
            while stdin.write_all(&fill).is_ok() {}
        }
    });
    wait_within(child, Duration::from_secs(60))
}

/// Pseudo-random bytes (a fixed sequence).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect()
}

#[test]
fn fidelity_on_a_trace_without_segment_history_says_there_is_nothing_to_compare() {
    let dir = temp_dir("fidelity");
    // pickle.dumps({'segments': [], 'device_traces': []}, protocol=2)
    let empty = dir.join("e.pickle");
    std::fs::write(
        &empty,
        b"\x80\x02}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02X\r\x00\x00\x00device_tracesq\x03]q\x04u.",
    )
    .unwrap();
    let header_only = dir.join("h.csv");
    std::fs::write(&header_only, "Thread,Time,Action,Pointer,Size,Stream\n").unwrap();
    // One allocation, which failed: no segment was ever allocated.
    let failed = dir.join("failed.csv");
    std::fs::write(
        &failed,
        "Thread,Time,Action,Pointer,Size,Stream\n1,1,allocate failure,0x0,1099511627776,0x0\n",
    )
    .unwrap();
    for path in [&empty, &header_only, &failed] {
        let out = run(&["fidelity", path.to_str().unwrap()]);
        let err = refused(&out);
        assert!(err.contains("nothing to compare"), "{err}");
        assert!(!err.contains("not reproduced"), "{err}");
        assert!(out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn endless_zeros_and_noise_are_refused_at_once() {
    let out = cudamem()
        .args(["replay", "/dev/zero"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the cudamem binary runs");
    let err = refused(&wait_within(out, Duration::from_secs(30)));
    assert!(
        err.contains("not a known trace format") && err.contains("00 00"),
        "{err}"
    );
    // Endless noise after the first bytes of each format.
    let heads: [&[u8]; 8] = [
        b"",
        b"\x80\x04",
        b"}",
        b"]",
        b"(",
        b"\x1f\x8b",
        b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff",
        b"CUDAMEMT\x01\x00\x00\x00\x00\x00\x00\x00",
    ];
    for (i, head) in heads.into_iter().enumerate() {
        for cmd in ["replay", "summary"] {
            let out = with_endless_stdin(&[cmd], &[], head, noise(i as u64 + 1, 1 << 16));
            refused(&out);
        }
    }
}

#[test]
fn an_endless_stream_that_looks_like_a_trace_stops_at_the_size_limit() {
    let header = b"Thread,Time,Action,Pointer,Size,Stream\n";
    let line = b"1,1,allocate,0x10,16,0x0\n1,2,free,0x10,16,0x0\n".repeat(1000);
    let out = with_endless_stdin(&["replay"], &[("CUDAMEM_MAX_TRACE_BYTES", "1MiB")], header, line);
    let err = refused(&out);
    assert!(
        err.contains("larger than the limit") && err.contains("CUDAMEM_MAX_TRACE_BYTES"),
        "{err}"
    );
    let out = run(&["replay", "/dev/null"]);
    let err = refused(&out);
    assert!(err.contains("is empty"), "{err}");
}

#[test]
fn no_command_writes_onto_one_of_its_inputs() {
    let dir = temp_dir("overwrite");
    let trace = dir.join("t.pickle.gz");
    std::fs::copy(data("seed_example.pickle.gz"), &trace).unwrap();
    let before = std::fs::read(&trace).unwrap();
    let link = dir.join("link.pickle.gz");
    std::os::unix::fs::symlink(&trace, &link).unwrap();
    let t = trace.to_str().unwrap();
    let spellings = [
        t.to_string(),
        dir.join(".").join("t.pickle.gz").display().to_string(),
        link.display().to_string(),
    ];
    for out in &spellings {
        let err = refused(&run(&["viz", t, "-o", out]));
        assert!(err.contains("refusing to overwrite"), "{err}");
        let err = refused(&run(&["viz", link.to_str().unwrap(), "--output", out]));
        assert!(err.contains("refusing to overwrite"), "{err}");
        let err = refused(&run(&["scale", t, t, "--batch", "1,2", "--at", "4", "--write", out]));
        assert!(err.contains("refusing to overwrite"), "{err}");
    }
    assert_eq!(std::fs::read(&trace).unwrap(), before, "the input changed");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn output_dash_is_stdout() {
    let dir = temp_dir("dash");
    let trace = data("seed_example.pickle.gz");
    let out = cudamem()
        .args(["viz", trace.to_str().unwrap(), "-o", "-"])
        .current_dir(&dir)
        .output()
        .expect("the cudamem binary runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let html = String::from_utf8_lossy(&out.stdout);
    assert!(
        html.trim_start().starts_with("<!DOCTYPE html>"),
        "{}",
        &html[..html.len().min(200)]
    );
    assert!(!Path::new(&dir).join("-").exists(), "a file named '-' was written");
    // scale writes a pickle and prints a report: both cannot go to stdout.
    let t = trace.to_str().unwrap();
    let err = refused(&run(&["scale", t, t, "--batch", "1,2", "--at", "4", "--write", "-"]));
    assert!(err.contains("--write -"), "{err}");
    std::fs::remove_dir_all(dir).unwrap();
}
