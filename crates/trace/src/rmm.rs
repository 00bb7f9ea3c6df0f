//! RMM `logging_resource_adaptor` CSV logs.
//!
//! # Format
//!
//! ```text
//! Thread,Time,Action,Pointer,Size,Stream
//! 140573312345856,08:54:41:839541,allocate,0x7f8a40000000,1024,0x0
//! 140573312345856,08:54:41:839560,free,0x7f8a40000000,1024,0x0
//! 140573312345856,08:54:41:839600,allocate failure,0x0,1099511627776,0x0
//! ```
//!
//! One header line, then one line per event. Columns are found by their
//! header names (case-insensitive), so their order may vary and extra columns
//! (e.g. a trailing one added by newer RMM builds) are ignored; `Time`,
//! `Action`, `Pointer`, `Size` and `Stream` are required. Fields are
//! separated by commas and never quoted in RMM's output (surrounding spaces
//! are trimmed). Blank lines are ignored; `\r\n` endings are fine.
//!
//! * `Action`: `allocate` → [`Action::Alloc`]; `free` (or `deallocate`) →
//!   [`Action::FreeRequested`] immediately followed by
//!   [`Action::FreeCompleted`] with the same fields (RMM frees are
//!   stream-ordered: the memory is reusable on that stream at once);
//!   `allocate failure` → [`Action::Oom`] with `addr` 0 (RMM does not log
//!   the free memory).
//! * `Pointer`: hex (`0x7f…`) or decimal; for failures also empty, `(nil)`,
//!   `nil`, `null` or `nullptr` (→ 0).
//! * `Size`: decimal bytes. `Stream`: hex or decimal handle.
//! * `Time`: `HH:MM:SS:ffffff` or `HH:MM:SS.ffffff` (any number of fraction
//!   digits; → microseconds since midnight, adding a day each time the clock
//!   goes backwards, i.e. at midnight), a number with a decimal point
//!   (seconds since the epoch → microseconds) or an integer (taken as
//!   microseconds). A time that cannot be parsed takes the previous row's
//!   time.
//!
//! # What the reader guarantees
//!
//! * Row order is the time order: `time_us` never decreases (a time earlier
//!   than the previous row's is raised to it).
//! * All events go to one device: the ordinal in a `.devN` suffix of the
//!   source name (RMM names per-device logs `file.csv.dev0`), else 0.
//! * The `Thread` column is not kept. There are no stacks, segments or
//!   settings.
//! * A malformed line gives an error with its 1-based line number.

use crate::{Action, DeviceTrace, ErrorKind, Location, Trace, TraceError, TraceEvent};

/// Read an RMM `logging_resource_adaptor` CSV log (see the module docs).
pub fn read_rmm_csv(text: &str, source: &str) -> Result<Trace, TraceError> {
    let trace = read_rmm_csv_unchecked(text, source)?;
    // The bounds every reader guarantees (stack ids, device ordinals): see `Trace::validate`.
    trace.validate()?;
    Ok(trace)
}

fn read_rmm_csv_unchecked(text: &str, source: &str) -> Result<Trace, TraceError> {
    let err = |line: usize, msg: String| TraceError::new(source, ErrorKind::Csv, Location::Line(line), msg);
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim().is_empty());

    let Some((hline, header)) = lines.next() else {
        return Err(err(
            1,
            "empty file: expected the header 'Thread,Time,Action,Pointer,Size,Stream'".into(),
        ));
    };
    let names: Vec<String> = header.split(',').map(|s| s.trim().to_ascii_lowercase()).collect();
    let col = |name: &str| names.iter().position(|n| n == name);
    let (Some(c_time), Some(c_action), Some(c_ptr), Some(c_size), Some(c_stream)) =
        (col("time"), col("action"), col("pointer"), col("size"), col("stream"))
    else {
        return Err(err(
            hline,
            format!("header '{header}' lacks one of the columns Time, Action, Pointer, Size, Stream"),
        ));
    };
    let needed = [c_time, c_action, c_ptr, c_size, c_stream]
        .into_iter()
        .max()
        .unwrap_or(0)
        + 1;

    let mut events = Vec::new();
    let mut clock = Clock::default();
    let mut fields: Vec<&str> = Vec::with_capacity(names.len() + 1);
    for (n, line) in lines {
        fields.clear();
        fields.extend(line.split(',').map(str::trim));
        if fields.len() < needed {
            return Err(err(
                n,
                format!(
                    "expected at least {needed} comma-separated fields, found {}",
                    fields.len()
                ),
            ));
        }
        let action = fields[c_action];
        let size = parse_uint(fields[c_size]).ok_or_else(|| err(n, format!("bad Size '{}'", fields[c_size])))?;
        let stream =
            parse_uint(fields[c_stream]).ok_or_else(|| err(n, format!("bad Stream '{}'", fields[c_stream])))?;
        let time_us = clock.next(fields[c_time]);
        let ptr = fields[c_ptr];
        let mut push = |action: Action, addr: u64| {
            events.push(TraceEvent {
                action,
                addr,
                size,
                stream,
                time_us,
                stack: None,
            });
        };
        match action {
            "allocate" => {
                let addr = parse_uint(ptr).ok_or_else(|| err(n, format!("bad Pointer '{ptr}'")))?;
                push(Action::Alloc, addr);
            }
            "free" | "deallocate" => {
                let addr = parse_uint(ptr).ok_or_else(|| err(n, format!("bad Pointer '{ptr}'")))?;
                push(Action::FreeRequested, addr);
                push(Action::FreeCompleted, addr);
            }
            "allocate failure" => {
                let null = matches!(
                    ptr.to_ascii_lowercase().as_str(),
                    "" | "(nil)" | "nil" | "null" | "nullptr"
                );
                if !null && parse_uint(ptr).is_none() {
                    return Err(err(n, format!("bad Pointer '{ptr}'")));
                }
                push(Action::Oom, 0);
            }
            other => {
                return Err(err(
                    n,
                    format!("unknown Action '{other}', expected 'allocate', 'free' or 'allocate failure'"),
                ))
            }
        }
    }
    let mut trace = Trace::new(source);
    if !events.is_empty() {
        trace.devices.push(DeviceTrace {
            device: device_from_name(source),
            events,
        });
    }
    Ok(trace)
}

/// `0x…` hex or decimal.
fn parse_uint(s: &str) -> Option<u64> {
    if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if h.is_empty() {
            return None;
        }
        u64::from_str_radix(h, 16).ok()
    } else {
        s.parse::<u64>().ok()
    }
}

/// The `N` of a `.devN` suffix (RMM's per-device log files), else 0.
fn device_from_name(source: &str) -> i32 {
    source
        .rsplit_once(".dev")
        .and_then(|(_, n)| n.parse::<i32>().ok())
        .filter(|&d| d >= 0)
        .unwrap_or(0)
}

/// Turns the `Time` column into non-decreasing microseconds.
#[derive(Default)]
struct Clock {
    last: i64,
    /// For clock-of-day times: the previous reading and the days added.
    last_of_day: Option<i64>,
    days: i64,
}

const DAY_US: i64 = 86_400_000_000;

impl Clock {
    fn next(&mut self, field: &str) -> i64 {
        let t = match parse_time_of_day(field) {
            Some(tod) => {
                if let Some(prev) = self.last_of_day {
                    if tod < prev {
                        self.days += 1;
                    }
                }
                self.last_of_day = Some(tod);
                Some(tod.saturating_add(self.days.saturating_mul(DAY_US)))
            }
            None => parse_number_time(field),
        };
        if let Some(t) = t {
            self.last = self.last.max(t);
        }
        self.last
    }
}

/// `HH:MM:SS[:.]fraction` → microseconds since midnight.
fn parse_time_of_day(s: &str) -> Option<i64> {
    let mut parts = s.splitn(3, ':');
    let h: i64 = parts.next()?.parse().ok()?;
    let m: i64 = parts.next()?.parse().ok()?;
    let rest = parts.next()?;
    let (sec, frac) = match rest.find([':', '.']) {
        Some(p) => (&rest[..p], &rest[p + 1..]),
        None => (rest, ""),
    };
    let sec: i64 = sec.parse().ok()?;
    if !(0..48).contains(&h) || !(0..60).contains(&m) || !(0..=60).contains(&sec) {
        return None;
    }
    if !frac.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    // Keep at most 6 digits (microseconds); pad shorter fractions.
    let mut us = 0i64;
    for i in 0..6 {
        us = us * 10 + frac.as_bytes().get(i).map_or(0, |c| (c - b'0') as i64);
    }
    Some(((h * 60 + m) * 60 + sec) * 1_000_000 + us)
}

/// A number: with a decimal point = seconds, else microseconds.
fn parse_number_time(s: &str) -> Option<i64> {
    if s.contains(['.', 'e', 'E']) {
        let x: f64 = s.parse().ok()?;
        let us = x * 1e6;
        (us.is_finite() && us.abs() < 9.0e18).then_some(us.round() as i64)
    } else {
        s.parse::<i64>().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times() {
        assert_eq!(
            parse_time_of_day("12:34:56:789012"),
            Some(((12 * 60 + 34) * 60 + 56) * 1_000_000 + 789_012)
        );
        assert_eq!(parse_time_of_day("00:00:01.5"), Some(1_500_000));
        assert_eq!(parse_time_of_day("00:00:01.123456789"), Some(1_123_456));
        assert_eq!(parse_time_of_day("junk"), None);
        assert_eq!(parse_number_time("1634567890.123456"), Some(1_634_567_890_123_456));
        assert_eq!(parse_number_time("42"), Some(42));
        assert_eq!(parse_number_time("nan"), None);
        let mut c = Clock::default();
        assert_eq!(c.next("23:59:59:000000"), DAY_US - 1_000_000);
        assert_eq!(c.next("00:00:01:000000"), DAY_US + 1_000_000);
        assert_eq!(c.next("garbage"), DAY_US + 1_000_000);
    }

    #[test]
    fn uints() {
        assert_eq!(parse_uint("0x7f8a40000000"), Some(0x7f8a40000000));
        assert_eq!(parse_uint("1024"), Some(1024));
        assert_eq!(parse_uint("0x"), None);
        assert_eq!(parse_uint("-1"), None);
        assert_eq!(parse_uint("0xffffffffffffffffff"), None);
    }

    #[test]
    fn device_suffix() {
        assert_eq!(device_from_name("log.csv.dev3"), 3);
        assert_eq!(device_from_name("log.csv"), 0);
    }
}
