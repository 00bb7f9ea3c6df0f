//! Allocator configuration (being written).
