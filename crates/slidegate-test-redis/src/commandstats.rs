//! `INFO commandstats`, read: how often a server ran each command. Tests use
//! it to see which engine decided (`evalsha`, `slidegate.decide`) and that a
//! denial answered in process never reached Redis.

use crate::node::redis_cli;
use crate::RedisServer;

/// The calls per command in one `INFO commandstats` reply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommandStats {
    calls: Vec<(String, u64)>,
}

impl CommandStats {
    /// Reads the text of `INFO commandstats`: one line per command run so far,
    /// `cmdstat_<name>:calls=<n>,usec=…`; other lines are ignored.
    pub fn parse(info: &str) -> Self {
        let calls = info
            .lines()
            .filter_map(|line| {
                let (name, fields) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = fields.split(',').find_map(|f| f.strip_prefix("calls="))?.parse().ok()?;
                Some((name.to_owned(), calls))
            })
            .collect();
        Self { calls }
    }

    /// Asks the server on loopback `port` (through `redis-cli`).
    pub fn of_port(port: u16) -> Self {
        Self::parse(&redis_cli(port, &[], &["INFO", "commandstats"]))
    }

    /// Calls of `cmd` (lower case, as Redis names it: `evalsha`,
    /// `slidegate.decide_all`); 0 for a command the server has not run.
    pub fn calls(&self, cmd: &str) -> u64 {
        self.calls.iter().find(|(name, _)| name == cmd).map_or(0, |&(_, n)| n)
    }
}

impl RedisServer {
    /// The server's `INFO commandstats` now.
    pub fn command_stats(&self) -> CommandStats {
        CommandStats::of_port(self.port())
    }
}

#[cfg(test)]
mod tests {
    use super::CommandStats;

    #[test]
    fn reads_the_calls_of_each_command() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=12,usec=340,usec_per_call=28.33,rejected_calls=0,failed_calls=1\r\n\
            cmdstat_eval:calls=1,usec=90,usec_per_call=90.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_slidegate.decide_all:calls=7,usec=21,usec_per_call=3.00,rejected_calls=0,failed_calls=0\r\n";
        let stats = CommandStats::parse(info);
        assert_eq!(stats.calls("evalsha"), 12);
        assert_eq!(stats.calls("eval"), 1);
        assert_eq!(stats.calls("slidegate.decide_all"), 7);
        assert_eq!(stats.calls("slidegate.decide"), 0);
    }
}
