// rate-limiter-flexible's RateLimiterRedis (its default fixed window, 100
// points per 60 s) under the load `slidegate bench redis` puts on its own
// scripts: 100,000 keys cycled round-robin, 128 consumes in flight. Every
// key is consumed once before the timed phase (as `bench redis` pre-fills),
// then CONFIG RESETSTAT, SECONDS of load, and INFO commandstats: the
// server's µs per consume is every command's usec over the consumes.
// Usage: node rlf.js PORT SECONDS; prints one JSON object.
const { RateLimiterRedis } = require('rate-limiter-flexible');
const Redis = require('ioredis');

const [port, seconds] = [Number(process.argv[2]), Number(process.argv[3] || 5)];
const KEYS = 100000;
const IN_FLIGHT = 128;

async function main() {
  const client = new Redis({ host: '127.0.0.1', port, enableOfflineQueue: true, lazyConnect: false });
  const admin = new Redis({ host: '127.0.0.1', port });
  const limiter = new RateLimiterRedis({ storeClient: client, points: 100, duration: 60, keyPrefix: 'rlf' });
  // A denial rejects with the limiter's result; an error rejects with an Error.
  const consume = (key) => limiter.consume(key).then(() => 1, (res) => {
    if (res instanceof Error) throw res;
    return 0;
  });
  async function run(until, count) {
    let next = 0, done = 0, allowed = 0;
    const worker = async () => {
      while (Date.now() < until && (count === undefined || next < count)) {
        const key = `id${next++ % KEYS}`;
        allowed += await consume(key);
        done++;
      }
    };
    await Promise.all(Array.from({ length: IN_FLIGHT }, worker));
    return { done, allowed };
  }
  await run(Date.now() + 600000, KEYS);
  await admin.config('RESETSTAT');
  const started = Date.now();
  const { done, allowed } = await run(started + seconds * 1000);
  const elapsed = (Date.now() - started) / 1000;
  const info = await admin.info('commandstats');
  const commands = {};
  let usec = 0;
  for (const line of info.split('\n')) {
    const m = line.match(/^cmdstat_([^:]+):calls=(\d+),usec=(\d+),usec_per_call=([\d.]+)/);
    if (!m || m[1] === 'config' || m[1] === 'info') continue;
    commands[m[1]] = { calls: Number(m[2]), usec_per_call: Number(m[4]) };
    usec += Number(m[3]);
  }
  // Its package.json, read from the directory the module was loaded from.
  const path = require('path');
  const root = path.dirname(require.resolve('rate-limiter-flexible'));
  const version = JSON.parse(require('fs').readFileSync(path.join(root, 'package.json'))).version;
  console.log(JSON.stringify({
    version, consumes: done, allowed, per_sec: done / elapsed,
    server_us_per_consume: usec / done, commands,
  }));
  client.disconnect();
  admin.disconnect();
}

main().catch((e) => { console.error(e); process.exit(1); });
