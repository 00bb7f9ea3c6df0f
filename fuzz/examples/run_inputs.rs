//! Runs fuzz inputs through a target without libFuzzer (plain build, no sanitizer), printing
//! the panic of each failing input: triage of `fuzz/artifacts/`, and a check that the seeds
//! themselves pass.
//!
//! Usage (from `fuzz/`): `cargo run --release --example run_inputs -- <target> <file or dir>...`
//! Exits 1 if any input panicked.

use std::panic;
use std::path::PathBuf;

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().expect("usage: run_inputs <target> <file or dir>...");
    let f = cudamem_fuzz::target(&name).unwrap_or_else(|| panic!("unknown target {name}"));
    let mut files: Vec<PathBuf> = Vec::new();
    for a in args {
        let p = PathBuf::from(a);
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()).collect();
            v.sort();
            files.extend(v);
        } else {
            files.push(p);
        }
    }
    panic::set_hook(Box::new(|_| {}));
    let (mut ok, mut failed) = (0, 0);
    for file in &files {
        let data = std::fs::read(file).unwrap();
        let t = std::time::Instant::now();
        match panic::catch_unwind(|| f(&data)) {
            Ok(()) => ok += 1,
            Err(e) => {
                failed += 1;
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "non-string panic".into());
                println!("PANIC {}: {msg}", file.display());
            }
        }
        let ms = t.elapsed().as_millis();
        if ms > 500 {
            println!("slow {}: {ms} ms", file.display());
        }
    }
    println!("{name}: {ok} passed, {failed} failed");
    std::process::exit(if failed > 0 { 1 } else { 0 });
}
