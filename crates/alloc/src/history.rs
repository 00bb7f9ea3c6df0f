//! # Memory history: what the allocator did, in PyTorch's trace vocabulary
//!
//! When enabled (`record_memory_history`), the engine appends one [`HistoryEntry`] per event —
//! `alloc`, `free_requested`, `free_completed`, `segment_alloc`, `segment_free`, `segment_map`,
//! `segment_unmap`, `oom`, `snapshot` and user annotations — to a ring buffer of at most
//! `max_entries`, the same entries PyTorch's `_record_memory_history` keeps. All of them are
//! emitted from one function of the engine, so nothing is recorded twice or missed.
//!
//! When disabled the engine's only cost is one branch on [`History::enabled`].

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

pub use cudamem_trace_types::{Action, Frame, Stack};

/// Which events carry stacks (PyTorch's `context` argument).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum RecordContext {
    /// No stacks.
    #[default]
    Never,
    /// Stacks of live blocks only.
    State,
    /// Also on `alloc` entries.
    Alloc,
    /// Also on frees.
    All,
}

/// One recorded event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HistoryEntry {
    /// What happened.
    pub action: Action,
    /// Address (for `oom`: the device's free bytes, as PyTorch records it).
    pub addr: u64,
    /// Bytes (requested bytes for alloc/free entries, segment bytes for segment entries).
    pub size: u64,
    /// Stream.
    pub stream: u64,
    /// Microseconds since the allocator started, or the time a replay gave.
    pub time_us: i64,
    /// Interned stack, if recorded.
    pub stack: Option<u32>,
}

/// The history ring buffer and its stack table.
#[derive(Debug)]
pub struct History {
    /// Recording on.
    pub enabled: bool,
    /// Which events carry stacks.
    pub context: RecordContext,
    /// Ring size.
    pub max_entries: usize,
    /// The entries, oldest first.
    pub entries: VecDeque<HistoryEntry>,
    /// Interned stacks; entries refer to them by index.
    pub stacks: Vec<Stack>,
    stack_index: HashMap<Vec<(String, String, i64)>, u32>,
    start: Instant,
    /// When set, the time of the next entries (trace replay drives the clock).
    pub manual_time_us: Option<i64>,
    /// User annotations: (time, stage, name).
    pub annotations: Vec<(i64, String, String)>,
}

impl Default for History {
    fn default() -> Self {
        History {
            enabled: false,
            context: RecordContext::Never,
            max_entries: usize::MAX,
            entries: VecDeque::new(),
            stacks: Vec::new(),
            stack_index: HashMap::new(),
            start: Instant::now(),
            manual_time_us: None,
            annotations: Vec::new(),
        }
    }
}

impl History {
    /// Appends an entry, dropping the oldest when the ring is full.
    pub fn push(&mut self, action: Action, addr: u64, size: u64, stream: u64, stack: Option<u32>) {
        let time_us = self.now_us();
        if self.entries.len() >= self.max_entries.max(1) {
            self.entries.pop_front();
        }
        self.entries.push_back(HistoryEntry {
            action,
            addr,
            size,
            stream,
            time_us,
            stack,
        });
    }

    /// The current time of the history clock.
    pub fn now_us(&self) -> i64 {
        self.manual_time_us
            .unwrap_or_else(|| self.start.elapsed().as_micros() as i64)
    }

    /// Interns a stack and returns its index.
    pub fn intern(&mut self, frames: Vec<Frame>) -> u32 {
        let key: Vec<_> = frames
            .iter()
            .map(|f| (f.name.clone(), f.filename.clone(), f.line))
            .collect();
        if let Some(&i) = self.stack_index.get(&key) {
            return i;
        }
        let i = self.stacks.len() as u32;
        self.stacks.push(Stack { frames });
        self.stack_index.insert(key, i);
        i
    }
}
