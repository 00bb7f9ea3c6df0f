//! Comments state rules, not runs: no source file points to the per-run result folders (deleted:
//! the benchmark docs hold the figures) or to issue numbers, and no comment in Rust, C++ or
//! Python quotes a measurement (figures live in `docs/bench/` and the README's table, where
//! they carry their machine and date).

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

/// The text of a line's comment (`//` in Rust and C++, `#` in Python and shell), if any. A
/// marker inside a string literal is taken for a comment too: the check errs towards looking.
fn comment_of<'a>(line: &'a str, ext: &str) -> Option<&'a str> {
    let marker = if ext == "py" || ext == "sh" { "#" } else { "//" };
    line.find(marker).map(|k| &line[k + marker.len()..])
}

/// A figure: digits (perhaps signed, approximate, a range, with a decimal point or thousands
/// commas) and the unit of a measurement (`%`, `x`, `×`, `ns`, `µs`, `us`, `ms`, `s`), or none
/// when `bare` is allowed.
fn is_figure(token: &str, bare: bool) -> bool {
    let t = token.trim_matches(|c: char| "()[],.;:".contains(c));
    let t = t.trim_start_matches(['+', '-', '−', '~', '≈']);
    let end = t
        .find(|c: char| !(c.is_ascii_digit() || ".,–-".contains(c)))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(end);
    number.starts_with(|c: char| c.is_ascii_digit())
        && (["%", "x", "×", "ns", "µs", "us", "ms", "s"].contains(&unit) || (bare && unit.is_empty()))
}

/// Whether a comment quotes a measurement: a signed percentage ("−4%"), a date, a count of
/// instructions ("5 instructions", "the ~550", "cost about 180"), or a figure with a unit next
/// to a word that only a measurement uses ("~10x slower", "about 6 s ... took").
fn quotes_a_measurement(comment: &str) -> bool {
    let lower = comment.to_lowercase();
    let words: Vec<&str> = lower.split_whitespace().collect();
    let signed_percent = words
        .iter()
        .any(|w| w.trim_start_matches('(').starts_with(['+', '-', '−']) && w.contains('%') && is_figure(w, false));
    let date = lower.as_bytes().windows(10).any(|w| {
        w.iter().enumerate().all(|(i, c)| {
            if i == 4 || i == 7 {
                *c == b'-'
            } else {
                c.is_ascii_digit()
            }
        })
    });
    let counted = words.windows(2).any(|p| {
        (is_figure(p[0], true) && (p[1].starts_with("instructions") || p[1] == "more"))
            || (p[0] == "about" && is_figure(p[1], true) && lower.contains("cost"))
            || (is_figure(p[0], true)
                && ["s", "ms", "ns", "µs", "seconds", "minutes"].contains(&p[1].trim_end_matches([',', '.', ')']))
                && (lower.contains("takes about") || lower.contains("took")))
    }) || (lower.contains("instructions")
        && words.iter().any(|w| w.starts_with('~') && is_figure(w, true)));
    let measuring = [
        "instructions",
        "callgrind",
        "slower",
        "faster",
        "mispredictions",
        "measured",
        "took",
        "takes about",
    ];
    let with_unit = measuring.iter().any(|m| lower.contains(m)) && words.iter().any(|w| is_figure(w, false));
    signed_percent || date || counted || with_unit
}

#[test]
fn comments_state_rules_not_figures() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for dir in [
        "crates",
        "python/src",
        "python/cudamem",
        "python/tests",
        "scripts",
        "fuzz",
    ] {
        sources(&root.join(dir), &mut files);
    }
    let mut found = Vec::new();
    for f in &files {
        let ext = f.extension().and_then(|e| e.to_str()).unwrap_or("");
        if !["rs", "py", "cpp", "h"].contains(&ext) || f.ends_with("source_hygiene.rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(f) else { continue };
        for (i, line) in text.lines().enumerate() {
            if comment_of(line, ext).is_some_and(quotes_a_measurement) {
                found.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        found.is_empty(),
        "comments state rules; figures belong in docs/bench/ (the README's table):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_figure_check_sees_figures_and_passes_rules() {
    for figure in [
        "Reads skip the bounds check: −4% instructions a pair",
        "about 25 instructions of the ~550 a replayed operation costs (callgrind)",
        "`serde-pickle`'s is ~10x slower on real traces",
        "inlining of the hot path (+2.7% instructions per replayed op)",
        "measured on 2026-11-30",
        "were 5 instructions of a replayed operation's 480",
        "comparing all of them cost about 180, and comparing those that rose about 100",
        "snapshot it takes about 6 s in a release build",
    ] {
        assert!(quotes_a_measurement(figure), "missed: {figure}");
    }
    for rule in [
        "one 128-bit comparison (two instructions)",
        "a class spans ≤ 3% of its sizes",
        "Fail the calls with these 1-based ordinals",
        "keeps peak reserved within 3% of peak requested",
        "takes 4 bytes: the block record is on every path, and smaller is faster",
        "The 1, 2, 4, 8 sequence is measured `--rounds` times",
    ] {
        assert!(!quotes_a_measurement(rule), "flagged a rule: {rule}");
    }
}

/// The crate-level modules a Rust source file names through `crate::` (`crate::a::b`,
/// `crate::{a, b::c}`); comments are skipped.
fn modules_named(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let code: String = code
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let mut rest = code.as_str();
    while let Some(k) = rest.find("crate::") {
        rest = &rest[k + "crate::".len()..];
        if let Some(list) = rest.strip_prefix('{') {
            // Items of the list at depth 1, each up to its first `::`, `,` or `}`.
            let (mut depth, mut item, mut items) = (1, String::new(), Vec::new());
            for c in list.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 || (depth == 1 && c == ',') {
                    items.push(std::mem::take(&mut item));
                    if depth == 0 {
                        break;
                    }
                } else if depth >= 1 {
                    item.push(c);
                }
            }
            out.extend(items.iter().map(|i| ident(i.trim_start())).filter(|i| !i.is_empty()));
        } else {
            out.push(ident(rest));
        }
    }
    out
}

fn ident(s: &str) -> String {
    s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// A cycle among the top-level modules of the crate whose sources are in `src`, if any: module
/// `a` depends on `b` when a file of `a` (`a.rs` or under `a/`) names `crate::b`.
fn module_cycle(src: &Path) -> Option<Vec<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut deps: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> = Default::default();
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "rs")) {
        let rel = f.strip_prefix(src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .to_string();
        let module = first.trim_end_matches(".rs").to_string();
        if module == "lib" || module == "main" {
            continue;
        }
        let code = std::fs::read_to_string(f).unwrap_or_default();
        let entry = deps.entry(module.clone()).or_default();
        entry.extend(modules_named(&code).into_iter().filter(|m| *m != module));
    }
    let names: Vec<String> = deps.keys().cloned().collect();
    // Depth-first search for a back edge; the path on the stack is the cycle.
    fn visit(
        m: &str,
        deps: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        state: &mut std::collections::HashMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(m.to_string(), 1);
        path.push(m.to_string());
        for d in deps.get(m).into_iter().flatten().filter(|d| deps.contains_key(*d)) {
            match state.get(d.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = path.iter().position(|p| p == d).unwrap();
                    let mut cycle = path[at..].to_vec();
                    cycle.push(d.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(d, deps, state, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(m.to_string(), 2);
        None
    }
    let mut state = std::collections::HashMap::new();
    for n in &names {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            if let Some(c) = visit(n, &deps, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn no_crate_has_a_cycle_of_modules() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut srcs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .unwrap()
        .flatten()
        .map(|e| e.path().join("src"))
        .filter(|p| p.is_dir())
        .collect();
    srcs.push(root.join("python/src"));
    assert!(srcs.len() > 5, "found the crates: {srcs:?}");
    let cycles: Vec<String> = srcs
        .iter()
        .filter_map(|s| module_cycle(s).map(|c| format!("{}: {}", s.display(), c.join(" -> "))))
        .collect();
    assert!(
        cycles.is_empty(),
        "modules that import each other, in a cycle:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn the_cycle_check_reads_every_form_of_crate_path() {
    let code = "use crate::a::X;\nuse crate::{b, c::{D, E}, f::G};\n// crate::h in a comment\nlet x = crate::i::j();";
    assert_eq!(modules_named(code), ["a", "b", "c", "f", "i"]);
}
