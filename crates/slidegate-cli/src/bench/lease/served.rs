//! `bench lease --serve`: the three instances as three `slidegate serve`
//! processes (this binary), each asked `POST /v1/check` over its own
//! HTTP/1.1 keep-alive connections, so the latency is a decision's through
//! `serve`: the client, the HTTP round trip and the server's limiter.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

use super::{LeaseArgs, Run, INSTANCES};

/// Connections to each instance: requests in flight at once, per instance.
const CONNECTIONS: usize = 16;
/// The secret every instance hashes keys with (they share one store).
const SECRET_ENV: &str = "SLIDEGATE_BENCH_LEASE_SECRET";

/// Three `serve` children, killed on drop.
pub(super) struct Served {
    children: Vec<Child>,
    admins: Vec<SocketAddr>,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Served {
    /// Starts the instances on `args`' store, keys under `prefix`, leasing
    /// when `lease` is the `[store] lease` line.
    pub(super) fn start(
        args: &LeaseArgs,
        lease: &str,
        prefix: &str,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        let store = match &args.redis_url {
            Some(url) => format!("url = {url:?}"),
            None => format!("cluster = {:?}", args.redis_cluster),
        };
        let config = format!(
            "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:9\"\n\
             [identity]\nip_hash_secret_env = \"{SECRET_ENV}\"\n\
             [store]\n{store}\nprefix = {prefix:?}\nengine = \"{engine}\"\ntimeout_ms = 1000\n{lease}\
             [[rules]]\nname = \"api\"\npath = \"/api/*\"\nlimits = [{{ limit = {}, window = \"1m\" }}]\n",
            args.limit,
            engine = args.engine.name(),
        );
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("slidegate.toml");
        std::fs::write(&path, config)?;
        let mut served = Served { children: Vec::new(), admins: Vec::new(), _dir: dir };
        for _ in 0..INSTANCES {
            let mut child = Command::new(std::env::current_exe()?)
                .args(["serve", "--config"])
                .arg(&path)
                .env(SECRET_ENV, "bench-lease")
                .env("SLIDEGATE_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()?;
            let stderr = child.stderr.take().ok_or("no stderr of the serve child")?;
            served.children.push(child);
            let (tx, rx) = mpsc::channel();
            std::thread::spawn(move || {
                let mut said = String::new();
                for line in BufReader::new(stderr).lines() {
                    let Ok(line) = line else { break };
                    if let Some(addr) = line.strip_prefix("slidegate: admin endpoints on ") {
                        let _ = tx.send(addr.parse::<SocketAddr>().map_err(|e| format!("{line}: {e}")));
                    }
                    said.push_str(&line);
                    said.push('\n');
                }
                // Closed before announcing: say what it said.
                let _ = tx.send(Err(said));
            });
            match rx.recv_timeout(Duration::from_secs(30)) {
                Ok(Ok(addr)) => served.admins.push(addr),
                Ok(Err(said)) => return Err(format!("a serve instance did not start:\n{said}").into()),
                Err(_) => {
                    return Err("a serve instance did not announce its admin address within 30 s".into())
                }
            }
        }
        Ok(served)
    }

    /// Paces `keys` (dealt round-robin over the instances and the keys) at
    /// `rate` a second for `args.seconds`, each a `POST /v1/check` of cost 1.
    pub(super) async fn load(
        &self,
        args: &LeaseArgs,
        keys: &[String],
        rate: f64,
        hot: bool,
    ) -> Result<Run, Box<dyn std::error::Error>> {
        let mut pools = Vec::with_capacity(self.admins.len());
        for &addr in &self.admins {
            let (give, take) = tokio::sync::mpsc::unbounded_channel();
            for _ in 0..CONNECTIONS {
                let stream = tokio::net::TcpStream::connect(addr).await?;
                stream.set_nodelay(true)?;
                let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
                tokio::spawn(conn);
                let _ = give.send(sender);
            }
            pools.push((give, Arc::new(tokio::sync::Mutex::new(take))));
        }
        let latency = Arc::new(Mutex::new(Histogram::<u64>::new(3)?));
        let windows = Arc::new(Mutex::new(std::collections::HashMap::<u64, u64>::new()));
        let mut tasks = tokio::task::JoinSet::new();
        let start = Instant::now();
        let total = (rate * args.seconds) as u64;
        for n in 0..total {
            super::paced(start, rate, n).await;
            let (give, take) = pools[n as usize % pools.len()].clone();
            let body = format!("{{\"rule\":\"api\",\"key\":{:?},\"cost\":1}}", keys[n as usize % keys.len()]);
            let (latency, windows) = (Arc::clone(&latency), Arc::clone(&windows));
            tasks.spawn(async move {
                let asked = Instant::now();
                let mut sender = take.lock().await.recv().await.ok_or("no connection left")?;
                let allowed = check(&mut sender, body).await;
                let _ = give.send(sender);
                let allowed = allowed?;
                let _ = latency.lock().map(|mut h| h.record(asked.elapsed().as_micros() as u64));
                if allowed && hot {
                    let minute =
                        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs() / 60;
                    *windows.lock().map_err(|_| "poisoned")?.entry(minute).or_default() += 1;
                }
                Ok::<bool, Box<dyn std::error::Error + Send + Sync>>(allowed)
            });
        }
        let mut run = Run::default();
        while let Some(done) = tasks.join_next().await {
            run.requests += 1;
            if done?.map_err(|e| e.to_string())? {
                run.allowed += 1;
            }
        }
        run.rate = run.requests as f64 / start.elapsed().as_secs_f64();
        run.p99_us = latency.lock().map_err(|_| "poisoned")?.value_at_quantile(0.99);
        run.max_per_window = windows.lock().map_err(|_| "poisoned")?.values().copied().max().unwrap_or(0);
        Ok(run)
    }
}

/// One `POST /v1/check`: whether it was allowed.
async fn check(
    sender: &mut SendRequest<Full<Bytes>>,
    body: String,
) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
    sender.ready().await?;
    let request = http::Request::post("/v1/check")
        .header(http::header::HOST, "slidegate")
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)))?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    if !status.is_success() && status != http::StatusCode::TOO_MANY_REQUESTS {
        return Err(format!("/v1/check answered {status}: {}", String::from_utf8_lossy(&body)).into());
    }
    Ok(body.windows(14).any(|w| w == b"\"allowed\":true"))
}
