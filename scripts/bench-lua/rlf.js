// rate-limiter-flexible's RateLimiterRedis (fixed window, 100 per 60 s)
// against one Redis: Redis server µs per consume(). Run by scripts/bench-lua.sh:
//   node rlf.js PORT SECONDS [KEYS] [CONNECTIONS] [IN_FLIGHT_PER_CONNECTION]
// Prints one JSON object on stdout.
'use strict';
const Redis = require('ioredis');
const { RateLimiterRedis } = require('rate-limiter-flexible');
const version = require('rate-limiter-flexible/package.json').version;

const [port, seconds, keys = 100000, conns = 4, perConn = 32] = process.argv.slice(2).map(Number);
const connect = () => new Redis({ host: '127.0.0.1', port, commandTimeout: 30000, maxRetriesPerRequest: 0 });

// Like slidegate's bench: 4 connections × 32 in flight (128 in all).
const clients = Array.from({ length: conns }, connect);
const admin = connect();
// The commands the library itself sends, counted on the client side: INFO
// commandstats also lists the calls a Lua script makes (set, incrby, ...),
// whose time is already inside EVALSHA's, so summing every line would count
// it twice.
let sent = {};
for (const c of clients) {
  const send = c.sendCommand.bind(c);
  c.sendCommand = (cmd, stream) => { sent[cmd.name] = (sent[cmd.name] || 0) + 1; return send(cmd, stream); };
}
const limiters = clients.map((storeClient) =>
  new RateLimiterRedis({ storeClient, keyPrefix: 'rlf', points: 100, duration: 60 }));

// Each worker takes keys t, t + workers, t + 2·workers, ... (mod keys), so
// the keys are cycled round-robin as in slidegate's bench. A rejection (over
// the limit) is still a decision: count it.
async function run(until, once) {
  const workers = conns * perConn;
  let calls = 0, rejected = 0;
  await Promise.all(Array.from({ length: workers }, async (_, t) => {
    const limiter = limiters[t % conns];
    for (let i = t; once ? i < keys : Date.now() < until; i += workers) {
      try { await limiter.consume(`k${i % keys}`); } catch (e) {
        if (e instanceof Error) throw e;
        rejected++;
      }
      calls++;
    }
  }));
  return { calls, rejected };
}

function commandstats(info) {
  const stats = {};
  for (const m of info.matchAll(/^cmdstat_([^:]+):calls=(\d+),usec=(\d+)/gm)) {
    stats[m[1]] = { calls: +m[2], usec: +m[3], usec_per_call: +(m[3] / m[2]).toFixed(3) };
  }
  return stats;
}

(async () => {
  await admin.flushall('SYNC');
  await run(0, true); // warm-up: every key once, so all are present when timed
  // As slidegate's bench does: let Redis finish growing its key table, whose
  // rehash steps would otherwise be charged to the timed commands.
  await new Promise((r) => setTimeout(r, 3000));
  await admin.config('RESETSTAT');
  sent = {};
  const began = Date.now();
  const { calls, rejected } = await run(began + seconds * 1000, false);
  const elapsed = (Date.now() - began) / 1000;
  const stats = commandstats(await admin.info('commandstats'));
  const sentStats = Object.fromEntries(Object.keys(sent).map((n) => [n, { sent: sent[n], ...stats[n] }]));
  const usec = Object.values(sentStats).reduce((s, c) => s + (c.usec || 0), 0);
  const inside = Object.fromEntries(Object.entries(stats).filter(([n]) => !(n in sent) && !['config', 'info'].includes(n.split('|')[0])));
  console.log(JSON.stringify({
    version, keys, in_flight: conns * perConn, seconds: elapsed, consumes: calls, rejected,
    consumes_per_sec: Math.round(calls / elapsed),
    server_us_per_consume: +(usec / calls).toFixed(3),
    sent: sentStats, // what the library sent: these add up to the figure above
    inside_script: inside, // what its script called, already inside EVALSHA's usec
  }));
  await admin.flushall('SYNC'); // leave the server empty for slidegate's phase
  for (const c of [...clients, admin]) c.disconnect();
})().catch((e) => { console.error(e); process.exit(1); });
