//! Internals that ferry's own integration tests, transport conformance
//! suite, benchmarks and fuzz targets ([`fuzz`]) reach, behind the
//! `testing` cargo feature (and in the crate's unit tests). Not an API: it
//! follows the internals as they change.
//!
//! Everything here is safe: the transport pairs own the memory they build
//! their rings on, and check the sizes they are given.

use crate::error::{Error, Result};
use crate::id::TeamId;
use crate::transport::shm::{self, Accepted, BindConfig};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub mod fuzz;

/// A loopback address free now, whose port no other caller in this
/// process was given. A cluster's teams listen on their node's port with
/// `SO_REUSEPORT`: two tests running at once that were handed the same
/// port (freed by the first before its team bound it) would share it, and
/// the kernel would spread one test's name queries and binds over the
/// other's teams (a name "not found" that was bound).
pub fn free_loopback_addr() -> std::net::SocketAddr {
    static GIVEN: parking_lot::Mutex<std::collections::BTreeSet<u16>> =
        parking_lot::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let addr =
            std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port").local_addr().expect("its address");
        if GIVEN.lock().insert(addr.port()) {
            return addr;
        }
    }
}

pub use crate::id::Addr;
pub use crate::names::etcd::{compact as etcd_compact, revoke_lease as etcd_revoke_lease, EtcdNames};
pub use crate::transport::doorbell::{Doorbell, DOORBELL_LEN};
pub use crate::transport::inproc::{Handed, InprocEnd};
pub use crate::transport::shm::{area_for, segment_len, Lent, ShmEnd, StagedRange, HELLO, MIN_RING, WELCOME};
pub use crate::transport::tcp::handshake::{
    accept as tcp_accept, connect as tcp_connect, TcpBind, HELLO as TCP_HELLO, MIN_GRANT, WELCOME as TCP_WELCOME,
};
use crate::transport::tcp::tls::TlsStream;
pub use crate::transport::tcp::{Grant, TcpEnd, TlsConfig};
pub use crate::transport::{Body, Detached, Liveness, Recv, RecvError, SendError, Staged, Transport};
pub use crate::wire::{flags, Header, HeaderError, Kind, HEADER_LEN};

/// A connected in-process pair: `capacity` bytes of frames and
/// `max_detached` bytes of detached payloads each way; `a` and `b` are the
/// doorbells of the teams owning the first and the second end.
pub fn inproc_pair(capacity: usize, max_detached: usize, a: Arc<Doorbell>, b: Arc<Doorbell>) -> (InprocEnd, InprocEnd) {
    crate::transport::inproc::pair(capacity, max_detached, a, b)
}

/// A connected shared-memory pair in this process, on a fresh segment:
/// rings of `ring_bytes` (a power of two, at least [`MIN_RING`]) and
/// payload areas of `area_bytes` (whole pages) each way; the first end is
/// the connector. Other sizes are `InvalidArgument`.
pub fn shm_pair(ring_bytes: usize, area_bytes: u64, a: Arc<Doorbell>, b: Arc<Doorbell>) -> Result<(ShmEnd, ShmEnd)> {
    crate::transport::shm::pair_for_tests(ring_bytes, area_bytes, a, b)
}

/// A connected TCP pair over loopback, without a handshake: each end
/// grants the other `frames` bytes of frames and `detached` bytes of large
/// payloads in flight; `a` and `b` are the doorbells of the teams owning
/// the first and the second end (their sleeping threads watch the sockets).
pub fn tcp_pair(frames: usize, detached: usize, a: Arc<Doorbell>, b: Arc<Doorbell>) -> Result<(TcpEnd, TcpEnd)> {
    let io = |what| move |e| Error::io(what)(e);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("tcp bind"))?;
    let x = std::net::TcpStream::connect(listener.local_addr().map_err(io("tcp addr"))?).map_err(io("tcp connect"))?;
    let (y, _) = listener.accept().map_err(io("tcp accept"))?;
    tcp_pair_of(x, y, frames, detached, a, b)
}

/// [`tcp_pair`] over two connected sockets the caller made (anywhere: in
/// two network namespaces, say).
pub fn tcp_pair_of(
    x: std::net::TcpStream,
    y: std::net::TcpStream,
    frames: usize,
    detached: usize,
    a: Arc<Doorbell>,
    b: Arc<Doorbell>,
) -> Result<(TcpEnd, TcpEnd)> {
    let grant = Grant { frames, detached };
    let timeout = std::time::Duration::from_secs(10);
    Ok((TcpEnd::new(x, grant, grant, a, timeout)?, TcpEnd::new(y, grant, grant, b, timeout)?))
}

/// Two TLS streams on a loopback connection, handshake done (both
/// present `tls`'s certificate, valid for 127.0.0.1, and verify the other's).
fn tls_streams(tls: &TlsConfig) -> Result<(TlsStream, TlsStream)> {
    use crate::transport::tcp::tls as t;
    let io = |what| move |e| Error::io(what)(e);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(io("tcp bind"))?;
    let x = std::net::TcpStream::connect(listener.local_addr().map_err(io("tcp addr"))?).map_err(io("tcp connect"))?;
    let (y, _) = listener.accept().map_err(io("tcp accept"))?;
    for s in [&x, &y] {
        s.set_read_timeout(Some(Duration::from_secs(10))).map_err(io("tcp timeout"))?;
    }
    let (x, y) = std::thread::scope(|s| {
        let client = s.spawn(|| t::client(x, tls, t::UNKNOWN));
        let server = t::server(y, tls);
        (client.join().expect("TLS client thread"), server)
    });
    Ok((x?, y?))
}

/// [`tcp_pair`] in TLS: both ends present `tls`'s certificate (which must
/// be valid for 127.0.0.1) and verify the other's; no ferry handshake.
pub fn tls_pair(
    frames: usize,
    detached: usize,
    a: Arc<Doorbell>,
    b: Arc<Doorbell>,
    tls: &TlsConfig,
) -> Result<(TcpEnd, TcpEnd)> {
    let (x, y) = tls_streams(tls)?;
    let (grant, timeout) = (Grant { frames, detached }, Duration::from_secs(10));
    Ok((TcpEnd::over_tls(x, grant, grant, a, timeout)?, TcpEnd::over_tls(y, grant, grant, b, timeout)?))
}

/// An end in TLS (as [`tls_pair`] makes them, owned by the team of
/// doorbell `a`) and the other side as a bare TLS peer that the test
/// drives by hand (a misbehaving peer).
pub fn tls_end_and_raw(frames: usize, detached: usize, a: Arc<Doorbell>, tls: &TlsConfig) -> Result<(TcpEnd, RawTls)> {
    let (x, y) = tls_streams(tls)?;
    let grant = Grant { frames, detached };
    Ok((TcpEnd::over_tls(x, grant, grant, a, Duration::from_secs(10))?, RawTls(y)))
}

/// The bare TLS peer of [`tls_end_and_raw`] (blocking).
pub struct RawTls(TlsStream);

impl RawTls {
    /// Sends `bytes` in TLS, as an end's frames travel.
    pub fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        std::io::Write::write_all(&mut self.0, bytes)
    }

    /// Writes `bytes` to the socket as they are, outside TLS.
    pub fn send_raw(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        std::io::Write::write_all(&mut crate::transport::tcp::tls::socket(&self.0), bytes)
    }
}

/// One side of a real shared-memory bind run by a test (see [`shm_connect`],
/// [`shm_accept`]): who it is, and what it says.
#[derive(Clone)]
pub struct ShmBind {
    /// The team this side is: its hello or welcome says so.
    pub me: TeamId,
    /// Its team's doorbell, handed to the other side.
    pub doorbell: Arc<Doorbell>,
    /// Connector: the ring size it asks for. Acceptor: the largest it maps.
    pub ring_bytes: usize,
    /// Connector: the bytes of each payload area it makes (whole pages).
    /// Acceptor: the most it stages at once in the area it writes.
    pub area_bytes: u64,
    /// The magic of its hello or welcome: `None` for the real one ([`HELLO`],
    /// [`WELCOME`]); another poses as a peer of another protocol or version.
    pub magic: Option<[u8; 8]>,
    /// How long it waits for the other side's message.
    pub patience: Duration,
}

impl ShmBind {
    fn config(&self) -> BindConfig {
        BindConfig {
            me: self.me,
            doorbell: self.doorbell.clone(),
            ring_bytes: self.ring_bytes,
            max_ring_bytes: self.ring_bytes,
            area_bytes: self.area_bytes,
            handshake_timeout: self.patience,
            cooler: None,
            lease: None,
        }
    }
}

/// The connector's side of the shared-memory bind handshake, as a team runs
/// it, over `stream` (one end of a `UnixStream::pair()`, say; the other goes
/// to [`shm_accept`] on another thread): sends the hello with the segment
/// and its doorbell, then waits for the welcome, which must name `expect`
/// (team and incarnation). Its sizes must be valid (a bind asserts them).
pub fn shm_connect(stream: UnixStream, side: &ShmBind, expect: TeamId) -> Result<ShmEnd> {
    shm::connect_with(stream, &side.config(), expect, side.magic.as_ref().unwrap_or(HELLO))
}

/// The acceptor's side of the shared-memory bind handshake over `stream`:
/// waits for the hello at most `side.patience` (then `DeadlineExceeded`, as
/// a team's reactor closes a silent connection), checks it, and answers
/// with the welcome. `is_peer(team, pid)` says whether the process on the
/// other end (its pid, as the kernel reports it: this one, in a test) is the
/// team its hello claims. Returns this end and the connector's id.
pub fn shm_accept(
    stream: UnixStream,
    side: &ShmBind,
    is_peer: impl Fn(TeamId, u32) -> bool,
) -> Result<(ShmEnd, TeamId)> {
    stream.set_nonblocking(true).map_err(Error::io("socket"))?;
    let until = Instant::now() + side.patience;
    let mut stream = stream;
    loop {
        let is_peer = |team, pid, _lease: Option<&std::fs::File>| is_peer(team, pid);
        match shm::accept_with(stream, &side.config(), is_peer, side.magic.as_ref().unwrap_or(WELCOME))? {
            Accepted::Bound(end, peer) => return Ok((*end, peer)),
            Accepted::Waiting(s) => stream = s,
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::DeadlineExceeded);
        }
        let mut fds = [rustix::event::PollFd::new(&stream, rustix::event::PollFlags::IN)];
        let timeout = rustix::event::Timespec::try_from(left).unwrap_or_default();
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(Error::io("poll")(e.into())),
        }
    }
}

/// A waker that counts its wakes (read the count with `.0.load(..)`).
#[cfg(test)]
pub(crate) fn counting_waker() -> (Arc<WakeCount>, std::task::Waker) {
    let c = Arc::new(WakeCount(std::sync::atomic::AtomicUsize::new(0)));
    (c.clone(), std::task::Waker::from(c))
}

/// What [`counting_waker`] counts.
#[cfg(test)]
pub(crate) struct WakeCount(pub std::sync::atomic::AtomicUsize);

#[cfg(test)]
impl std::task::Wake for WakeCount {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A small deterministic generator (xorshift64*): the same inputs every run.
#[cfg(test)]
pub(crate) struct Rng(u64);

#[cfg(test)]
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub fn bytes(&mut self, max_len: usize) -> Vec<u8> {
        let len = self.below(max_len + 1);
        (0..len).map(|_| self.next() as u8).collect()
    }

    /// `base` with a few bytes changed, cut or grown: inputs near valid ones.
    pub fn mutate(&mut self, base: &[u8]) -> Vec<u8> {
        let mut v = base.to_vec();
        for _ in 0..=self.below(4) {
            match self.below(4) {
                0 if !v.is_empty() => {
                    let i = self.below(v.len());
                    v[i] = self.next() as u8;
                }
                1 => v.truncate(self.below(v.len() + 1)),
                2 => v.extend(self.bytes(8)),
                _ => {
                    if !v.is_empty() {
                        let i = self.below(v.len());
                        v[i] ^= 1 << self.below(8);
                    }
                }
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;

    /// The rings are built on the sizes given: any a bind would refuse is refused here too.
    #[test]
    fn shm_pair_refuses_sizes_a_bind_refuses() {
        let bell = || Arc::new(Doorbell::create().unwrap());
        for (ring, area) in [(0, 0), (64, 0), (MIN_RING + 64, 0), (MIN_RING, 100), (MIN_RING, 1 << 40)] {
            let r = shm_pair(ring, area, bell(), bell());
            assert!(matches!(r, Err(Error::InvalidArgument(_))), "{ring} {area}: {:?}", r.map(drop));
        }
        assert!(shm_pair(MIN_RING, 4096, bell(), bell()).is_ok());
    }
}
