//! The Redis store (placeholder until the scripts land).
