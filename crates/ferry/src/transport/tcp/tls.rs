//! TLS on the TCP connections between nodes (cargo feature `tls`, on by
//! default): mutual TLS 1.3 with rustls and the ring provider.
//!
//! A node whose cluster file names a certificate, its key and a CA
//! (`tls-cert`, `tls-key`, `tls-ca`) runs every connection to another node
//! in TLS: each side presents its certificate and verifies the other's
//! against the CA; a connector also checks that the acceptor's certificate
//! is valid for the address it dialed (an IP address SAN; an acceptor
//! checks the chain only: a connector's address proves nothing). The cluster
//! key's challenge–response (`handshake`) then runs inside TLS as before,
//! and so do the frames. No session resumption: a bind is made once per
//! pair of teams.
//!
//! **Before TLS** a connector says, in the clear, that TLS follows and for
//! which team (`FERRYTS1`, team id: 20 bytes), so the node's listener can
//! hand the connection to that team before any TLS byte is read (a TLS
//! session cannot move between processes); the team answers `FERRYTSY` and
//! TLS starts, or `FERRYTSN` if its node has no TLS. A TLS node answers a
//! connection that opens without TLS with `FERRYTSR`. Either way both sides
//! fail with [`Error::Tls`], at once: a node with TLS and one without never
//! bind, and nothing waits past a handshake's patience.
//!
//! **On a bound channel** (`TcpEnd::over_tls`) the session lives beside the
//! socket, under a lock of its own, innermost. Writes move the queued
//! frames into rustls as its buffer (bounded: [`BUFFER`]) takes them,
//! encrypted into records, and write the records with one vectored write;
//! the rest waits in the end's queue, as unsent bytes do without TLS.
//! Reads take what the kernel holds, 64 KiB per system call, feed it to
//! rustls and move every decrypted byte into the end's frame buffer, until
//! the kernel has nothing more: the socket, watched edge-triggered by the
//! team's sleeping threads, wakes them for the next bytes as it does
//! without TLS. A peer that sends what is not TLS (or fails its checks)
//! breaks that channel only (`Corrupt`: it is closed).
//!
//! Without the `tls` feature the types are here but cannot be made: a
//! cluster file asking for TLS is refused, and a connector's TLS preamble
//! is answered with `FERRYTSN` (so the mismatch is still named).

use super::{Rx, TcpEnd, Tx};
use crate::error::{Error, Result};
use crate::id::TeamId;
use crate::transport::doorbell::Doorbell;
use parking_lot::Mutex;
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Bytes of records (and unsent plaintext) a session may buffer on the way
/// out; the rest of a burst waits, unencrypted, in the end's queue.
#[cfg(feature = "tls")]
pub const BUFFER: usize = 128 * 1024;

/// What a node brings to TLS: its certificate chain and private key, and
/// the certificate authority it verifies its peers' certificates against.
/// Cheap to clone.
#[derive(Clone)]
pub struct TlsConfig {
    inner: Inner,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.write_str("TlsConfig { .. }")
    }
}

impl TlsConfig {
    /// Loads a node's TLS settings from PEM files: `cert`, its certificate
    /// chain (its own first); `key`, its private key (PKCS#8, PKCS#1 or
    /// SEC1); `ca`, the certificates of the authorities it trusts (one or
    /// more). Each node's certificate must be valid for the IP address the
    /// other nodes reach it at (a subject alternative name), for TLS
    /// servers and clients both (or name no extended key usage).
    /// `InvalidArgument` names the file that is wrong; without the cargo
    /// feature `tls` every call is `InvalidArgument`.
    pub fn from_files(cert: &Path, key: &Path, ca: &Path) -> Result<TlsConfig> {
        #[cfg(feature = "tls")]
        {
            real::load(cert, key, ca)
        }
        #[cfg(not(feature = "tls"))]
        {
            let _ = (cert, key, ca);
            Err(Error::InvalidArgument("TLS: this ferry was built without TLS (cargo feature `tls`)".into()))
        }
    }
}

/// Who is at the other end of a connection before its hello says (an
/// acceptor's error names this).
pub(crate) const UNKNOWN: TeamId = TeamId { node: 0, team: 0, incarnation: 0 };

#[cfg(feature = "tls")]
pub(crate) use real::*;

#[cfg(not(feature = "tls"))]
pub(crate) use none::*;

#[cfg(feature = "tls")]
mod real {
    use super::super::{clock, READ};
    use super::*;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use rustls::{AlertDescription, Connection};
    use std::io::{Read, Write};

    #[derive(Clone)]
    pub(super) struct Inner {
        client: Arc<rustls::ClientConfig>,
        server: Arc<rustls::ServerConfig>,
    }

    pub(super) fn load(cert: &Path, key: &Path, ca: &Path) -> Result<TlsConfig> {
        let bad = |path: &Path, what: &dyn std::fmt::Display| {
            Error::InvalidArgument(format!("TLS: {}: {what}", path.display()))
        };
        let certs = |path: &Path| -> Result<Vec<CertificateDer<'static>>> {
            let certs = CertificateDer::pem_file_iter(path)
                .map_err(|e| bad(path, &e))?
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| bad(path, &e))?;
            match certs.is_empty() {
                true => Err(bad(path, &"no certificate in it")),
                false => Ok(certs),
            }
        };
        let chain = certs(cert)?;
        let private = PrivateKeyDer::from_pem_file(key).map_err(|e| bad(key, &e))?;
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(ca)? {
            roots.add(c).map_err(|e| bad(ca, &e))?;
        }
        let roots = Arc::new(roots);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let versions = &[&rustls::version::TLS13];
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .build()
            .map_err(|e| bad(ca, &e))?;
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .map_err(|e| bad(cert, &e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), private.clone_key())
            .map_err(|e| bad(key, &e))?;
        // Binds are made once per pair of teams: nothing to resume.
        server.send_tls13_tickets = 0;
        let mut client = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .map_err(|e| bad(cert, &e))?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, private)
            .map_err(|e| bad(key, &e))?;
        client.resumption = rustls::client::Resumption::disabled();
        Ok(TlsConfig { inner: Inner { client: Arc::new(client), server: Arc::new(server) } })
    }

    /// A connection in TLS, blocking (the bind handshake runs over it):
    /// each read waits at most the socket's read timeout.
    pub struct TlsStream {
        conn: Connection,
        sock: TcpStream,
    }

    impl Read for TlsStream {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            loop {
                match self.conn.reader().read(buf) {
                    // Nothing decrypted yet: more from the socket (or its end).
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        self.conn.complete_io(&mut self.sock)?;
                    }
                    got => return got,
                }
            }
        }
    }

    impl Write for TlsStream {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let n = self.conn.writer().write(buf)?;
            self.flush()?;
            Ok(n)
        }

        fn flush(&mut self) -> std::io::Result<()> {
            while self.conn.wants_write() {
                self.conn.write_tls(&mut self.sock)?;
            }
            Ok(())
        }
    }

    /// The socket under a stream.
    pub(crate) fn socket(s: &TlsStream) -> &TcpStream {
        &s.sock
    }

    /// Whether the certificate the other side presented (its chain checked
    /// by the handshake) is valid for `ip`: an IP address SAN.
    pub(crate) fn certified_for(s: &TlsStream, ip: std::net::IpAddr) -> bool {
        let Some(cert) = s.conn.peer_certificates().and_then(|c| c.first()) else { return false };
        let Ok(parsed) = rustls::server::ParsedCertificate::try_from(cert) else { return false };
        rustls::client::verify_server_name(&parsed, &ServerName::IpAddress(ip.into())).is_ok()
    }

    /// The connector's TLS handshake on `sock` (its preamble answered), as
    /// a client of the node of `to`, at most its read timeout per step.
    pub(crate) fn client(mut sock: TcpStream, cfg: &TlsConfig, to: TeamId) -> Result<TlsStream> {
        let addr = sock.peer_addr().map_err(Error::io("tls peer address"))?;
        let name = ServerName::IpAddress(addr.ip().into());
        let conn = rustls::ClientConnection::new(cfg.inner.client.clone(), name)
            .map_err(|e| Error::Tls { peer: to, what: e.to_string() })?;
        let mut conn = Connection::Client(conn);
        handshake(&mut conn, &mut sock, to)?;
        Ok(TlsStream { conn, sock })
    }

    /// The acceptor's TLS handshake on `sock` (the preamble answered).
    pub(crate) fn server(mut sock: TcpStream, cfg: &TlsConfig) -> Result<TlsStream> {
        let conn = rustls::ServerConnection::new(cfg.inner.server.clone())
            .map_err(|e| Error::Tls { peer: UNKNOWN, what: e.to_string() })?;
        let mut conn = Connection::Server(conn);
        handshake(&mut conn, &mut sock, UNKNOWN)?;
        Ok(TlsStream { conn, sock })
    }

    fn handshake(conn: &mut Connection, sock: &mut TcpStream, peer: TeamId) -> Result<()> {
        conn.set_buffer_limit(Some(BUFFER));
        while conn.is_handshaking() {
            conn.complete_io(sock).map_err(|e| failed(e, peer))?;
        }
        Ok(())
    }

    /// What a failed TLS handshake means.
    fn failed(e: std::io::Error, peer: TeamId) -> Error {
        if let Some(e) = failure(&e, peer) {
            return e;
        }
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::DeadlineExceeded,
            _ => Error::Tls { peer, what: format!("the connection broke during the TLS handshake ({e})") },
        }
    }

    /// The typed error for `e` if TLS failed it: `Unauthenticated` for a
    /// certificate that one side refused, else `Tls`.
    pub(crate) fn failure(e: &std::io::Error, peer: TeamId) -> Option<Error> {
        let tls = e.get_ref()?.downcast_ref::<rustls::Error>()?;
        use AlertDescription as A;
        let refused = |what: String| Some(Error::Unauthenticated { peer, what });
        match tls {
            rustls::Error::InvalidCertificate(c) => refused(format!("TLS: its certificate is refused: {c:?}")),
            rustls::Error::NoCertificatesPresented => refused("TLS: it presented no certificate".into()),
            rustls::Error::AlertReceived(
                a @ (A::BadCertificate
                | A::UnsupportedCertificate
                | A::CertificateRevoked
                | A::CertificateExpired
                | A::CertificateUnknown
                | A::UnknownCA
                | A::CertificateRequired
                | A::AccessDenied),
            ) => refused(format!("TLS: it refused our certificate ({a:?})")),
            other => Some(Error::Tls { peer, what: other.to_string() }),
        }
    }

    /// A bound channel's TLS session.
    pub(crate) struct Session {
        conn: Connection,
        /// What the last read took from the kernel, fed to rustls in turn.
        scratch: Vec<u8>,
    }

    impl TcpEnd {
        /// An end whose frames travel in `stream`'s TLS session (the bind
        /// handshake done over it); otherwise as [`TcpEnd::new`].
        pub(crate) fn over_tls(
            stream: TlsStream,
            ours: super::super::Grant,
            theirs: super::super::Grant,
            team: Arc<Doorbell>,
            peer_timeout: Duration,
        ) -> Result<TcpEnd> {
            let TlsStream { conn, sock } = stream;
            let session = Session { conn, scratch: vec![0; READ] };
            let end = TcpEnd::make(sock, Some(session), ours, theirs, team, peer_timeout)?;
            // The handshake's last read may have taken the peer's first
            // frames with it: they wait in the session, not in the socket,
            // and no wake-up will say so.
            end.pump_credit();
            Ok(end)
        }

        /// Moves the queue into the session (encrypted) as far as its
        /// buffer takes it and writes the records the socket takes; sets
        /// `tx_pending`, and says whether bytes still wait.
        pub(in crate::transport::tcp) fn write_tls(&self, tx: &mut Tx, session: &Mutex<Session>) -> bool {
            let mut s = session.lock();
            let conn = &mut s.conn;
            let mut broken = false;
            loop {
                while !tx.out.is_empty() {
                    match conn.writer().write_vectored(&TcpEnd::out_slices(tx)) {
                        Ok(0) => break,
                        Ok(n) => TcpEnd::written(tx, n),
                        Err(_) => {
                            // The session failed (the peer broke TLS): nothing more goes.
                            broken = true;
                            break;
                        }
                    }
                }
                if broken || !conn.wants_write() {
                    break;
                }
                match conn.write_tls(&mut &self.sock) {
                    Ok(_) => self.last_sent.store(clock(), std::sync::atomic::Ordering::Relaxed),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        broken = true;
                        break;
                    }
                }
            }
            if broken {
                // Reset or broken: the peer is gone.
                tx.out.clear();
                self.hang_up();
            }
            let waiting = !broken && (!tx.out.is_empty() || conn.wants_write());
            self.tx_pending.store(waiting, std::sync::atomic::Ordering::Release);
            waiting
        }

        /// Reads everything the kernel holds, through the session, into
        /// `rx`. Bytes that are not TLS (or fail its checks) are `Corrupt`.
        /// Reads and decrypts what the kernel holds into `rx`, up to its
        /// cap (`Ok(true)`: stopped there; rustls or the kernel may hold more).
        pub(in crate::transport::tcp) fn read_tls(
            &self,
            rx: &mut Rx,
            session: &Mutex<Session>,
        ) -> std::result::Result<bool, crate::transport::RecvError> {
            use std::io::ErrorKind as K;
            let corrupt = |e: &dyn std::fmt::Display| {
                crate::transport::RecvError::Corrupt(crate::error::Violation::Tls(e.to_string()))
            };
            let mut s = session.lock();
            let Session { conn, scratch } = &mut *s;
            // `scratch[fed..got]` is read from the kernel, not yet given to rustls.
            let (mut fed, mut got) = (0, 0);
            let outcome = loop {
                if let Err(e) = conn.process_new_packets() {
                    // The alert rustls made of it, if the socket takes it.
                    let _ = conn.write_tls(&mut &self.sock);
                    break Err(corrupt(&e));
                }
                // Every decrypted byte, into the frame buffer: past its cap if
                // need be, as rustls holds little (the cap is checked before
                // the kernel is read, with nothing read and not given to rustls).
                let ended = loop {
                    match conn.reader().read(rx.room_past_cap()) {
                        Ok(0) => break true, // the peer ended TLS (close_notify)
                        Ok(n) => {
                            rx.filled(n);
                            // A large payload's header, once decrypted, sends
                            // the rest of it into its own buffer.
                            rx.split()?;
                        }
                        Err(e) if e.kind() == K::WouldBlock => break false,
                        Err(_) => break true, // the stream ended without TLS's end
                    }
                };
                if ended {
                    self.hang_up();
                    break Ok(false);
                }
                if fed < got {
                    match conn.read_tls(&mut &scratch[fed..got]) {
                        Ok(0) => break Ok(false),
                        Ok(n) => fed += n,
                        Err(e) => break Err(corrupt(&e)),
                    }
                    continue;
                }
                if rx.at_cap() {
                    break Ok(true);
                }
                match (&self.sock).read(scratch) {
                    Ok(0) => {
                        self.last_heard.store(clock(), std::sync::atomic::Ordering::Relaxed);
                        // End of stream: rustls learns it, and says whether TLS ended first.
                        let _ = conn.read_tls(&mut &[][..]);
                    }
                    Ok(n) => {
                        self.last_heard.store(clock(), std::sync::atomic::Ordering::Relaxed);
                        (fed, got) = (0, n);
                    }
                    Err(e) if e.kind() == K::WouldBlock => break Ok(false),
                    Err(e) if e.kind() == K::Interrupted => {}
                    Err(_) => {
                        self.hang_up();
                        break Ok(false);
                    }
                }
            };
            // What reading made us owe the peer (a key update's answer) goes
            // out now if the socket takes it, else with the next flush.
            if conn.wants_write() {
                let _ = conn.write_tls(&mut &self.sock);
                if conn.wants_write() {
                    self.tx_pending.store(true, std::sync::atomic::Ordering::Release);
                }
            }
            outcome
        }

        /// Ends TLS (`close_notify`), if the socket takes it.
        pub(in crate::transport::tcp) fn close_tls(&self, session: &Mutex<Session>) {
            let mut s = session.lock();
            s.conn.send_close_notify();
            let _ = s.conn.write_tls(&mut &self.sock);
        }
    }
}

#[cfg(not(feature = "tls"))]
mod none {
    use super::*;

    /// Never made: this build has no TLS.
    #[derive(Clone)]
    pub(super) enum Inner {}

    /// Never made: this build has no TLS.
    pub enum TlsStream {}

    impl std::io::Read for TlsStream {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            match *self {}
        }
    }

    impl std::io::Write for TlsStream {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            match *self {}
        }

        fn flush(&mut self) -> std::io::Result<()> {
            match *self {}
        }
    }

    pub(crate) fn socket(s: &TlsStream) -> &TcpStream {
        match *s {}
    }

    pub(crate) fn certified_for(s: &TlsStream, _: std::net::IpAddr) -> bool {
        match *s {}
    }

    pub(crate) fn client(_: TcpStream, cfg: &TlsConfig, _: TeamId) -> Result<TlsStream> {
        match cfg.inner {}
    }

    pub(crate) fn server(_: TcpStream, cfg: &TlsConfig) -> Result<TlsStream> {
        match cfg.inner {}
    }

    pub(crate) fn failure(_: &std::io::Error, _: TeamId) -> Option<Error> {
        None
    }

    /// Never made: this build has no TLS.
    pub(crate) enum Session {}

    impl TcpEnd {
        pub(crate) fn over_tls(
            stream: TlsStream,
            _: super::super::Grant,
            _: super::super::Grant,
            _: Arc<Doorbell>,
            _: Duration,
        ) -> Result<TcpEnd> {
            match stream {}
        }

        pub(in crate::transport::tcp) fn write_tls(&self, _: &mut Tx, session: &Mutex<Session>) -> bool {
            match *session.lock() {}
        }

        pub(in crate::transport::tcp) fn read_tls(
            &self,
            _: &mut Rx,
            session: &Mutex<Session>,
        ) -> std::result::Result<bool, crate::transport::RecvError> {
            match *session.lock() {}
        }

        pub(in crate::transport::tcp) fn close_tls(&self, session: &Mutex<Session>) {
            match *session.lock() {}
        }
    }
}
