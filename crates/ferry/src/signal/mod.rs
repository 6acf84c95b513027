// The module's documentation is docs/SIGNAL.md: its example runs as a doc test.
#![doc = include_str!("../../../../docs/SIGNAL.md")]

pub(crate) mod handlers;

pub use handlers::{Signal, SignalAnswer, Signaller};

/// When a signal runs its handler (MBCF's MBSignal "frequency").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every signal runs the handler, as many at once as signals come, up
    /// to [`MAX_PENDING`] (MBCF's Every Time NonBlock).
    EveryTime,
    /// One run at a time: the arguments of signals that come while it runs
    /// wait in a fifo (at most [`MAX_PENDING`]) that the running handler's
    /// task drains, in order (MBCF's First Only NonBlock).
    Coalesce,
    /// Runs once, then refuses signals (`Latched`) until its owner re-arms
    /// it ([`Signal::rearm`]; MBCF's Every Time Block).
    Latch,
}

/// Arguments a handler holds at most — a `Coalesce` handler's waiting
/// while it runs, an `EveryTime` handler's being run: past it a signal is
/// refused (`WouldBlock`).
pub const MAX_PENDING: usize = 1024;

/// Bytes of the arguments a handler holds at most (as [`MAX_PENDING`]
/// counts them; one argument more if it holds none): past it a signal is
/// refused (`WouldBlock`).
pub const MAX_PENDING_BYTES: usize = 64 << 20;

/// The served frame kinds of signals (`crate::extend`): 80 SIGNAL (answered
/// once the signal is accepted), 81 SIGNAL_DONE (answered once its handler
/// ran); `dst` the handler's slot, the payload the arguments, the answer
/// one status byte.
const KINDS: std::ops::RangeInclusive<u8> = 80..=87;
const SIGNAL: u8 = 80;
const SIGNAL_DONE: u8 = 81;

/// An answer's status byte.
mod status {
    pub const OK: u8 = 0;
    pub const NO_HANDLER: u8 = 1;
    pub const LATCHED: u8 = 2;
    pub const FULL: u8 = 3;
}
