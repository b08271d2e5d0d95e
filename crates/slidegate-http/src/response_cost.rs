//! Counting what matters: a rule may charge a request only when the upstream
//! answers with given statuses (`count_status = [404]`: enumeration probes),
//! and may let the upstream say what the request cost in a response header
//! (`cost_header = "x-ratelimit-cost"`: an expensive search costs more).
//!
//! Denials still happen before the upstream is called: before forwarding,
//! the limiter peeks (cost 0, which writes nothing) and denies when a limit
//! has no permit left; after the response it charges, with one store call,
//! what [`ResponseCost::cost`] says, whether or not the client is still
//! there. Between the peek and the charge other requests of the identity
//! may pass the peek too, the price of deciding on something only the answer
//! knows: so at most the rule's `max_in_flight` of them may be in flight at
//! once (`in_flight.rs`), and they overshoot a limit by at most
//! `max_in_flight × max_cost`.

use http::{HeaderMap, HeaderName, StatusCode};

/// How a rule charges after the upstream answered.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResponseCost {
    /// Only responses with these statuses count; empty: every response.
    pub count_status: Vec<u16>,
    /// The response header whose value (an integer) is the request's cost.
    pub cost_header: Option<HeaderName>,
}

impl ResponseCost {
    /// Whether the rule charges after the response (else before, as usual).
    pub fn is_deferred(&self) -> bool {
        !self.count_status.is_empty() || self.cost_header.is_some()
    }

    /// The cost of a response: 0 for a status not counted; else the cost
    /// header's value when present and an integer (clamped to `0..=max_cost`),
    /// else 1.
    pub fn cost(&self, status: StatusCode, headers: &HeaderMap, max_cost: u64) -> u64 {
        if !self.count_status.is_empty() && !self.count_status.contains(&status.as_u16()) {
            return 0;
        }
        let header = self.cost_header.as_ref().and_then(|name| headers.get(name));
        match header.and_then(|v| v.to_str().ok()).map(|v| v.trim().parse::<i64>()) {
            Some(Ok(cost)) => u64::try_from(cost).unwrap_or(0).min(max_cost),
            // A missing or unreadable header costs what a request costs.
            _ => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_filter_and_the_header_sets_the_clamped_cost() {
        let mut h = HeaderMap::new();
        let probes = ResponseCost { count_status: vec![404], cost_header: None };
        assert_eq!(probes.cost(StatusCode::OK, &h, 1), 0);
        assert_eq!(probes.cost(StatusCode::NOT_FOUND, &h, 1), 1);
        let priced =
            ResponseCost { count_status: vec![], cost_header: Some(HeaderName::from_static("x-cost")) };
        assert_eq!(priced.cost(StatusCode::OK, &h, 10), 1);
        h.insert("x-cost", "5".parse().unwrap());
        assert_eq!(priced.cost(StatusCode::OK, &h, 10), 5);
        h.insert("x-cost", "500".parse().unwrap());
        assert_eq!(priced.cost(StatusCode::OK, &h, 10), 10);
        h.insert("x-cost", "-3".parse().unwrap());
        assert_eq!(priced.cost(StatusCode::OK, &h, 10), 0);
    }

    /// What a broken upstream may send: anything unreadable costs the
    /// default 1, an integer too large for i64 too, and padding is ignored.
    #[test]
    fn an_unreadable_cost_header_costs_one() {
        let priced =
            ResponseCost { count_status: vec![], cost_header: Some(HeaderName::from_static("x-cost")) };
        for bad in ["abc", "", "5.5", "0x10", "99999999999999999999", "5, 6"] {
            let mut h = HeaderMap::new();
            h.insert("x-cost", http::HeaderValue::from_str(bad).unwrap());
            assert_eq!(priced.cost(StatusCode::OK, &h, 10), 1, "{bad:?}");
        }
        let mut h = HeaderMap::new();
        h.insert("x-cost", http::HeaderValue::from_bytes(b"\xff").unwrap());
        assert_eq!(priced.cost(StatusCode::OK, &h, 10), 1, "not UTF-8");
        h.insert("x-cost", " 7 ".parse().unwrap());
        assert_eq!(priced.cost(StatusCode::OK, &h, 10), 7);
    }
}
