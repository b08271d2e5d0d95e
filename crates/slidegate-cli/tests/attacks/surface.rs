//! The admin endpoints, the protocol edges and the resources one client can pin.

#[allow(unused_imports)]
use crate::common::*;
