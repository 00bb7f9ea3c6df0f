//! The Rust examples print a failure as a message (`error: ...`, the error's `Display`) and exit
//! with status 1, as the README's snippet does, instead of returning it from `main` (which
//! prints the `Debug` dump: `Error: DeviceUnavailable { spec: ... }`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every `crates/*/examples/**/*.rs` file.
fn example_sources() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut out = Vec::new();
    for c in std::fs::read_dir(&crates).expect("the crates folder").flatten() {
        walk(&c.path().join("examples"), &mut out);
    }
    out
}

#[test]
fn no_example_returns_an_error_from_main() {
    let sources = example_sources();
    assert!(sources.len() > 5, "found the examples: {sources:?}");
    for path in sources {
        let text = std::fs::read_to_string(&path).unwrap();
        let returns_result = text.lines().any(|l| {
            let l = l.trim_start();
            l.starts_with("fn main()") && l.contains("-> Result")
        });
        assert!(
            !returns_result,
            "{}: main returns a Result, which prints the error's Debug dump; print `error: {{e}}` and exit 1",
            path.display()
        );
    }
}

/// The quickstart built next to this test (`cargo test` builds the examples), if it is there.
fn quickstart() -> Option<PathBuf> {
    let deps = std::env::current_exe().ok()?.parent()?.to_path_buf();
    let exe = deps
        .parent()?
        .join("examples")
        .join(format!("quickstart{}", std::env::consts::EXE_SUFFIX));
    exe.is_file().then_some(exe)
}

#[test]
fn quickstart_prints_the_message_and_exits_1() {
    let Some(exe) = quickstart() else {
        eprintln!("SKIPPED: the quickstart example is not built (cargo test builds it with the tests)");
        return;
    };
    let out = Command::new(exe).arg("sim:0").output().expect("the example runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("error: invalid device 'sim:0'"), "{err}");
    assert!(!err.contains("BadDevice {"), "a Debug dump: {err}");
}
