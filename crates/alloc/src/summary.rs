//! memory_summary (being written).
