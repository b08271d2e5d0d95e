//! Who a request is counted as, and which rule it is counted under: identity headers, path spellings, addresses.

#[allow(unused_imports)]
use crate::common::*;
