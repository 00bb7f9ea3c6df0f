//! # The policy registry: every policy name, in one table
//!
//! [`REGISTRY`] has one row per name the command line, the configuration's `policy:` key and the
//! APIs accept: the name, a constructor, the settings the name implies, whether `compare` and
//! `fit` run it when no policy is named, and a one-line description. Everything else is derived
//! from it: [`POLICY_NAMES`] (which every test, fuzz target and benchmark iterates), parsing
//! ([`by_name`]), the help texts ([`help`]), the default lists ([`default_policies`]) and the
//! settings a replay reports ([`with_implied_settings`]).
//!
//! Adding a policy is one file in this folder (the [`super::Policy`] implementation) and one row
//! here. Code outside this module never compares a policy's name with a literal: it asks the
//! registry or the policy (e.g. [`super::Policy::reproduces_pytorch`]).
//!
//! Invariants: names are unique (a unit test checks it), and a row's implied settings parse as
//! `PYTORCH_CUDA_ALLOC_CONF` and are applied on top of the caller's configuration by [`by_name`].

use super::{CudamemPolicy, Policy, PytorchPolicy, Reclaim};
use crate::config::AllocatorConfig;

/// The name of PyTorch's native policy under the configuration's own `expandable_segments`.
pub const PYTORCH: &str = "pytorch";
/// The name of PyTorch's policy with `expandable_segments:True` implied.
pub const PYTORCH_EXPANDABLE: &str = "pytorch-expandable";
/// The name of the default policy of the APIs (`cudamem`).
pub const DEFAULT: &str = "cudamem";

/// One registered policy name.
#[derive(Clone, Copy, Debug)]
pub struct PolicyEntry {
    /// The name, as given to `--policy` or `policy:`.
    pub name: &'static str,
    /// Builds the policy.
    pub make: fn() -> Box<dyn Policy>,
    /// Settings the name implies, in `PYTORCH_CUDA_ALLOC_CONF` syntax ("" for none): applied over
    /// the caller's configuration when the name is chosen.
    pub implies: &'static str,
    /// Where `compare` and `fit` run this policy when none is named (lowest first; `None`: only
    /// when named).
    pub compare_rank: Option<u8>,
    /// One line for the help texts.
    pub doc: &'static str,
}

/// Every policy name, in the order help texts and tests list them.
pub const REGISTRY: &[PolicyEntry] = &[
    PolicyEntry {
        name: DEFAULT,
        make: || {
            Box::new(CudamemPolicy {
                reclaim: Reclaim::LargeGrowths,
            })
        },
        implies: "",
        compare_rank: Some(2),
        doc: "PyTorch's rules on 2 MiB pages, free memory moved to large growths, no steady-state driver calls (the default)",
    },
    PolicyEntry {
        name: "cudamem-compact",
        make: || {
            Box::new(CudamemPolicy {
                reclaim: Reclaim::Pages,
            })
        },
        implies: "",
        compare_rank: None,
        doc: "cudamem plus reclaim of free pages at the high-water mark: less memory, more driver calls",
    },
    PolicyEntry {
        name: "cudamem-compact16",
        make: || {
            Box::new(CudamemPolicy {
                reclaim: Reclaim::Chunks,
            })
        },
        implies: "",
        compare_rank: None,
        doc: "cudamem-compact in 16 MiB mappings: near its memory, no steady-state driver calls in training loops",
    },
    PolicyEntry {
        name: PYTORCH,
        make: || Box::new(PytorchPolicy),
        implies: "",
        compare_rank: Some(0),
        doc: "PyTorch's native caching allocator, rule for rule",
    },
    PolicyEntry {
        name: PYTORCH_EXPANDABLE,
        make: || Box::new(PytorchPolicy),
        implies: "expandable_segments:True",
        compare_rank: Some(1),
        doc: "PyTorch's allocator with expandable_segments:True",
    },
];

/// The names of [`REGISTRY`]'s rows, in order, at compile time.
const fn names<const N: usize>(table: &[PolicyEntry]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut i = 0;
    while i < N {
        out[i] = table[i].name;
        i += 1;
    }
    out
}

/// The policy names the command line and the APIs accept (those of [`REGISTRY`]).
pub const POLICY_NAMES: &[&str] = &names::<{ REGISTRY.len() }>(REGISTRY);

/// The row of a name.
pub fn entry(name: &str) -> Option<&'static PolicyEntry> {
    REGISTRY.iter().find(|e| e.name == name)
}

/// The policy of a name, after applying to `cfg` the settings that name implies
/// (`pytorch-expandable` is PyTorch's policy with `expandable_segments:True`).
pub fn by_name(name: &str, cfg: &mut AllocatorConfig) -> Result<Box<dyn Policy>, String> {
    let Some(e) = entry(name) else {
        return Err(format!("unknown policy '{name}' (known: {})", POLICY_NAMES.join(", ")));
    };
    apply_implied(e, cfg);
    Ok((e.make)())
}

/// Applies a row's implied settings to the fields of `cfg` (not to its `settings` string, which
/// stays what the caller wrote).
fn apply_implied(e: &PolicyEntry, cfg: &mut AllocatorConfig) {
    if e.implies.is_empty() {
        return;
    }
    cfg.apply_over(e.implies)
        .unwrap_or_else(|err| panic!("policy '{}' implies invalid settings: {err}", e.name));
}

/// Whether `name` implies no settings: under it, a configuration means what it says.
pub fn implies_nothing(name: &str) -> bool {
    entry(name).is_none_or(|e| e.implies.is_empty())
}

/// Whether a replay under `name` and a trace's own settings makes the decisions the recorded
/// allocator made, so that it can give new segments the recorded addresses: the name's policy
/// [reproduces PyTorch](Policy::reproduces_pytorch) and the name implies no settings.
pub fn replays_recorded_decisions(name: &str) -> bool {
    entry(name).is_some_and(|e| e.implies.is_empty() && (e.make)().reproduces_pytorch())
}

/// `config` (a `PYTORCH_CUDA_ALLOC_CONF` string) with the settings `policy` implies appended,
/// except those whose key `config` already names: the settings a run under that name had.
pub fn with_implied_settings(config: &str, policy: &str) -> String {
    let mut out = config.to_string();
    let Some(e) = entry(policy) else { return out };
    for item in e.implies.split(',').filter(|s| !s.is_empty()) {
        let key = item.split(':').next().unwrap_or(item).trim();
        if config.contains(key) {
            continue;
        }
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(item);
    }
    out
}

/// A warning when `config` (a `PYTORCH_CUDA_ALLOC_CONF` string) sets `expandable_segments`
/// and the policy `name` does not follow it: the name implies the other value, or the policy
/// grows its pools the same way under either value. `None` when the setting is followed, not
/// given, or the string does not parse (its parser reports that).
pub fn ignored_expandable_setting(name: &str, config: &str) -> Option<String> {
    let e = entry(name)?;
    let given = AllocatorConfig::parse(config).ok()?;
    if !config.contains("expandable_segments") {
        return None;
    }
    let wanted = given.expandable_segments;
    let mut cfg = given.clone();
    let policy = by_name(name, &mut cfg).ok()?;
    let grows = |expandable: bool| {
        let mut c = cfg.clone();
        c.expandable_segments = expandable;
        (0..policy.pools().len())
            .map(|i| policy.expandable_page_size(&c, super::PoolId(i as u16)).is_some())
            .collect::<Vec<_>>()
    };
    if cfg.expandable_segments != wanted {
        Some(format!(
            "policy '{}' implies expandable_segments:{}; the expandable_segments:{} of the configuration is ignored",
            e.name,
            py_bool(cfg.expandable_segments),
            py_bool(wanted)
        ))
    } else if grows(true) == grows(false) {
        Some(format!(
            "policy '{}' grows its pools the same way whatever expandable_segments says; \
             expandable_segments:{} has no effect on it (policy pytorch follows the setting)",
            e.name,
            py_bool(wanted)
        ))
    } else {
        None
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

/// The policies `compare` and `fit` run when none is named, comma-separated.
pub fn default_policies() -> String {
    let mut v: Vec<(u8, &str)> = REGISTRY
        .iter()
        .filter_map(|e| Some((e.compare_rank?, e.name)))
        .collect();
    v.sort_unstable();
    v.iter().map(|(_, n)| *n).collect::<Vec<_>>().join(",")
}

/// A policy option's help: `what`, then the names the registry knows (with `list`, as a
/// comma-separated list).
pub fn help(what: &str, list: bool) -> String {
    let known = POLICY_NAMES.join(", ");
    if list {
        format!("{what}: any of {known} (also accepted as --policy/--policies)")
    } else {
        format!("{what}: one of {known}")
    }
}

/// One line per policy, `name  doc`, for a long help text.
pub fn descriptions() -> String {
    let w = POLICY_NAMES.iter().map(|n| n.len()).max().unwrap_or(0);
    REGISTRY
        .iter()
        .map(|e| format!("  {:w$}  {}\n", e.name, e.doc))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_construct_their_policy() {
        for (i, e) in REGISTRY.iter().enumerate() {
            assert!(REGISTRY[..i].iter().all(|o| o.name != e.name), "{} twice", e.name);
            let mut cfg = AllocatorConfig::default();
            let p = by_name(e.name, &mut cfg).unwrap();
            assert!(e.name.starts_with(p.name()), "{} builds {}", e.name, p.name());
        }
        assert_eq!(POLICY_NAMES.len(), REGISTRY.len());
    }

    #[test]
    fn implied_settings() {
        let mut cfg = AllocatorConfig::default();
        by_name(PYTORCH_EXPANDABLE, &mut cfg).unwrap();
        assert!(cfg.expandable_segments);
        assert_eq!(cfg.settings, "");
        assert_eq!(
            with_implied_settings("", PYTORCH_EXPANDABLE),
            "expandable_segments:True"
        );
        assert_eq!(
            with_implied_settings("max_split_size_mb:64", PYTORCH_EXPANDABLE),
            "max_split_size_mb:64,expandable_segments:True"
        );
        assert_eq!(
            with_implied_settings("expandable_segments:False", PYTORCH_EXPANDABLE),
            "expandable_segments:False"
        );
        assert_eq!(with_implied_settings("x", PYTORCH), "x");
        assert!(replays_recorded_decisions(PYTORCH));
        assert!(!replays_recorded_decisions(PYTORCH_EXPANDABLE) && !replays_recorded_decisions(DEFAULT));
        assert_eq!(default_policies(), "pytorch,pytorch-expandable,cudamem");
    }

    #[test]
    fn an_expandable_setting_a_policy_does_not_follow_is_named() {
        let w = ignored_expandable_setting(DEFAULT, "expandable_segments:False").unwrap();
        assert!(w.contains("'cudamem'") && w.contains("no effect"), "{w}");
        let w = ignored_expandable_setting(PYTORCH_EXPANDABLE, "expandable_segments:False").unwrap();
        assert!(w.contains("implies expandable_segments:True"), "{w}");
        assert_eq!(ignored_expandable_setting(PYTORCH, "expandable_segments:False"), None);
        assert_eq!(ignored_expandable_setting(PYTORCH, "expandable_segments:True"), None);
        assert_eq!(
            ignored_expandable_setting(PYTORCH_EXPANDABLE, "expandable_segments:True"),
            None
        );
        assert_eq!(ignored_expandable_setting(DEFAULT, "max_split_size_mb:64"), None);
    }
}
