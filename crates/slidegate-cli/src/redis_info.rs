//! Figures read from a Redis server's `INFO`: the memory it uses and the CPU
//! its scripts cost, for `demo` and `bench` to report.

use redis::aio::ConnectionLike;

/// `used_memory` of `INFO memory`: bytes the server has allocated.
pub async fn used_memory(conn: &mut impl ConnectionLike) -> Result<u64, Box<dyn std::error::Error>> {
    let info: String = redis::cmd("INFO").arg("memory").query_async(conn).await?;
    used_memory_in(&info).ok_or_else(|| "INFO memory has no used_memory line".into())
}

/// `usec / calls` of `EVALSHA` and the native module's `SLIDEGATE.DECIDE`
/// together in `INFO commandstats`: server CPU per decision since the last
/// `CONFIG RESETSTAT` (a store on a server with the module loaded decides
/// single limits there), 0 when there were no calls.
pub async fn evalsha_usec_per_call(
    conn: &mut impl ConnectionLike,
) -> Result<f64, Box<dyn std::error::Error>> {
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await?;
    evalsha_usec_per_call_in(&info)
}

fn used_memory_in(info: &str) -> Option<u64> {
    info.lines().find_map(|line| line.strip_prefix("used_memory:")).and_then(|v| v.trim().parse().ok())
}

fn evalsha_usec_per_call_in(info: &str) -> Result<f64, Box<dyn std::error::Error>> {
    let (calls, usec) = command_totals(info, &["evalsha", "slidegate.decide", "slidegate.decide_all"])
        .ok_or("INFO commandstats has no cmdstat_evalsha line")?;
    Ok(if calls > 0 { usec as f64 / calls as f64 } else { 0.0 })
}

/// The calls and server µs of `commands` (as Redis names them: `evalsha`,
/// `slidegate.decide`) added up from the text of `INFO commandstats`;
/// `None` when the server has run none of them.
pub fn command_totals(info: &str, commands: &[&str]) -> Option<(u64, u64)> {
    let field = |fields: &str, name: &str| -> u64 {
        fields.split(',').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok()).unwrap_or(0)
    };
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            commands.contains(&name).then_some(fields)
        })
        .fold(None, |total, fields| {
            let (calls, usec) = total.unwrap_or((0, 0));
            Some((calls + field(fields, "calls"), usec + field(fields, "usec")))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn used_memory_is_read_from_its_own_line() {
        let info = "# Memory\r\nused_memory:1048576\r\nused_memory_human:1.00M\r\nused_memory_rss:4096\r\n";
        assert_eq!(used_memory_in(info), Some(1_048_576));
        assert_eq!(used_memory_in("# Memory\r\nused_memory_rss:4096\r\n"), None);
    }

    #[test]
    fn evalsha_cost_is_usec_over_calls() {
        let info = "# Commandstats\r\ncmdstat_eval:calls=9,usec=90,usec_per_call=10.00\r\n\
                    cmdstat_evalsha:calls=4,usec=18,usec_per_call=4.50,rejected_calls=0,failed_calls=0\r\n";
        assert_eq!(evalsha_usec_per_call_in(info).ok(), Some(4.5));
        assert!(evalsha_usec_per_call_in("# Commandstats\r\n").is_err());
        let with_module = "cmdstat_slidegate.decide:calls=6,usec=6,usec_per_call=1.00\r\n";
        assert_eq!(evalsha_usec_per_call_in(with_module).ok(), Some(1.0));
    }
}
