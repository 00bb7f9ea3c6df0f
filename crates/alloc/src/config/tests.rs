//! Unit tests of `config`: they use its private items. By topic: [`parse`] (every key's values,
//! bounds and error messages, the string syntax) and [`apply`] (changing a configuration at run
//! time, the environment, and what parsed values do: size rounding, the settings map, odd
//! inputs). The helpers below are shared by both.

mod apply;
mod parse;

use super::*;

fn parse(s: &str) -> AllocatorConfig {
    AllocatorConfig::parse(s).unwrap_or_else(|e| panic!("{s:?} rejected: {e}"))
}

fn error(s: &str) -> String {
    match AllocatorConfig::parse(s) {
        Ok(c) => panic!("{s:?} accepted: {c:?}"),
        Err(e) => {
            assert_eq!(e.to_string(), e.message());
            e.to_string()
        }
    }
}
