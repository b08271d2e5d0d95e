//! The circuit breaker and the fallback limiter under stalls and outages.

#[allow(unused_imports)]
use crate::common::*;
