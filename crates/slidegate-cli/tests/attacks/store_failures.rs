//! Redis dying, stalling, flushing its scripts or returning while requests run.

#[allow(unused_imports)]
use crate::common::*;
