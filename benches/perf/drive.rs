//! The one client that drives every served side, and what it reads from
//! `/proc` around each measured window.
//!
//! A level `C:K` is C calls in flight over K connections: worker `i` of C
//! sends back to back on connection `i mod K` until the window closes. Over
//! gRPC the workers of a connection share it as h2 streams; over HTTP/1.1
//! (the peer, keep-alive, no pipelining) they take turns on it, so a call's
//! latency includes its wait for the connection, as a stream's includes its
//! wait in the server. Every answer is checked; a wrong one, an error or a
//! call longer than [`CALL_TIMEOUT`] stops the suite.
//!
//! CPU time is utime + stime of a whole process (every thread, live or
//! exited) from `/proc/<pid>/stat`, in clock ticks (`AT_CLKTCK` from
//! `/proc/self/auxv`, 100 per second on Linux), read just before the
//! workers start and just after the last one ends: the server's for the
//! side, and this process's own for the client.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::Mutex;
use tonic::transport::{Channel, Endpoint};

use toolgate::grpc::pb;

use super::BoxError;
use super::common::{Summary, median, summarize};
use super::peer::{self, Http1};

/// The longest one call may take before the suite calls it a timeout.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// `C:K`: C calls in flight over K connections.
#[derive(Debug, Clone, Copy)]
pub struct Level {
    pub calls: usize,
    pub connections: usize,
}

impl Level {
    pub const fn new(calls: usize, connections: usize) -> Self {
        Self { calls, connections }
    }

    pub fn name(self) -> String {
        format!("{}:{}", self.calls, self.connections)
    }
}

/// What a side's answers must be.
pub enum Expect {
    /// Exactly these bytes' message (the echo floor).
    Exactly(Box<pb::AuthorizeResponse>),
    /// An ALLOW (toolgate).
    Allow,
}

/// How the client reaches one side.
pub enum Transport {
    /// `Authorize` over gRPC on h2 channels.
    Grpc {
        channels: Vec<Channel>,
        request: Box<pb::AuthorizeRequest>,
        expect: Arc<Expect>,
    },
    /// `POST path` with a JSON body over HTTP/1.1 keep-alive connections;
    /// the answer must allow with exactly the determining policies `reasons`.
    Http {
        connections: Vec<Arc<Mutex<Http1>>>,
        path: &'static str,
        body: Bytes,
        reasons: Arc<Vec<String>>,
    },
}

/// One served side: its server process and how to call it.
pub struct Side {
    pub name: &'static str,
    pub pid: u32,
    pub transport: Transport,
}

/// `n` h2 channels to `addr`.
pub async fn grpc_channels(addr: std::net::SocketAddr, n: usize) -> Result<Vec<Channel>, BoxError> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(
            Endpoint::from_shared(format!("http://{addr}"))?
                .connect_timeout(Duration::from_secs(5))
                .tcp_nodelay(true)
                .connect()
                .await?,
        );
    }
    Ok(out)
}

/// `n` HTTP/1.1 keep-alive connections to `addr`.
pub async fn http_connections(
    addr: std::net::SocketAddr,
    n: usize,
) -> Result<Vec<Arc<Mutex<Http1>>>, BoxError> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(Arc::new(Mutex::new(Http1::connect(addr).await?)));
    }
    Ok(out)
}

/// A worker's gRPC client and what it sends.
struct GrpcCaller {
    client: pb::authorization_service_client::AuthorizationServiceClient<Channel>,
    request: pb::AuthorizeRequest,
    expect: Arc<Expect>,
}

/// One worker's way of making a call.
enum Caller {
    Grpc(Box<GrpcCaller>),
    Http {
        connection: Arc<Mutex<Http1>>,
        path: &'static str,
        body: Bytes,
        reasons: Arc<Vec<String>>,
    },
}

impl Caller {
    fn new(side: &Side, worker: usize, connections: usize) -> Result<Self, BoxError> {
        let at = worker % connections.max(1);
        Ok(match &side.transport {
            Transport::Grpc {
                channels,
                request,
                expect,
            } => Self::Grpc(Box::new(GrpcCaller {
                client: pb::authorization_service_client::AuthorizationServiceClient::new(
                    channels
                        .get(at)
                        .cloned()
                        .ok_or("fewer channels than the level")?,
                ),
                request: request.as_ref().clone(),
                expect: Arc::clone(expect),
            })),
            Transport::Http {
                connections: all,
                path,
                body,
                reasons,
            } => Self::Http {
                connection: Arc::clone(all.get(at).ok_or("fewer connections than the level")?),
                path,
                body: body.clone(),
                reasons: Arc::clone(reasons),
            },
        })
    }

    /// One call, its answer checked.
    async fn call(&mut self) -> Result<(), BoxError> {
        match self {
            Self::Grpc(grpc) => {
                let GrpcCaller {
                    client,
                    request,
                    expect,
                } = grpc.as_mut();
                let answer = client.authorize(request.clone()).await?.into_inner();
                let right = match expect.as_ref() {
                    Expect::Exactly(bytes) => answer == **bytes,
                    Expect::Allow => answer.decision == i32::from(pb::Decision::Allow),
                };
                if !right {
                    return Err(format!("a wrong answer: {answer:?}").into());
                }
                Ok(())
            }
            Self::Http {
                connection,
                path,
                body,
                reasons,
            } => {
                let (status, answer) = connection
                    .lock()
                    .await
                    .send(http::Method::POST, path, Some(body.clone()))
                    .await?;
                peer::check_answer(status, &answer, reasons.as_slice())
            }
        }
    }
}

/// One side at one level for one window.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    pub latency: Summary,
    /// The server's CPU per answered request, µs.
    pub server_cpu_us: f64,
    /// This client's CPU per answered request, µs.
    pub client_cpu_us: f64,
    pub requests: usize,
}

/// The medians over rounds of each figure.
pub fn medians(samples: &[Sample]) -> Sample {
    let pick = |f: fn(&Sample) -> f64| median(samples.iter().map(f).collect());
    Sample {
        latency: super::common::medians(&samples.iter().map(|s| s.latency).collect::<Vec<_>>()),
        server_cpu_us: pick(|s| s.server_cpu_us),
        client_cpu_us: pick(|s| s.client_cpu_us),
        requests: samples.iter().map(|s| s.requests).sum(),
    }
}

/// Runs `level` against `side` for `seconds`.
///
/// # Errors
/// A wrong answer, a failed call, a call over [`CALL_TIMEOUT`], or `/proc`
/// unreadable.
pub async fn measure(side: &Side, level: Level, seconds: f64) -> Result<Sample, BoxError> {
    if let Transport::Http { connections, .. } = &side.transport {
        for c in connections {
            c.lock().await.refresh().await?;
        }
    }
    let mut callers = Vec::with_capacity(level.calls);
    for i in 0..level.calls {
        callers.push(Caller::new(side, i, level.connections)?);
    }
    let (server0, client0) = (cpu_time(side.pid)?, cpu_time(std::process::id())?);
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(seconds);
    let workers: Vec<_> = callers
        .into_iter()
        .map(|mut caller| {
            tokio::spawn(async move {
                let mut samples = Vec::with_capacity(4096);
                while Instant::now() < until {
                    let t = Instant::now();
                    tokio::time::timeout(CALL_TIMEOUT, caller.call())
                        .await
                        .map_err(|_| format!("a call took over {CALL_TIMEOUT:?}"))??;
                    samples.push(t.elapsed());
                }
                Ok::<_, BoxError>(samples)
            })
        })
        .collect();
    let mut all = Vec::new();
    for w in workers {
        all.extend(
            w.await?
                .map_err(|e| format!("{} at {}: {e}", side.name, level.name()))?,
        );
    }
    let elapsed = start.elapsed();
    let (server1, client1) = (cpu_time(side.pid)?, cpu_time(std::process::id())?);
    let requests = all.len();
    #[allow(clippy::cast_precision_loss, reason = "a count of requests")]
    let per = |d: Duration| d.as_secs_f64() * 1e6 / (requests.max(1) as f64);
    Ok(Sample {
        latency: summarize(all, elapsed),
        server_cpu_us: per(server1.saturating_sub(server0)),
        client_cpu_us: per(client1.saturating_sub(client0)),
        requests,
    })
}

/// One window of the overload comparison: answered calls and refusals.
#[derive(Debug, Default)]
pub struct Overloaded {
    pub answered: Summary,
    pub answered_count: usize,
    /// Refusals by gRPC status code name.
    pub refusals: BTreeMap<String, u64>,
    /// The p99 of refused calls, µs (0 without refusals).
    pub refusal_p99_us: f64,
    /// Calls the client gave up on after [`CALL_TIMEOUT`], and
    /// `DEADLINE_EXCEEDED` answers.
    pub timeouts: u64,
}

/// `level` against toolgate for `seconds`, where refusals are expected: a
/// refused worker waits `backoff` before its next call, as a retrying
/// client backs off. An answer must still be ALLOW.
///
/// # Errors
/// A wrong answer.
pub async fn overload(
    channels: &[Channel],
    request: &pb::AuthorizeRequest,
    level: Level,
    seconds: f64,
    backoff: Duration,
) -> Result<Overloaded, BoxError> {
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(seconds);
    let mut workers = Vec::with_capacity(level.calls);
    for i in 0..level.calls {
        let channel = channels
            .get(i % level.connections.max(1))
            .cloned()
            .ok_or("fewer channels than the level")?;
        let mut client = pb::authorization_service_client::AuthorizationServiceClient::new(channel);
        let request = request.clone();
        workers.push(tokio::spawn(async move {
            let (mut answered, mut refused) = (Vec::new(), Vec::new());
            let mut codes: BTreeMap<String, u64> = BTreeMap::new();
            let mut timeouts = 0;
            while Instant::now() < until {
                let t = Instant::now();
                match tokio::time::timeout(CALL_TIMEOUT, client.authorize(request.clone())).await {
                    Err(_) => timeouts += 1,
                    Ok(Ok(answer)) => {
                        answered.push(t.elapsed());
                        let answer = answer.into_inner();
                        if answer.decision != i32::from(pb::Decision::Allow) {
                            return Err::<_, BoxError>(
                                format!("a wrong answer: {answer:?}").into(),
                            );
                        }
                    }
                    Ok(Err(status)) => {
                        refused.push(t.elapsed());
                        if status.code() == tonic::Code::DeadlineExceeded {
                            timeouts += 1;
                        }
                        *codes.entry(format!("{:?}", status.code())).or_default() += 1;
                        tokio::time::sleep(backoff).await;
                    }
                }
            }
            Ok((answered, refused, codes, timeouts))
        }));
    }
    let (mut answered, mut refused) = (Vec::new(), Vec::new());
    let mut out = Overloaded::default();
    for w in workers {
        let (a, r, codes, timeouts) = w.await??;
        answered.extend(a);
        refused.extend(r);
        for (code, n) in codes {
            *out.refusals.entry(code).or_default() += n;
        }
        out.timeouts += timeouts;
    }
    let elapsed = start.elapsed();
    out.answered_count = answered.len();
    out.answered = summarize(answered, elapsed);
    out.refusal_p99_us = if refused.is_empty() {
        0.0
    } else {
        summarize(refused, elapsed).p99_us
    };
    Ok(out)
}

// ---------------------------------------------------------------- /proc

/// The clock ticks per second of `/proc`'s times (`AT_CLKTCK`).
///
/// # Errors
/// When `/proc/self/auxv` is unreadable or has no `AT_CLKTCK`.
pub fn clock_ticks_per_second() -> Result<u64, BoxError> {
    const AT_CLKTCK: usize = 17;
    const WORD: usize = std::mem::size_of::<usize>();
    let auxv = std::fs::read("/proc/self/auxv")?;
    for pair in auxv.chunks_exact(2 * WORD) {
        let (key, value) = pair.split_at(WORD);
        let word =
            |b: &[u8]| -> Result<usize, BoxError> { Ok(usize::from_ne_bytes(b.try_into()?)) };
        if word(key)? == AT_CLKTCK {
            return Ok(u64::try_from(word(value)?)?);
        }
    }
    Err("no AT_CLKTCK in /proc/self/auxv".into())
}

/// utime + stime of process `pid`, all its threads.
///
/// # Errors
/// When `/proc/<pid>/stat` is unreadable (the process is gone) or malformed.
pub fn cpu_time(pid: u32) -> Result<Duration, BoxError> {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let ticks = *TICKS.get_or_init(|| clock_ticks_per_second().unwrap_or(0));
    if ticks == 0 {
        return Err("the clock ticks per second are unknown".into());
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
    // The command name may hold spaces and parentheses: fields count from
    // the last `)`. After it: state (3), …, utime (14), stime (15).
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or("a malformed /proc/<pid>/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Result<u64, BoxError> {
        Ok(fields
            .get(n - 3)
            .ok_or("a short /proc/<pid>/stat")?
            .parse()?)
    };
    let total = field(14)? + field(15)?;
    Ok(Duration::from_secs_f64(total as f64 / ticks as f64))
}

/// Resident memory now and at its peak, kB.
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    pub rss_kb: u64,
    pub hwm_kb: u64,
    /// Of `rss_kb`: anonymous memory (the heap, stacks), private to the
    /// process.
    pub anon_kb: u64,
    /// Of `rss_kb`: pages of mapped files, mostly the sidecar's own
    /// executable, clean and shared with the page cache.
    pub file_kb: u64,
}

/// `VmRSS`, `VmHWM`, `RssAnon` and `RssFile` of process `pid`.
///
/// # Errors
/// When `/proc/<pid>/status` is unreadable.
pub fn memory_of(pid: u32) -> Result<Memory, BoxError> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    Ok(Memory {
        rss_kb: field("VmRSS:"),
        hwm_kb: field("VmHWM:"),
        anon_kb: field("RssAnon:"),
        file_kb: field("RssFile:"),
    })
}
