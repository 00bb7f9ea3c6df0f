//! # The syntax of a settings string: tokens, entries, values
//!
//! As PyTorch's `ConfigTokenizer`: every whitespace character is dropped before tokenizing, a
//! value is one token or a bracketed list, a trailing comma is accepted, and a HIP alias names
//! its CUDA key. [`parse_entries`] gives the entries in order and refuses a key given twice.
//! Guarantees: no input panics; a rejection is a [`ConfigError`] naming the key.

use super::*;

/// A parsed value: one token, or a bracketed list of `a:b` pairs.
#[derive(Debug)]
pub(super) enum Value {
    Scalar(String),
    /// Each item is the tokens between two commas, e.g. `["256", ":", "4"]`.
    List(Vec<Vec<String>>),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Scalar(s) => f.write_str(s),
            Value::List(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    f.write_str(&item.concat())?;
                }
                f.write_str("]")
            }
        }
    }
}

/// One `key:value` pair of a settings string.
#[derive(Debug)]
pub(super) struct Entry<'s> {
    pub(super) key: String,
    pub(super) value: Value,
    /// The whole settings string, for messages.
    pub(super) source: &'s str,
}

impl Entry<'_> {
    pub(super) fn error(&self, detail: String) -> ConfigError {
        ConfigError::new(&self.key, format!("{}: {detail}", self.key))
    }

    pub(super) fn scalar(&self) -> Result<&str, ConfigError> {
        match &self.value {
            Value::Scalar(s) => Ok(s),
            list => Err(self.error(format!("expected a single value, got the list '{list}'"))),
        }
    }

    pub(super) fn boolean(&self) -> Result<bool, ConfigError> {
        match self.scalar()? {
            "True" => Ok(true),
            "False" => Ok(false),
            other => Err(self.error(format!("expected True or False, got '{other}'"))),
        }
    }
}

/// PyTorch's `ConfigTokenizer`: `,` `:` `[` `]` are tokens of their own,
/// whitespace (C's `isspace`) is dropped everywhere, the rest accumulates.
pub(super) fn tokenize(s: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut buf = String::new();
    for ch in s.chars() {
        match ch {
            ',' | ':' | '[' | ']' => {
                if !buf.is_empty() {
                    tokens.push(std::mem::take(&mut buf));
                }
                tokens.push(ch.to_string());
            }
            ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r' => {}
            _ => buf.push(ch),
        }
    }
    if !buf.is_empty() {
        tokens.push(buf);
    }
    tokens
}

/// The key a HIP alias stands for; every other key is itself.
pub(super) fn canonical_key(key: &str) -> &str {
    match key {
        "release_lock_on_hipmalloc" => "release_lock_on_cudamalloc",
        "pinned_use_hip_host_register" => "pinned_use_cuda_host_register",
        k => k,
    }
}

pub(super) fn is_separator(tok: &str) -> bool {
    matches!(tok, "," | ":" | "[" | "]")
}

/// Checks the syntax of the whole string and splits it into entries, so
/// that no key is applied from a string that is malformed further on.
pub(super) fn parse_entries(s: &str) -> Result<Vec<Entry<'_>>, ConfigError> {
    let toks = tokenize(s);
    let at = |i: usize| toks.get(i).map(String::as_str);
    let found = |i: usize| match toks.get(i) {
        Some(t) => format!("'{t}'"),
        None => "the end".to_string(),
    };
    let mut entries: Vec<Entry> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let key = toks[i].as_str();
        if is_separator(key) {
            let message = if matches!(key, "," | ":") {
                format!("empty key before '{key}' in allocator config '{s}'")
            } else {
                format!("expected a key, got '{key}' in allocator config '{s}'")
            };
            return Err(ConfigError::new("", message));
        }
        let err = |detail: String| ConfigError::new(key, format!("{key}: {detail} in allocator config '{s}'"));
        if at(i + 1) != Some(":") {
            return Err(err(format!("expected ':' after the key, got {}", found(i + 1))));
        }
        let value = match at(i + 2) {
            None => return Err(err("missing value".into())),
            Some("[") => {
                // Items are the token runs between commas; PyTorch accepts a
                // trailing comma before ']'.
                let mut items: Vec<Vec<String>> = Vec::new();
                let mut item: Vec<String> = Vec::new();
                let mut j = i + 3;
                loop {
                    match at(j) {
                        None => return Err(err("missing ']' at the end of the list".into())),
                        Some("]") => {
                            if !item.is_empty() {
                                items.push(std::mem::take(&mut item));
                            }
                            break;
                        }
                        Some(",") => {
                            if item.is_empty() {
                                return Err(err(format!("empty item in the list, at {}", found(j))));
                            }
                            items.push(std::mem::take(&mut item));
                        }
                        Some("[") => return Err(err("'[' inside a list".into())),
                        Some(t) => item.push(t.to_string()),
                    }
                    j += 1;
                }
                i = j; // at the closing ']'
                Value::List(items)
            }
            Some(v) if is_separator(v) => {
                return Err(err(format!("missing value before '{v}'")));
            }
            Some(v) => {
                i += 2;
                Value::Scalar(v.to_string())
            }
        };
        if let Some(first) = entries.iter().find(|e| canonical_key(&e.key) == canonical_key(key)) {
            let also = if first.key == key {
                String::new()
            } else {
                format!(" (as '{}')", first.key)
            };
            return Err(ConfigError::new(
                key,
                format!("{key}: the key is given twice{also} in allocator config '{s}'; give each key once"),
            ));
        }
        entries.push(Entry {
            key: key.to_string(),
            value,
            source: s,
        });
        // `i` is at the value's last token; a ',' must follow unless done.
        match at(i + 1) {
            None => i += 1,
            Some(",") => i += 2,
            Some(_) => {
                let value_text = entries.last().map(|e| e.value.to_string()).unwrap_or_default();
                return Err(err(format!(
                    "expected ',' after the value '{value_text}', got {}",
                    found(i + 1)
                )));
            }
        }
    }
    Ok(entries)
}
