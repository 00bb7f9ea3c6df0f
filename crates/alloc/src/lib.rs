//! placeholder: the engine is being written
pub mod config;
pub mod summary;
