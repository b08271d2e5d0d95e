//! One behaviour, two stores: every case runs against the embedded
//! `MemoryStore` and against `RedisStore` on a spawned `redis-server`, both
//! deciding on the same kind of `ManualClock`, and asserts exact values.
#![cfg(feature = "redis")]

mod support;
#[macro_use]
mod conformance_cases;

macro_rules! conformance {
    ($($case:ident),* $(,)?) => {
        mod memory {
            use slidegate::{ManualClock, MemoryStore};
            $(
                #[tokio::test]
                async fn $case() {
                    let clock = ManualClock::new(crate::support::T0);
                    let store = MemoryStore::with_clock(clock.clone());
                    crate::conformance_cases::$case(&store, &clock).await;
                }
            )*
        }

        mod redis {
            use slidegate::ManualClock;
            use slidegate_test_redis::RedisServer;
            $(
                #[tokio::test]
                async fn $case() {
                    let server = RedisServer::spawn();
                    let clock = ManualClock::new(crate::support::T0);
                    let store = crate::support::client_time_store(&server, &clock, stringify!($case)).await;
                    crate::conformance_cases::$case(&store, &clock).await;
                }
            )*
        }
    };
}

with_conformance_cases!(conformance);
