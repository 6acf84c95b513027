//! The one error type of ferry. Every variant names what went wrong.

use crate::id::{Addr, EndpointId, TeamId};
use std::io;

pub use crate::wire::HeaderError;

/// ferry's result: [`Error`] unless said otherwise.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in a ferry operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The team at the other end died or closed the channel; the operation cannot finish.
    #[error("peer team {peer} is gone")]
    PeerGone {
        /// The team that is gone.
        peer: TeamId,
    },
    /// An `Immediate` send found the queue full (the message was not sent).
    #[error(
        "queue to {to} is full (its inbox, the channel's hold queue and the channel are: \
         the receiver must take messages; TeamBuilder::inbox_capacity, inbox_bytes, \
         hold_capacity and ring_bytes set their sizes)"
    )]
    WouldBlock {
        /// The destination of the send.
        to: EndpointId,
    },
    /// The operation's deadline passed before it finished.
    #[error("deadline exceeded")]
    DeadlineExceeded,
    /// The operation was cancelled.
    #[error("cancelled")]
    Cancelled,
    /// The destination team exists but has no such endpoint (never had, or it was closed).
    #[error("no endpoint {0}")]
    NoSuchEndpoint(EndpointId),
    /// The destination team cannot be reached (no live team with that id on this node).
    #[error("no live team {0}")]
    NoSuchTeam(TeamId),
    /// No name is bound to this string in the name plane.
    #[error("name {0:?} is not registered")]
    NameNotFound(String),
    /// The name is bound by a live team already.
    #[error("name {name:?} is already bound to {owner}")]
    NameTaken {
        /// The name asked for.
        name: String,
        /// The endpoint it is bound to.
        owner: EndpointId,
    },
    /// Names are 1..=200 bytes of `[A-Za-z0-9._-]`, not starting with a dot.
    #[error("invalid name {0:?}: use 1-200 characters of A-Z a-z 0-9 . _ - not starting with '.'")]
    InvalidName(String),
    /// A message is larger than the configured maximum: the sending
    /// team's `max_message`, or the receiving team's.
    #[error(
        "message of {len} bytes exceeds the maximum of {max} bytes \
         (max_message of the sending or the receiving team: TeamBuilder::max_message)"
    )]
    TooLarge {
        /// The message's size in bytes.
        len: usize,
        /// The largest size allowed.
        max: usize,
    },
    /// A payload could not be encoded or decoded.
    #[error("codec: {0}")]
    Codec(String),
    /// A peer sent something that breaks the protocol; its channel (or
    /// connection) is closed.
    #[error("protocol violation by {peer}: {violation}")]
    Protocol {
        /// The team that broke the protocol (`node.0.0` when only its node
        /// is known, `0.0.0` when not even that).
        peer: TeamId,
        /// What it did.
        violation: Violation,
    },
    /// A peer over the network could not prove it holds the cluster's key
    /// (or we could not prove it to the peer): the connection was refused.
    #[error("{peer} is not authenticated: {what}")]
    Unauthenticated {
        /// Who it claimed to be (or whom we meant to reach).
        peer: TeamId,
        /// What failed.
        what: String,
    },
    /// TLS between two nodes failed: one of them uses TLS and the other
    /// does not (their cluster files disagree), or the TLS session broke.
    /// A certificate one side refuses is [`Error::Unauthenticated`].
    #[error("TLS with {peer}: {what}")]
    Tls {
        /// The team (or, before its hello, node) at the other end; `0.0`
        /// when not known yet.
        peer: TeamId,
        /// What failed.
        what: String,
    },
    /// A bounded resource ran out: the message names the limit, its value
    /// and how to raise it.
    #[error("{limit} reached (at most {max}): {}", limit.how_to_raise())]
    LimitReached {
        /// Which limit.
        limit: Limit,
        /// Its value.
        max: u64,
    },
    /// The receiver (or this team) refused the operation; the [`Refusal`] says why.
    #[error("refused: {0}")]
    Refused(Refusal),
    /// A task or handler panicked; the text is its panic message.
    #[error("panicked: {0}")]
    Panicked(String),
    /// A [`crate::TeamBuilder`] setting is outside its allowed range; the
    /// team did not start.
    #[error("TeamBuilder::{setting} = {value} is out of range (allowed: {allowed})")]
    InvalidSetting {
        /// The setting, as its `TeamBuilder` method is named.
        setting: &'static str,
        /// The value it was given.
        value: String,
        /// Its allowed range.
        allowed: String,
    },
    /// The caller passed something the operation cannot work with (e.g. a
    /// `Select` over no ports); the text says what.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// This team has shut down.
    #[error("team is shut down")]
    Shutdown,
    /// A region's key is not the one it was exported with (`Team::open_region`).
    #[error("access denied to region {region}: wrong key")]
    AccessDenied {
        /// The region.
        region: EndpointId,
    },
    /// An access outside a region (its offset plus length past the
    /// region's end, or overflowing).
    #[error("{len} bytes at offset {offset} are outside the region's {region_len} bytes")]
    OutOfBounds {
        /// The access's offset.
        offset: u64,
        /// Its length.
        len: u64,
        /// The region's length.
        region_len: u64,
    },
    /// A `Latch` signal handler ran and waits for its owner to re-arm it
    /// (`Signal::rearm`): the signal was not accepted.
    #[error("signal handler {handler} is latched: it runs again once its owner re-arms it")]
    Latched {
        /// The handler.
        handler: EndpointId,
    },
    /// The endpoint's owner closed this handle (a fifo's producer ring: the
    /// fifo was dropped, or the owner found the ring corrupt).
    #[error("{endpoint} closed this handle: {why}")]
    Closed {
        /// The endpoint (a fifo).
        endpoint: EndpointId,
        /// Why.
        why: &'static str,
    },
    /// The region was revoked or re-keyed by its owner since this handle
    /// opened it (`Region::revoke`, `Region::rekey`): open it again.
    #[error("region {region} was revoked by its owner")]
    Revoked {
        /// The region.
        region: EndpointId,
    },
    /// An atomic operation on a word whose offset is not a multiple of 8.
    #[error("offset {offset} is not a multiple of 8 (atomic operations are on aligned u64 words)")]
    Misaligned {
        /// The offset given.
        offset: u64,
    },
    /// The other end of the link was closed, and everything it sent before
    /// its close was received: nothing more comes, nothing more goes.
    #[error("link {link} was closed at its other end")]
    LinkClosed {
        /// The link.
        link: crate::link::LinkId,
    },
    /// This link end was sent away inside a message (serialized): it is
    /// the receiver's now.
    #[error("link {link}'s end here was sent away in a message")]
    LinkMoved {
        /// The link.
        link: crate::link::LinkId,
    },
    /// A served frame kind asked for is registered already (see `Team::serve_frames`).
    #[error("served frame kind {kind} is taken by another handler")]
    KindTaken {
        /// The first kind of the range that is taken.
        kind: u8,
    },
    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What ferry was doing.
        context: &'static str,
        /// The system's error.
        #[source]
        source: io::Error,
    },
}

/// How a peer broke the protocol: [`Error::Protocol`]'s cause, and why a
/// transport closed a channel. One variant per way a peer can misbehave.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// A handshake message with the wrong magic or length.
    #[error("a malformed {message} (wrong magic or layout, {len} bytes)")]
    MalformedHandshake {
        /// Which message.
        message: HandshakeMessage,
        /// Its length in bytes.
        len: usize,
    },
    /// The connection closed before a handshake message was whole.
    #[error("closed before its {0} was whole")]
    ClosedBefore(HandshakeMessage),
    /// A shared-memory hello asked for a ring that is not a power of two
    /// of at least the smallest ring.
    #[error("asked for a {0}-byte ring (a power of two of at least 4 KiB)")]
    RingSize(u64),
    /// A shared-memory hello asked for a payload area that is not whole
    /// pages or is past the largest area.
    #[error("asked for a {0}-byte payload area (whole pages, at most 64 GiB)")]
    AreaSize(u64),
    /// A TCP hello or welcome granted credit outside the handshake's bounds.
    #[error("granted {frames} frame bytes and {detached} payload bytes (out of bounds)")]
    GrantOutOfBounds {
        /// Frame bytes granted.
        frames: u64,
        /// Large-payload bytes granted.
        detached: u64,
    },
    /// A hello claimed incarnation 0, which no team has.
    #[error("its hello claims incarnation 0")]
    NoIncarnation,
    /// A shared-memory hello came from a process other than the team it names.
    #[error("it is not the process on the other end of the socket")]
    NotThatProcess,
    /// A handshake carried the wrong number of descriptors.
    #[error("sent {got} descriptors, want {want}")]
    Descriptors {
        /// How many came.
        got: usize,
        /// How many the message carries.
        want: usize,
    },
    /// The doorbell descriptors a peer sent are not a sealed page and two
    /// eventfds.
    #[error("sent doorbell descriptors that are not a sealed page and two eventfds")]
    BadDoorbell,
    /// A shared-memory segment whose header is not this version's or not
    /// the size the hello asked for.
    #[error("sent a segment of another version or size")]
    SegmentMismatch,
    /// A TCP bind in TLS whose hello names another team than its TLS preamble did.
    #[error("its TLS preamble named {preamble}, its hello {hello}")]
    PreambleMismatch {
        /// The team the preamble named.
        preamble: TeamId,
        /// The team the hello names.
        hello: TeamId,
    },
    /// A frame header that does not decode.
    #[error("a frame header that does not decode: {0}")]
    BadHeader(HeaderError),
    /// A frame on a channel that carries frames between two other teams.
    #[error("a frame from {src} to {dst}")]
    Misaddressed {
        /// Its source.
        src: Addr,
        /// Its destination.
        dst: Addr,
    },
    /// The peer broke the shared-memory ring's invariants.
    #[error("corrupt ring: {0}")]
    Ring(RingFault),
    /// A payload descriptor naming a range outside the payload area (or
    /// empty, or not page-aligned).
    #[error("a payload descriptor outside the area (offset {offset}, {len} bytes)")]
    DescriptorOutsideArea {
        /// The range's offset.
        offset: u64,
        /// Its length.
        len: u64,
    },
    /// A payload descriptor of the wrong size.
    #[error("a payload descriptor of {0} bytes")]
    DescriptorLength(usize),
    /// A payload range given back that was never lent (or lent on a
    /// channel with no payload area).
    #[error("gave back a payload range never lent (offset {offset}, {len} bytes)")]
    ReleaseNotLent {
        /// The range's offset.
        offset: u64,
        /// Its length.
        len: u64,
    },
    /// A payload release outside the transport that lends payloads.
    #[error("a payload release outside its transport")]
    StrayRelease,
    /// Descriptors handed over that this end did not ask for (or a
    /// handover message that is not one: no tag, no descriptor, too many).
    #[error("descriptors handed over unasked (call {tag})")]
    UnaskedHandover {
        /// The call they came for (0: not a handover message).
        tag: u64,
    },
    /// An answer about a region or a fifo (its opening, an operation
    /// served by its owner) of no form this build knows.
    #[error("a region's owner answered with {0}")]
    BadRegionAnswer(String),
    /// A link's frame that breaks the link's protocol (malformed, out of
    /// sequence, past the window its receiver granted): the link breaks.
    #[error("a link's frame broke its protocol: {0}")]
    BadLinkFrame(String),
    /// An answer that says descriptors came with it, when none did.
    #[error("an answer to call {tag} without the descriptors it announced")]
    HandoverMissing {
        /// The call it answers.
        tag: u64,
    },
    /// A TCP frame larger than the credit granted.
    #[error("a {len}-byte frame, past the credit granted")]
    PastCredit {
        /// The frame's payload bytes.
        len: usize,
    },
    /// A TCP credit frame of the wrong size.
    #[error("a {len}-byte credit frame")]
    BadCreditFrame {
        /// Its payload bytes.
        len: usize,
    },
    /// Credit returned for more than was ever sent.
    #[error("credit returned past the grant: {frames} of {granted_frames} frame bytes, {detached} of {granted_detached} payload bytes")]
    CreditPastGrant {
        /// Frame bytes of credit now held.
        frames: u64,
        /// Frame bytes granted.
        granted_frames: u64,
        /// Payload bytes of credit now held.
        detached: u64,
        /// Payload bytes granted.
        granted_detached: u64,
    },
    /// The TLS record layer failed (bytes that are not TLS, or fail its
    /// checks). The text is rustls's: TLS is an optional feature, and its
    /// errors are not part of this type.
    #[error("TLS: {0}")]
    Tls(String),
}

/// Why an operation was refused: [`Error::Refused`]'s cause.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The receiver dropped the message without the reply `OnReturn` asked
    /// for (or did not decode it).
    #[error("the receiver dropped the message without the reply it asked for")]
    NoReply,
    /// A blocking bind found no blocking thread free to bind on.
    #[error("no blocking thread to bind on (TeamBuilder::blocking_threads)")]
    NoBlockingThread,
    /// Every team number of this node is taken by a live team.
    #[error("no free team number on this node")]
    NoTeamNumber,
    /// A reply larger than this team's `max_message` (it was dropped).
    #[error("a reply of {len} bytes, larger than this team's max_message of {max} (TeamBuilder::max_message)")]
    ReplyTooLarge {
        /// The reply's size in bytes.
        len: usize,
        /// This team's `max_message`.
        max: usize,
    },
    /// The peer serves no frames of this kind (no primitive there
    /// registered it: see `Team::serve_frames`).
    #[error("the peer serves no frames of kind {kind}")]
    NotServed {
        /// The frame's kind byte.
        kind: u8,
    },
    /// The peer refused for a reason this build does not know; the text is
    /// the peer's own words, as it sent them.
    #[error("{0}")]
    Peer(String),
}

/// A handshake message, as [`Violation`] names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HandshakeMessage {
    /// The connector's hello.
    #[error("hello")]
    Hello,
    /// The acceptor's welcome.
    #[error("welcome")]
    Welcome,
    /// The acceptor's last word on the proof.
    #[error("verdict")]
    Verdict,
    /// The acceptor's refusal (a limit of its was reached).
    #[error("refusal")]
    Refusal,
    /// The 8 bytes that say what a TCP connection wants (a bind, a name
    /// query, TLS).
    #[error("opening bytes")]
    Opening,
    /// The preamble that starts TLS.
    #[error("TLS preamble")]
    TlsPreamble,
    /// A node's answer to a name query.
    #[error("name answer")]
    NameAnswer,
}

/// How a peer broke a shared-memory ring (it shares the ring's memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RingFault {
    /// The consumer's head moved backwards or past the tail.
    #[error("consumer head moved backwards or past the tail")]
    Head,
    /// A record's stamp has the wrong lap.
    #[error("record stamp has the wrong lap")]
    Lap,
    /// Padding at the start of the ring (or twice in a row).
    #[error("padding at the start of the ring")]
    PaddingAtStart,
    /// Padding that does not reach the ring's end.
    #[error("bad padding length")]
    PaddingLength,
    /// A record longer than the ring allows.
    #[error("bad record length")]
    RecordLength,
}

/// A resource limit (see `docs/RELIABILITY.md`, "Limits", for every limit
/// and its default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Limit {
    /// Channels a team keeps at once, one per peer team
    /// ([`crate::TeamBuilder::max_channels`]): this team's, or the peer's
    /// that refused the bind.
    Channels,
    /// Names a team binds at once ([`crate::TeamBuilder::max_names`]).
    Names,
    /// The ring a team asks of a peer over shared memory: larger than the
    /// peer maps ([`crate::TeamBuilder::max_ring_bytes`]).
    RingBytes,
    /// Endpoints a team opens in its life (2^23 − 1): slots are not reused,
    /// so that an old id never reaches a new endpoint.
    Endpoints,
    /// Open file descriptors of the process (`RLIMIT_NOFILE`): each channel
    /// holds a few (its socket, memory, wake-up lines).
    OpenFiles,
    /// Calls in one RPC batch (at most 65,536, and past 13,107 at most one
    /// per 160 bytes of the batch): what a server takes from one message.
    BatchCalls,
    /// TCP connections in their handshake at once from one address
    /// ([`crate::TeamBuilder::handshakes_per_source`]), or from addresses
    /// that are no node's of the cluster file (64), at the node that refused.
    Handshakes,
    /// Calls on one channel awaiting descriptors back at once (64): see
    /// [`crate::extend`]'s post-bind resources.
    Handovers,
    /// Regions a team exports at once ([`crate::TeamBuilder::max_regions`]).
    Regions,
    /// Bytes a team exports in all its regions ([`crate::TeamBuilder::max_exported_bytes`]).
    ExportedBytes,
    /// Regions a team has open at once as an importer ([`crate::TeamBuilder::max_imported_regions`]).
    ImportedRegions,
    /// Producers of one fifo ([`crate::fifo::MAX_PRODUCERS`]).
    FifoProducers,
    /// Link ends a team holds at once ([`crate::TeamBuilder::max_links`]).
    Links,
    /// Links waiting in one listener to be accepted ([`crate::link::BACKLOG`]).
    LinkBacklog,
    /// Sends and calls of a team waiting for their answer at once
    /// ([`crate::TeamBuilder::max_calls_in_flight`]).
    CallsInFlight,
}

impl Limit {
    /// Its number in a bind's refusal (`docs/WIRE.md`).
    pub(crate) fn code(self) -> u32 {
        match self {
            Limit::Channels => 1,
            Limit::Names => 2,
            Limit::OpenFiles => 3,
            Limit::Endpoints => 4,
            Limit::RingBytes => 5,
            Limit::BatchCalls => 6,
            Limit::Handshakes => 7,
            Limit::Handovers => 8,
            Limit::Regions => 9,
            Limit::ExportedBytes => 10,
            Limit::ImportedRegions => 11,
            Limit::FifoProducers => 12,
            Limit::Links => 13,
            Limit::LinkBacklog => 14,
            Limit::CallsInFlight => 15,
        }
    }

    /// The limit numbered `code` in a bind's refusal.
    pub(crate) fn from_code(code: u32) -> Option<Limit> {
        [
            Limit::Channels,
            Limit::Names,
            Limit::OpenFiles,
            Limit::Endpoints,
            Limit::RingBytes,
            Limit::BatchCalls,
            Limit::Handshakes,
            Limit::Handovers,
            Limit::Regions,
            Limit::ExportedBytes,
            Limit::ImportedRegions,
            Limit::FifoProducers,
            Limit::Links,
            Limit::LinkBacklog,
            Limit::CallsInFlight,
        ]
        .into_iter()
        .find(|l| l.code() == code)
    }

    /// The 20 bytes of a bind's refusal for this limit: `magic`, the limit's
    /// number, its value (little-endian).
    pub(crate) fn refusal(self, magic: &[u8; 8], max: u64) -> [u8; 20] {
        let mut b = [0u8; 20];
        b[..8].copy_from_slice(magic);
        b[8..12].copy_from_slice(&self.code().to_le_bytes());
        b[12..].copy_from_slice(&max.to_le_bytes());
        b
    }

    /// The error a bind's refusal (`refusal`'s 12 bytes after the magic) means.
    pub(crate) fn refused(body: &[u8]) -> Option<Error> {
        let code = u32::from_le_bytes(body.get(..4)?.try_into().ok()?);
        let max = u64::from_le_bytes(body.get(4..12)?.try_into().ok()?);
        Some(Error::LimitReached { limit: Limit::from_code(code)?, max })
    }

    /// How to raise it.
    pub fn how_to_raise(self) -> &'static str {
        match self {
            Limit::Channels => "raise TeamBuilder::max_channels (of the team that refused)",
            Limit::Names => "unbind names, or raise TeamBuilder::max_names",
            Limit::OpenFiles => "raise the process's open-file limit (ulimit -n, RLIMIT_NOFILE)",
            Limit::Endpoints => "start a new team (a new incarnation has all its slots)",
            Limit::RingBytes => "lower this team's TeamBuilder::ring_bytes, or raise the peer's max_ring_bytes",
            Limit::BatchCalls => "flush batched calls sooner (Client::flush)",
            Limit::Handshakes => {
                "bind fewer teams at once, or raise the refusing node's TeamBuilder::handshakes_per_source \
                 (handshakes-per-source in its cluster file)"
            }
            Limit::Handovers => "wait for some of the calls that take descriptors back to end",
            Limit::Regions => "drop regions no longer needed, or raise TeamBuilder::max_regions",
            Limit::ExportedBytes => "drop regions no longer needed, or raise TeamBuilder::max_exported_bytes",
            Limit::ImportedRegions => {
                "drop opened regions no longer needed, or raise TeamBuilder::max_imported_regions"
            }
            Limit::FifoProducers => "drop producers no longer needed (FifoRef)",
            Limit::Links => "close link ends no longer needed, or raise TeamBuilder::max_links",
            Limit::LinkBacklog => "accept the links waiting in the listener",
            Limit::CallsInFlight => {
                "wait for some sends or calls to be answered, or raise TeamBuilder::max_calls_in_flight"
            }
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Limit::Channels => "channels per team",
            Limit::Names => "names per team",
            Limit::OpenFiles => "open files",
            Limit::Endpoints => "endpoints opened by a team",
            Limit::RingBytes => "ring size a peer maps",
            Limit::BatchCalls => "calls in one RPC batch",
            Limit::Handshakes => "TCP handshakes at once from one address",
            Limit::Handovers => "calls awaiting descriptors on one channel",
            Limit::Regions => "regions exported by a team",
            Limit::ExportedBytes => "bytes exported by a team",
            Limit::ImportedRegions => "regions opened by a team",
            Limit::FifoProducers => "producers of one fifo",
            Limit::Links => "link ends held by a team",
            Limit::LinkBacklog => "links waiting in one listener",
            Limit::CallsInFlight => "sends and calls of a team waiting for their answer",
        })
    }
}

impl Error {
    /// Wraps an I/O error with what was being done: `.map_err(Error::io("bind socket"))`.
    /// Out of descriptors is [`Error::LimitReached`] with [`Limit::OpenFiles`].
    pub fn io(context: &'static str) -> impl FnOnce(io::Error) -> Error {
        move |source| match source.raw_os_error() {
            Some(libc::EMFILE) => Error::LimitReached { limit: Limit::OpenFiles, max: open_files_limit() },
            _ => Error::Io { context, source },
        }
    }
}

/// The process's open-file limit (its soft `RLIMIT_NOFILE`).
pub(crate) fn open_files_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(u64::MAX)
}

impl Error {
    /// For a handle bound to one team (a region's, a fifo's, a signal
    /// handler's), a team no longer found is that team gone: `PeerGone`,
    /// whichever the next send met first (the dead channel, or the route
    /// looked up again after it was reaped).
    pub(crate) fn gone_if_missing(self) -> Error {
        match self {
            Error::NoSuchTeam(peer) => Error::PeerGone { peer },
            e => e,
        }
    }

    /// The same error again, for each of several waiters on one outcome (a
    /// bind): I/O errors are not `Clone`, so one is remade from its kind and text.
    pub(crate) fn duplicate(&self) -> Error {
        match self {
            Error::PeerGone { peer } => Error::PeerGone { peer: *peer },
            Error::WouldBlock { to } => Error::WouldBlock { to: *to },
            Error::DeadlineExceeded => Error::DeadlineExceeded,
            Error::Cancelled => Error::Cancelled,
            Error::NoSuchEndpoint(e) => Error::NoSuchEndpoint(*e),
            Error::NoSuchTeam(t) => Error::NoSuchTeam(*t),
            Error::NameNotFound(n) => Error::NameNotFound(n.clone()),
            Error::NameTaken { name, owner } => Error::NameTaken { name: name.clone(), owner: *owner },
            Error::InvalidName(n) => Error::InvalidName(n.clone()),
            Error::TooLarge { len, max } => Error::TooLarge { len: *len, max: *max },
            Error::Codec(s) => Error::Codec(s.clone()),
            Error::Protocol { peer, violation } => Error::Protocol { peer: *peer, violation: violation.clone() },
            Error::Unauthenticated { peer, what } => Error::Unauthenticated { peer: *peer, what: what.clone() },
            Error::Tls { peer, what } => Error::Tls { peer: *peer, what: what.clone() },
            Error::LimitReached { limit, max } => Error::LimitReached { limit: *limit, max: *max },
            Error::Refused(r) => Error::Refused(r.clone()),
            Error::Panicked(s) => Error::Panicked(s.clone()),
            Error::InvalidSetting { setting, value, allowed } => {
                Error::InvalidSetting { setting, value: value.clone(), allowed: allowed.clone() }
            }
            Error::InvalidArgument(s) => Error::InvalidArgument(s.clone()),
            Error::Shutdown => Error::Shutdown,
            Error::KindTaken { kind } => Error::KindTaken { kind: *kind },
            Error::AccessDenied { region } => Error::AccessDenied { region: *region },
            Error::OutOfBounds { offset, len, region_len } => {
                Error::OutOfBounds { offset: *offset, len: *len, region_len: *region_len }
            }
            Error::Misaligned { offset } => Error::Misaligned { offset: *offset },
            Error::Revoked { region } => Error::Revoked { region: *region },
            Error::Closed { endpoint, why } => Error::Closed { endpoint: *endpoint, why },
            Error::Latched { handler } => Error::Latched { handler: *handler },
            Error::LinkClosed { link } => Error::LinkClosed { link: *link },
            Error::LinkMoved { link } => Error::LinkMoved { link: *link },
            Error::Io { context, source } => {
                Error::Io { context, source: io::Error::new(source.kind(), source.to_string()) }
            }
        }
    }
}

impl From<rustix::io::Errno> for Error {
    fn from(e: rustix::io::Errno) -> Self {
        Error::io("system call")(e.into())
    }
}
