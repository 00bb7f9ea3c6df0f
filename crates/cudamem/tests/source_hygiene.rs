//! Comments state rules, not runs: no source file points to the per-run result folders (deleted:
//! the benchmark docs hold the figures) or to issue numbers.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if p.is_dir() {
            if name != "target" && name != "node_modules" && !name.to_string_lossy().starts_with('.') {
                sources(&p, out);
            }
        } else if p
            .extension()
            .is_some_and(|x| ["rs", "py", "sh", "toml", "cpp", "h"].iter().any(|e| x == *e))
        {
            out.push(p);
        }
    }
}

#[test]
fn no_source_points_to_run_folders_or_issue_numbers() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for dir in ["crates", "python/src", "python/tests", "scripts", "fuzz"] {
        sources(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "found the sources: {}", files.len());
    let run_folder = ["docs/", "gpu-runs"].concat();
    let mut found = Vec::new();
    for f in &files {
        let Ok(text) = std::fs::read_to_string(f) else { continue };
        for (i, line) in text.lines().enumerate() {
            let issue = line
                .match_indices("Issue #")
                .any(|(k, m)| line[k + m.len()..].starts_with(|c: char| c.is_ascii_digit()));
            if line.contains(&run_folder) || issue {
                found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "comments carry rules, not runs:\n{}",
        found.join("\n")
    );
}
