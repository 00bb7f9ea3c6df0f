//! `memory_summary` against real PyTorch 2.11 output.
//!
//! tests/data/goldens.json (at the workspace root) holds, for several
//! allocator states, the `memory_stats()` dict (`<name>.stats`) and the text
//! of `memory_summary()` (`<name>.summary`) and
//! `memory_summary(abbreviated=True)` (`<name>.summary_abbrev`), captured
//! from torch 2.11 on device 0. Every state must render byte for byte.

use cudamem_alloc::summary::{memory_summary, stat_keys, StatsDict, STAT_KEYS, STAT_KEY_COUNT};
use serde_json::{Map, Value};
use std::collections::BTreeSet;

const GOLDENS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/data/goldens.json");

fn goldens() -> Map<String, Value> {
    let text = std::fs::read_to_string(GOLDENS).expect("read tests/data/goldens.json");
    match serde_json::from_str(&text).expect("parse goldens.json") {
        Value::Object(map) => map,
        other => panic!("goldens.json is not an object: {other:?}"),
    }
}

/// The `<name>.stats` entries, as (name, stats dict).
fn stats_entries(g: &Map<String, Value>) -> Vec<(String, StatsDict)> {
    let mut out = Vec::new();
    for (key, value) in g {
        let Some(name) = key.strip_suffix(".stats") else {
            continue;
        };
        let obj = value.as_object().unwrap_or_else(|| panic!("{key} is not an object"));
        let stats: StatsDict = obj
            .iter()
            .map(|(k, v)| {
                let n = v
                    .as_i64()
                    .unwrap_or_else(|| panic!("{key}[{k}] is not an integer: {v}"));
                (k.clone(), n)
            })
            .collect();
        out.push((name.to_string(), stats));
    }
    assert!(!out.is_empty(), "no <name>.stats entries in goldens.json");
    out
}

fn golden_text<'a>(g: &'a Map<String, Value>, key: &str) -> &'a str {
    g.get(key)
        .unwrap_or_else(|| panic!("goldens.json lacks {key}"))
        .as_str()
        .unwrap_or_else(|| panic!("{key} is not a string"))
}

/// A readable line diff: every differing line, with its number.
fn line_diff(expected: &str, actual: &str) -> String {
    let e: Vec<&str> = expected.split('\n').collect();
    let a: Vec<&str> = actual.split('\n').collect();
    let mut out = String::new();
    for i in 0..e.len().max(a.len()) {
        let (el, al) = (e.get(i), a.get(i));
        if el != al {
            out.push_str(&format!("line {}:\n  expected {:?}\n  actual   {:?}\n", i + 1, el, al));
        }
    }
    out
}

fn check(name: &str, expected: &str, actual: &str, failures: &mut Vec<String>) {
    if expected != actual {
        failures.push(format!("{name} differs:\n{}", line_diff(expected, actual)));
    }
}

#[test]
fn every_golden_summary_matches_exactly() {
    let g = goldens();
    let mut failures = Vec::new();
    let mut checked = 0;
    for (name, stats) in stats_entries(&g) {
        let full = memory_summary(&stats, 0, false);
        check(
            &format!("{name}.summary"),
            golden_text(&g, &format!("{name}.summary")),
            &full,
            &mut failures,
        );
        let abbrev = memory_summary(&stats, 0, true);
        check(
            &format!("{name}.summary_abbrev"),
            golden_text(&g, &format!("{name}.summary_abbrev")),
            &abbrev,
            &mut failures,
        );
        checked += 2;
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // empty, resnet50, after_oom, after_empty_cache at the time of writing.
    assert!(checked >= 8, "only {checked} summaries checked");
}

#[test]
fn every_golden_stats_dict_has_the_122_keys() {
    let g = goldens();
    let expected: BTreeSet<String> = stat_keys().into_iter().collect();
    assert_eq!(expected.len(), STAT_KEY_COUNT);
    for (name, stats) in stats_entries(&g) {
        assert_eq!(stats.len(), 122, "{name}.stats has {} keys", stats.len());
        let got: BTreeSet<String> = stats.keys().cloned().collect();
        assert_eq!(got, expected, "{name}.stats keys differ from STAT_KEYS");
        // PyTorch sorts the dict; a BTreeMap's order is that same order.
        let order: Vec<&str> = stats.keys().map(String::as_str).collect();
        assert_eq!(order, STAT_KEYS.to_vec());
    }
}
