//! The penalty box as the HTTP limiter sees it: a blocked identity is denied
//! by every policy of its rule until the block ends.
//!
//! The store keeps the block (see `slidegate::Penalty`), so every instance
//! sharing it refuses the identity; the deny cache keeps it locally until it
//! ends, so a blocked identity costs no store call per request. A block
//! covers every cost: unlike a limit's denial, a smaller request does not
//! fit sooner.
//!
//! Under a rule with a penalty the deny cache answers blocks only, not the
//! limits' own denials: the store must count each denial to know when to
//! block. So an abusive identity costs at most `after + 1` store calls per
//! `within` before its block, then none until the block ends. (Counting
//! cached denials locally and reporting them in batches would save those
//! calls too, at the price of instances disagreeing on the count.)

use std::time::Duration;

use slidegate::{Charge, Decision};

/// Every policy's denial while the identity is blocked for `wait`: no
/// permit left, back (and retry) when the block ends.
pub(crate) fn block_denials(charges: &[Charge], wait: Duration) -> Vec<Decision> {
    charges
        .iter()
        .map(|c| Decision {
            allowed: false,
            limit: c.limit.quota.permits(),
            remaining: 0,
            reset_after: wait,
            retry_after: Some(wait),
        })
        .collect()
}
