//! The cluster name plane on etcd: names under a lease, so a dead team's
//! names expire; keep-alive at a third of the lease's TTL; lookups; and
//! waits for a name that watch from a revision and list again when etcd
//! compacted past it. A lease that expired while the team lived (etcd was
//! out of its reach for a TTL) is replaced and the team's names bound
//! again under the new one.
//!
//! It speaks etcd's v3 JSON gateway (`/v3/kv/*`, `/v3/lease/*`,
//! `/v3/watch`) over plain HTTP/1.1: a request per connection, a few
//! dozen lines below, no gRPC stack. A name is the key
//! `/ferry/names/<name>`, its value the endpoint id as text
//! (`node.team.slot#incarnation`), put with the team's lease; a
//! registration is a transaction that fails if the key exists
//! (`NameTaken`), an unregistration one that deletes it only if it is
//! under the team's lease.
//!
//! Given several client addresses (the members of one etcd cluster), a
//! request goes to the one that answered last, and on to the next while
//! one fails. So a request may be made twice: every one is idempotent
//! but the registration, whose retry finds its own binding (see
//! [`EtcdNames::register`]).

use crate::error::{Error, Result};
use crate::id::EndpointId;
use base64::Engine;
use parking_lot::Mutex;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PREFIX: &str = "/ferry/names/";
/// How long one request to etcd may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

fn unb64(v: &Value) -> Option<String> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(v.as_str()?).ok()?;
    String::from_utf8(bytes).ok()
}

fn io(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |e| Error::Io { context: what, source: e }
}

fn bad(what: String) -> Error {
    Error::Io { context: "etcd", source: std::io::Error::new(std::io::ErrorKind::InvalidData, what) }
}

/// Sends one POST of `body` to `path` and returns the response body as a
/// reader (`Connection: close`: the body ends with the connection; a
/// chunked body is read through [`Chunked`]).
fn post(addr: SocketAddr, path: &str, body: &Value, timeout: Option<Duration>) -> Result<Box<dyn BufRead>> {
    // Never zero: connect_timeout refuses it.
    let connect = timeout.map_or(REQUEST_TIMEOUT, |t| t.min(REQUEST_TIMEOUT)).max(Duration::from_millis(1));
    let mut sock = TcpStream::connect_timeout(&addr, connect).map_err(io("connect to etcd"))?;
    sock.set_read_timeout(timeout).map_err(io("etcd"))?;
    let body = body.to_string();
    let head = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    sock.write_all(head.as_bytes()).and_then(|()| sock.write_all(body.as_bytes())).map_err(io("write to etcd"))?;
    response(BufReader::new(sock), path)
}

/// Reads the status line and the headers of an HTTP/1.1 response (etcd's
/// bytes) to a request to `path` from `r`: an error unless the status is
/// 200; then the body as a reader (`Connection: close`: the body ends with
/// the stream; a chunked body is read through [`Chunked`]).
pub(crate) fn response<'a>(mut r: impl BufRead + 'a, path: &str) -> Result<Box<dyn BufRead + 'a>> {
    let mut line = String::new();
    r.read_line(&mut line).map_err(io("read from etcd"))?;
    if !line.starts_with("HTTP/1.1 200") {
        return Err(bad(format!("etcd answered {:?} to {path}", line.trim_end())));
    }
    let mut chunked = false;
    loop {
        line.clear();
        r.read_line(&mut line).map_err(io("read from etcd"))?;
        let h = line.trim_end().to_ascii_lowercase();
        if h.is_empty() {
            break;
        }
        chunked |= h == "transfer-encoding: chunked";
    }
    Ok(if chunked { Box::new(BufReader::new(Chunked { inner: r, left: 0, done: false })) } else { Box::new(r) })
}

/// A unary request: the whole response as JSON.
fn call(addr: SocketAddr, path: &str, body: &Value) -> Result<Value> {
    call_within(addr, path, body, REQUEST_TIMEOUT)
}

/// A unary request whose connect and each read take at most `timeout`.
fn call_within(addr: SocketAddr, path: &str, body: &Value, timeout: Duration) -> Result<Value> {
    let r = post(addr, path, body, Some(timeout))?;
    serde_json::from_reader(r).map_err(|e| bad(format!("etcd's answer to {path}: {e}")))
}

/// The client addresses of one etcd cluster: a request goes to the one
/// that answered last, and on to the next while one fails.
struct Members {
    addrs: Vec<SocketAddr>,
    last: AtomicUsize,
}

impl Members {
    /// `f` at the members in turn, from the last that answered, until one
    /// succeeds; else the last member's error.
    fn any<T>(&self, f: impl Fn(SocketAddr) -> Result<T>) -> Result<T> {
        let first = self.last.load(Ordering::Relaxed);
        let mut failed = None;
        for i in 0..self.addrs.len() {
            let at = (first + i) % self.addrs.len();
            match f(self.addrs[at]) {
                Ok(v) => {
                    self.last.store(at, Ordering::Relaxed);
                    return Ok(v);
                }
                Err(e) => {
                    tracing::debug!(addr = %self.addrs[at], error = %e, "etcd member failed a request");
                    failed = Some(e);
                }
            }
        }
        Err(failed.expect("at least one member"))
    }

    fn call(&self, path: &str, body: &Value) -> Result<Value> {
        self.any(|addr| call(addr, path, body))
    }

    fn call_within(&self, path: &str, body: &Value, timeout: Duration) -> Result<Value> {
        self.any(|addr| call_within(addr, path, body, timeout))
    }

    fn post(&self, path: &str, body: &Value, timeout: Option<Duration>) -> Result<Box<dyn BufRead>> {
        self.any(|addr| post(addr, path, body, timeout))
    }
}

/// An HTTP/1.1 chunked body.
struct Chunked<R> {
    inner: R,
    left: usize,
    done: bool,
}

impl<R: BufRead> Read for Chunked<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.done {
            return Ok(0);
        }
        if self.left == 0 {
            let mut line = String::new();
            self.inner.read_line(&mut line)?;
            if line.trim().is_empty() {
                // The CRLF after the previous chunk.
                line.clear();
                self.inner.read_line(&mut line)?;
            }
            let size = line.trim().split(';').next().unwrap_or("");
            self.left = usize::from_str_radix(size, 16)
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "bad chunk size"))?;
            if self.left == 0 {
                self.done = true;
                return Ok(0);
            }
        }
        let want = buf.len().min(self.left);
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            self.done = true;
        }
        self.left -= n;
        Ok(n)
    }
}

/// A team's view of the etcd name plane: its lease, kept alive while it
/// lives, and the names it bound under it.
pub struct EtcdNames {
    members: Arc<Members>,
    lease: Arc<Mutex<Lease>>,
    stop: Arc<AtomicBool>,
    keepalive: Mutex<Option<std::thread::JoinHandle<()>>>,
}

/// The team's current lease and what it bound under it. A lease that
/// expired (the team could not reach etcd for a TTL: a cut link, a
/// stalled process) is replaced and the names bound again, so a team that
/// comes back is found again within a keep-alive period.
struct Lease {
    id: String,
    ttl: Duration,
    names: HashMap<String, EndpointId>,
}

impl Lease {
    /// After etcd said the lease is gone: takes a new one and binds the
    /// names again under it. A name another team took meanwhile stays
    /// theirs (etcd decides who holds a name) and is dropped here, with
    /// an error in the log.
    fn renew(&mut self, members: &Members) -> Result<()> {
        let grant = members.call("/v3/lease/grant", &json!({ "TTL": self.ttl.as_secs().max(1) }))?;
        self.id = lease_id(&grant)?;
        let names = std::mem::take(&mut self.names);
        for (name, ep) in names {
            match register(members, &self.id, &name, ep) {
                Ok(()) => {
                    self.names.insert(name, ep);
                }
                Err(e @ Error::NameTaken { .. }) => {
                    tracing::error!(error = %e, "a name of this team was taken while its etcd lease was lost")
                }
                // Bound again at the next renewal... which needs the lease
                // lost: keep the name and give up this lease instead.
                Err(e) => {
                    self.names.insert(name, ep);
                    let _ = members.call("/v3/lease/revoke", &json!({ "ID": self.id }));
                    return Err(e);
                }
            }
        }
        tracing::warn!(
            lease = self.id,
            names = self.names.len(),
            "etcd lease renewed; this team's names are bound again"
        );
        Ok(())
    }
}

/// Binds `name` to `ep` under `lease`; `NameTaken` if it is bound.
fn register(members: &Members, lease: &str, name: &str, ep: EndpointId) -> Result<()> {
    let key = b64(&format!("{PREFIX}{name}"));
    let txn = json!({
        "compare": [{ "key": key, "result": "EQUAL", "target": "CREATE", "create_revision": "0" }],
        "success": [{ "request_put": { "key": key, "value": b64(&ep.to_string()), "lease": lease } }],
        "failure": [{ "request_range": { "key": key } }],
    });
    let r = members.call("/v3/kv/txn", &txn)?;
    let Some(owner) = txn_owner(&r) else { return Ok(()) };
    // Our own binding: a member did it but its answer was lost, and
    // the request went on to the next one. (An endpoint id is never
    // reused, so no other registration can have bound it.)
    if owner == ep {
        return Ok(());
    }
    Err(Error::NameTaken { name: name.to_string(), owner })
}

impl EtcdNames {
    /// Takes a lease of `ttl` from the etcd cluster whose members' client
    /// addresses are `addrs` (one will do) and keeps it alive (every
    /// `ttl / 3`) until [`revoke`](EtcdNames::revoke)d or dropped, when the
    /// names registered under it go. A team that dies stops the
    /// keep-alive: its names expire after `ttl`. A lease that expires while
    /// the team lives (etcd out of reach for a TTL) is replaced by a new
    /// one, its names bound again, at the first keep-alive that gets
    /// through.
    pub fn connect(addrs: &[SocketAddr], ttl: Duration) -> Result<EtcdNames> {
        if addrs.is_empty() {
            return Err(Error::InvalidArgument("no etcd address".into()));
        }
        let members = Arc::new(Members { addrs: addrs.to_vec(), last: AtomicUsize::new(0) });
        let grant = members.call("/v3/lease/grant", &json!({ "TTL": ttl.as_secs().max(1) }))?;
        let lease = Arc::new(Mutex::new(Lease { id: lease_id(&grant)?, ttl, names: HashMap::new() }));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, m, l) = (stop.clone(), members.clone(), lease.clone());
        let every = (ttl / 3).max(Duration::from_millis(100));
        // A keep-alive that takes longer than its period is late anyway;
        // one stuck on a cut link must not delay the next once it heals.
        let patience = every.min(REQUEST_TIMEOUT);
        let keepalive = std::thread::Builder::new()
            .name("ferry-etcd-lease".into())
            .spawn(move || {
                let mut next = Instant::now() + every;
                while !s.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20).min(next.saturating_duration_since(Instant::now())));
                    if Instant::now() >= next {
                        let id = l.lock().id.clone();
                        match m.call_within("/v3/lease/keepalive", &json!({ "ID": id }), patience) {
                            // etcd answers a lease it no longer has without a TTL.
                            Ok(r) if lease_lost(&r) => {
                                tracing::error!(lease = id, "etcd lease expired (keep-alives did not reach etcd in time): this team's names went from etcd; renewing");
                                let mut lease = l.lock();
                                // Unless a revoke came meanwhile (the team leaves).
                                if lease.id == id && !s.load(Ordering::Relaxed) {
                                    if let Err(e) = lease.renew(&m) {
                                        tracing::warn!(error = %e, "etcd lease not renewed; retrying");
                                    }
                                }
                            }
                            Ok(_) => {}
                            Err(e) => tracing::warn!(error = %e, "etcd lease keep-alive failed; retrying"),
                        }
                        next = Instant::now() + every;
                    }
                }
            })
            .map_err(io("spawn the etcd keep-alive thread"))?;
        Ok(EtcdNames { members, lease, stop, keepalive: Mutex::new(Some(keepalive)) })
    }

    /// The members' addresses, for logs.
    pub fn describe(&self) -> String {
        let addrs: Vec<String> = self.members.addrs.iter().map(|a| a.to_string()).collect();
        addrs.join(",")
    }

    /// Binds `name` to `ep` under this team's lease; `NameTaken` if it is bound.
    pub fn register(&self, name: &str, ep: EndpointId) -> Result<()> {
        let mut lease = self.lease.lock();
        register(&self.members, &lease.id, name, ep)?;
        lease.names.insert(name.to_string(), ep);
        Ok(())
    }

    /// Removes `name` if it is bound under this team's lease.
    pub fn unregister(&self, name: &str) -> Result<()> {
        let mut lease = self.lease.lock();
        lease.names.remove(name);
        let key = b64(&format!("{PREFIX}{name}"));
        // Only ours: once our lease expired, someone else may hold the name.
        let txn = json!({
            "compare": [{ "key": key, "result": "EQUAL", "target": "LEASE", "lease": lease.id }],
            "success": [{ "request_delete_range": { "key": key } }],
        });
        self.members.call("/v3/kv/txn", &txn).map(drop)
    }

    /// The id of the team's current lease (tests revoke it behind its back).
    #[cfg(any(test, feature = "testing"))]
    pub fn lease_id(&self) -> String {
        self.lease.lock().id.clone()
    }

    /// The endpoint bound to `name`, and the revision a watch for it starts from.
    fn get(&self, name: &str) -> Result<(Option<EndpointId>, i64)> {
        let r = self.members.call("/v3/kv/range", &json!({ "key": b64(&format!("{PREFIX}{name}")) }))?;
        Ok(range_answer(&r))
    }

    /// The endpoint bound to `name`, or `NameNotFound`.
    pub fn lookup(&self, name: &str) -> Result<EndpointId> {
        self.get(name)?.0.ok_or_else(|| Error::NameNotFound(name.to_string()))
    }

    /// Every name that starts with `prefix`, with its endpoint (one request).
    pub fn list(&self, prefix: &str) -> Result<Vec<(String, EndpointId)>> {
        let from = format!("{PREFIX}{prefix}");
        // The range's end: the prefix with its last byte raised (the keys are text).
        let mut end = from.clone().into_bytes();
        *end.last_mut().expect("a non-empty prefix") += 1;
        let r = self.members.call(
            "/v3/kv/range",
            &json!({ "key": b64(&from), "range_end": base64::engine::general_purpose::STANDARD.encode(&end) }),
        )?;
        Ok((r["kvs"].as_array().into_iter().flatten())
            .filter_map(|kv| {
                let name = unb64(&kv["key"])?.strip_prefix(PREFIX)?.to_string();
                Some((name, unb64(&kv["value"])?.parse().ok()?))
            })
            .collect())
    }

    /// Waits, at most `limit`, for `name` to be bound: looks, then watches
    /// the key from the revision after the look.
    pub fn wait_for(&self, name: &str, limit: Duration) -> Result<EndpointId> {
        let until = Instant::now() + limit;
        let (ep, next) = self.get(name)?;
        match ep {
            Some(ep) => Ok(ep),
            None => self.wait_from(name, next, until),
        }
    }

    /// Watches `name` from `rev` until it is bound or `until`. If etcd
    /// compacted past `rev` (the watch is cancelled with the compact
    /// revision), the key is listed again and watched from there on. A
    /// watch cut short (its member went away) resumes, from the next
    /// member if need be.
    pub fn wait_from(&self, name: &str, mut rev: i64, until: Instant) -> Result<EndpointId> {
        let key = b64(&format!("{PREFIX}{name}"));
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::NameNotFound(name.to_string()));
            }
            let req = json!({ "create_request": { "key": key, "start_revision": rev.to_string() } });
            let stream = self.members.post("/v3/watch", &req, Some(left))?;
            // Until the deadline cuts the stream (or etcd goes away).
            for msg in watch_messages(stream) {
                match msg {
                    Watched::Canceled(compacted) => {
                        // Compacted past `rev`: list again, watch from what the list saw.
                        let (ep, next) = self.get(name)?;
                        if let Some(ep) = ep {
                            return Ok(ep);
                        }
                        tracing::debug!(name, rev, %compacted, "etcd watch compacted; listed again");
                        rev = next;
                        break;
                    }
                    Watched::Bound(ep) => return Ok(ep),
                    Watched::Nothing => {}
                }
            }
        }
    }

    /// The team leaves: stops the keep-alive and revokes the lease, so its
    /// names go now rather than at the end of the TTL. Once only.
    pub fn revoke(&self) {
        if self.stop.swap(true, Ordering::Relaxed) {
            return;
        }
        if let Some(t) = self.keepalive.lock().take() {
            let _ = t.join();
        }
        let id = self.lease.lock().id.clone();
        if let Err(e) = self.members.call("/v3/lease/revoke", &json!({ "ID": id })) {
            tracing::debug!(error = %e, "etcd lease not revoked; its names expire with it");
        }
    }
}

/// The lease id in an answer to a lease grant (etcd's bytes).
pub(crate) fn lease_id(grant: &Value) -> Result<String> {
    Ok(grant["ID"].as_str().ok_or_else(|| bad(format!("no lease in {grant}")))?.to_string())
}

/// Whether an answer to a keep-alive says the lease is gone (etcd answers
/// a lease it no longer has without a TTL).
pub(crate) fn lease_lost(r: &Value) -> bool {
    r["result"]["TTL"].is_null()
}

/// What a registration's transaction answered (etcd's bytes): `None` if it
/// bound the name, else the endpoint it found bound (`NONE` if unreadable).
pub(crate) fn txn_owner(r: &Value) -> Option<EndpointId> {
    if r["succeeded"].as_bool() == Some(true) {
        return None;
    }
    let owner = &r["responses"][0]["response_range"]["kvs"][0]["value"];
    Some(unb64(owner).and_then(|s| s.parse().ok()).unwrap_or(EndpointId::NONE))
}

/// A range answer (etcd's bytes): the endpoint bound to the key, if any,
/// and the revision a watch for it starts from (the one after the answer's;
/// an answer at the last revision an i64 holds, which only a broken or
/// hostile member gives, watches from there rather than overflow).
pub(crate) fn range_answer(r: &Value) -> (Option<EndpointId>, i64) {
    let rev: i64 = r["header"]["revision"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0);
    let ep = unb64(&r["kvs"][0]["value"]).and_then(|s| s.parse().ok());
    (ep, rev.saturating_add(1))
}

/// One message of a watch stream, as a wait reads it.
pub(crate) enum Watched {
    /// Cancelled because etcd compacted past the revision (the compact revision, for the log).
    Canceled(Value),
    /// The key was put, bound to this endpoint.
    Bound(EndpointId),
    /// Nothing for a wait (progress, a deletion, a value that is no endpoint).
    Nothing,
}

/// What a watch message (etcd's bytes) says.
pub(crate) fn watch_message(msg: &Value) -> Watched {
    let r = &msg["result"];
    if r["canceled"].as_bool() == Some(true) {
        return Watched::Canceled(r["compact_revision"].clone());
    }
    for ev in r["events"].as_array().into_iter().flatten() {
        if ev["type"].as_str() != Some("DELETE") {
            if let Some(ep) = unb64(&ev["kv"]["value"]).and_then(|s| s.parse().ok()) {
                return Watched::Bound(ep);
            }
        }
    }
    Watched::Nothing
}

/// The messages of a watch stream (a body of concatenated JSON values),
/// until it ends or breaks.
pub(crate) fn watch_messages<'a>(stream: impl Read + 'a) -> impl Iterator<Item = Watched> + 'a {
    serde_json::Deserializer::from_reader(stream).into_iter::<Value>().map_while(|m| m.ok()).map(|m| watch_message(&m))
}

/// Compacts the etcd at `addr` up to its current revision (for tests:
/// what a cluster's operator or etcd's auto-compaction does).
#[cfg(any(test, feature = "testing"))]
pub fn compact(addr: SocketAddr) -> Result<i64> {
    let r = call(addr, "/v3/kv/range", &json!({ "key": b64("/") }))?;
    let rev: i64 = r["header"]["revision"].as_str().and_then(|s| s.parse().ok()).ok_or_else(|| bad(format!("{r}")))?;
    call(addr, "/v3/kv/compaction", &json!({ "revision": rev.to_string() }))?;
    Ok(rev)
}

/// Revokes lease `id` at the etcd at `addr` (for tests: what etcd does to a
/// lease whose keep-alives stopped reaching it).
#[cfg(any(test, feature = "testing"))]
pub fn revoke_lease(addr: SocketAddr, id: &str) -> Result<()> {
    call(addr, "/v3/lease/revoke", &json!({ "ID": id })).map(drop)
}

impl Drop for EtcdNames {
    fn drop(&mut self) {
        self.revoke();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range answer at the last revision an i64 holds: the watch starts
    /// there (the revision after it cannot be), with no overflow. (Found by
    /// review of the `etcd` fuzz harness's code; its input is
    /// `fuzz/regressions/etcd/range-at-the-last-revision`.)
    #[test]
    fn a_range_answer_at_the_last_revision_does_not_overflow() {
        let r = json!({ "header": { "revision": i64::MAX.to_string() } });
        assert_eq!(range_answer(&r), (None, i64::MAX));
        let r = json!({ "header": { "revision": "41" }, "kvs": [{ "value": b64("1.2.3#0000000a") }] });
        assert_eq!(range_answer(&r), (Some("1.2.3#0000000a".parse().unwrap()), 42));
    }
}
