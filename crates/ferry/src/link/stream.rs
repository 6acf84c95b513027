//! One end's two directions, sans I/O: the numbers its frames carry, the
//! frames that came ahead of their turn, and the window each side grants.
//! (Kept apart from what does the sending, so that a model checker can
//! run it as it is: moving ends will add to it.)

use super::{Count, Window};
use std::collections::BTreeMap;

/// Most frames kept that came ahead of the next one due: a window of
/// messages, their answers and a few control frames.
fn most_early(window: Window) -> u64 {
    2 * u64::from(window.messages) + 8
}

pub(crate) struct Stream {
    /// What the peer lets this end send ahead (its window).
    pub window_out: Window,
    /// What this end lets the peer send ahead.
    pub window_in: Window,
    /// The number of the next frame this end sends.
    next_out: u64,
    /// Messages sent, and what the peer acknowledged consuming.
    sent: Count,
    granted: Count,
    /// The number of the next frame due from the peer.
    next_in: u64,
    /// Frames that came ahead of `next_in`, by number.
    early: BTreeMap<u64, Vec<u8>>,
    /// Messages taken in order, consumed by the user, and acknowledged.
    received: Count,
    consumed: Count,
    acked: Count,
}

/// A peer's frame that breaks the link's protocol.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Broken(pub String);

impl Stream {
    pub fn new(window_in: Window, window_out: Window) -> Stream {
        Stream {
            window_out,
            window_in,
            next_out: 0,
            sent: Count::default(),
            granted: Count::default(),
            next_in: 0,
            early: BTreeMap::new(),
            received: Count::default(),
            consumed: Count::default(),
            acked: Count::default(),
        }
    }

    /// Whether a message of `len` bytes fits the peer's window now (one
    /// larger than the window goes when nothing else is outstanding).
    pub fn may_send(&self, len: usize) -> bool {
        let messages = self.sent.messages - self.granted.messages;
        let bytes = self.sent.bytes - self.granted.bytes;
        messages < u64::from(self.window_out.messages)
            && (bytes == 0 || bytes.saturating_add(len as u64) <= u64::from(self.window_out.bytes))
    }

    /// Whether a message (or reply) of `len` bytes is one the peer takes
    /// at all: `TooLarge` if it is larger than its window's largest.
    pub fn fits(&self, len: usize) -> crate::error::Result<()> {
        let max = usize::try_from(self.window_out.largest).unwrap_or(usize::MAX);
        match len > max {
            true => Err(crate::error::Error::TooLarge { len, max }),
            false => Ok(()),
        }
    }

    /// Numbers a message of `len` bytes (`may_send` said yes).
    pub fn send_message(&mut self, len: usize) -> u64 {
        self.sent.messages += 1;
        self.sent.bytes += len as u64;
        self.next_frame()
    }

    /// Numbers a frame that is not a message.
    pub fn next_frame(&mut self) -> u64 {
        let seq = self.next_out;
        self.next_out += 1;
        seq
    }

    /// The acknowledgement a frame sent now carries (and so gives).
    pub fn ack(&mut self) -> Count {
        self.acked = self.consumed;
        self.consumed
    }

    /// Messages sent that the peer has not acknowledged consuming.
    pub fn unconfirmed(&self) -> u64 {
        self.sent.messages - self.granted.messages
    }

    /// A frame numbered `seq` came (its bytes `frame`): `true` if it is
    /// due now — the caller takes it (each with [`Stream::took_ack`] for
    /// its acknowledgement, [`Stream::received`] for a message), then
    /// every frame [`Stream::next_due`] gives; else a copy waits here for
    /// its turn.
    pub fn arrive(&mut self, seq: u64, frame: &[u8]) -> Result<bool, Broken> {
        if seq < self.next_in || self.early.contains_key(&seq) {
            return Err(Broken(format!("frame {seq} came twice")));
        }
        if seq - self.next_in >= most_early(self.window_in) {
            return Err(Broken(format!("frame {seq} came when {} was due", self.next_in)));
        }
        if seq == self.next_in {
            // In order (the common case): taken at once, kept nowhere.
            self.next_in += 1;
            return Ok(true);
        }
        self.early.insert(seq, frame.to_vec());
        Ok(false)
    }

    /// The common case of [`Stream::arrive`], [`Stream::took_ack`],
    /// [`Stream::received`] and [`Stream::consumed`] in one step, for a
    /// message its receiver takes at once: taken if the frame `seq` is
    /// the one due with none early (so that nothing comes due after it),
    /// `ack` is one those would take and a message of `len` bytes is
    /// within the window; then whether to acknowledge now (see
    /// `consumed`). `None`, and nothing changed, otherwise: the caller
    /// takes the frame step by step, which says what is wrong with it.
    #[inline(always)]
    pub fn take_at_once(&mut self, seq: u64, ack: Option<Count>, len: usize, peer_waits: bool) -> Option<bool> {
        // A bare message acknowledges nothing: the grant stays.
        let ack = ack.unwrap_or(self.granted);
        let fits = seq == self.next_in
            && self.early.is_empty()
            && ack.messages >= self.granted.messages
            && ack.bytes >= self.granted.bytes
            && ack.messages <= self.sent.messages
            && ack.bytes <= self.sent.bytes
            && len as u64 <= self.window_in.largest
            && self.window_in.messages >= 1
            && self.received == self.consumed;
        if !fits {
            return None;
        }
        self.next_in += 1;
        self.granted = ack;
        let got = Count { messages: self.received.messages + 1, bytes: self.received.bytes + len as u64 };
        (self.received, self.consumed) = (got, got);
        Some(peer_waits || self.owes_half())
    }

    /// Its numbers, in words (`Team::link_diagnostics`).
    pub fn describe(&self) -> String {
        let early: Vec<u64> = self.early.keys().copied().take(4).collect();
        format!(
            "next out {}, next in {}, {} came early (first {early:?}), sent {:?}, granted {:?}, received {:?}",
            self.next_out,
            self.next_in,
            self.early.len(),
            self.sent,
            self.granted,
            self.received
        )
    }

    /// A frame that came ahead of its turn and is due now.
    pub fn next_due(&mut self) -> Option<Vec<u8>> {
        if self.early.is_empty() {
            return None; // (The common case, without a call into the map.)
        }
        let frame = self.early.remove(&self.next_in)?;
        self.next_in += 1;
        Some(frame)
    }

    /// A message or reply of `len` bytes from the peer: no larger than
    /// this end lets it send?
    pub fn within_largest(&self, len: usize) -> Result<(), Broken> {
        match len as u64 > self.window_in.largest {
            true => {
                Err(Broken(format!("a message of {len} bytes, past the largest granted ({})", self.window_in.largest)))
            }
            false => Ok(()),
        }
    }

    /// A due frame's acknowledgement: what the peer consumed of ours (a
    /// bare message carries none).
    pub fn took_ack(&mut self, ack: Option<Count>) -> Result<(), Broken> {
        let Some(ack) = ack else { return Ok(()) };
        if ack.messages < self.granted.messages || ack.bytes < self.granted.bytes {
            return Err(Broken("an acknowledgement went back".into()));
        }
        if ack.messages > self.sent.messages || ack.bytes > self.sent.bytes {
            return Err(Broken("an acknowledgement of messages never sent".into()));
        }
        self.granted = ack;
        Ok(())
    }

    /// A due message of `len` bytes, queued for the user: within the window granted?
    pub fn received(&mut self, len: usize) -> Result<(), Broken> {
        self.within_largest(len)?;
        self.received.messages += 1;
        self.received.bytes += len as u64;
        let messages = self.received.messages - self.consumed.messages;
        let bytes = self.received.bytes - self.consumed.bytes;
        if messages > u64::from(self.window_in.messages) || (messages > 1 && bytes > u64::from(self.window_in.bytes)) {
            return Err(Broken(format!("{messages} messages ({bytes} bytes) sent past the window granted")));
        }
        Ok(())
    }

    /// The user took a message of `len` bytes. Whether to acknowledge now
    /// with a frame of its own: half the window consumed since the last
    /// acknowledgement, or (`peer_waits`: it probed) anything. (Any frame
    /// sent the other way acknowledges too, so a request and its reply
    /// need no frame of their own.)
    pub fn consumed(&mut self, len: usize, peer_waits: bool) -> bool {
        self.consumed.messages += 1;
        self.consumed.bytes += len as u64;
        peer_waits || self.owes_half()
    }

    /// Whether half the window was consumed since the last acknowledgement.
    fn owes_half(&self) -> bool {
        self.consumed.messages - self.acked.messages >= u64::from(self.window_in.messages / 2).max(1)
            || self.consumed.bytes - self.acked.bytes >= u64::from(self.window_in.bytes / 2)
    }

    /// Whether something consumed is not acknowledged yet.
    pub fn owes_ack(&self) -> bool {
        self.consumed != self.acked
    }
}

impl Stream {
    /// Its bytes, as it travels with a moving end (`wire::Carried`).
    pub fn encode(&self, out: &mut Vec<u8>) {
        for w in [self.window_out, self.window_in] {
            out.extend_from_slice(&super::wire::encode_window(w));
        }
        for n in [self.next_out, self.next_in] {
            out.extend_from_slice(&n.to_le_bytes());
        }
        for c in [self.sent, self.granted, self.received, self.consumed, self.acked] {
            out.extend_from_slice(&c.messages.to_le_bytes());
            out.extend_from_slice(&c.bytes.to_le_bytes());
        }
        out.extend_from_slice(&(self.early.len() as u32).to_le_bytes());
        for (seq, f) in &self.early {
            out.extend_from_slice(&seq.to_le_bytes());
            out.extend_from_slice(&(f.len() as u32).to_le_bytes());
            out.extend_from_slice(f);
        }
    }

    /// The stream `r` holds; `None` unless its counts are ones a stream
    /// could have (nothing granted or consumed past what was sent or
    /// received, early frames after the one due and within bounds).
    pub fn decode(r: &mut super::wire::Reader<'_>) -> Option<Stream> {
        let mut window = || Some(Window { messages: r.u32()?, bytes: r.u32()?, largest: r.u64()? });
        let (window_out, window_in) = (window()?, window()?);
        if [window_out, window_in].iter().any(|w| w.messages == 0 || w.bytes == 0) {
            return None;
        }
        let (next_out, next_in) = (r.u64()?, r.u64()?);
        let mut count = || Some(Count { messages: r.u64()?, bytes: r.u64()? });
        let (sent, granted, received, consumed, acked) = (count()?, count()?, count()?, count()?, count()?);
        let le = |a: Count, b: Count| a.messages <= b.messages && a.bytes <= b.bytes;
        if !(le(granted, sent) && le(acked, consumed) && le(consumed, received)) {
            return None;
        }
        let n = u64::from(r.u32()?);
        if n > most_early(window_in) {
            return None;
        }
        let mut early = BTreeMap::new();
        for _ in 0..n {
            let seq = r.u64()?;
            let len = r.u32()? as usize;
            if seq <= next_in || early.insert(seq, r.bytes(len)?.to_vec()).is_some() {
                return None;
            }
        }
        Some(Stream { window_out, window_in, next_out, sent, granted, next_in, early, received, consumed, acked })
    }

    /// Messages received that the user has not consumed.
    pub fn unconsumed(&self) -> u64 {
        self.received.messages - self.consumed.messages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: Window = Window { messages: 4, bytes: 100, largest: 1000 };

    #[test]
    fn frames_are_taken_in_order_and_duplicates_break_the_link() {
        let mut s = Stream::new(W, W);
        assert_eq!(s.arrive(1, b"b"), Ok(false), "kept for its turn");
        assert_eq!(s.next_due(), None);
        assert_eq!(s.arrive(0, b"a"), Ok(true), "due at once");
        assert_eq!(s.next_due(), Some(b"b".to_vec()), "its turn came");
        assert_eq!(s.next_due(), None);
        assert_eq!(s.arrive(2, b"c"), Ok(true));
        assert!(s.arrive(1, b"b").is_err());
        assert!(s.arrive(3 + most_early(W), b"far").is_err());
    }

    #[test]
    fn the_window_holds_the_sender_and_binds_the_peer() {
        let mut s = Stream::new(W, W);
        for _ in 0..4 {
            assert!(s.may_send(10));
            s.send_message(10);
        }
        assert!(!s.may_send(10), "past four messages");
        s.took_ack(Some(Count { messages: 2, bytes: 20 })).unwrap();
        assert!(s.may_send(10));
        assert!(s.took_ack(Some(Count { messages: 1, bytes: 10 })).is_err(), "acknowledgements only grow");
        assert!(s.took_ack(Some(Count { messages: 9, bytes: 90 })).is_err(), "nor pass what was sent");
        // A message larger than the window goes alone.
        let mut s = Stream::new(W, W);
        assert!(s.may_send(500));
        s.send_message(500);
        assert!(!s.may_send(1));
        // A peer past the window breaks the link.
        let mut s = Stream::new(W, W);
        s.received(500).unwrap();
        assert!(s.received(1).is_err());
    }

    /// No message larger than the window's largest: refused to its
    /// sender (`TooLarge`), and a peer that sends one breaks the link.
    #[test]
    fn the_largest_message_binds_both_ways() {
        let mut s = Stream::new(W, W);
        assert!(s.fits(1000).is_ok());
        assert!(matches!(s.fits(1001), Err(crate::Error::TooLarge { len: 1001, max: 1000 })));
        assert!(s.within_largest(1000).is_ok());
        assert!(s.received(1001).is_err(), "a message past the largest was taken");
    }

    #[test]
    fn consuming_acknowledges_at_half_the_window_or_when_the_peer_waits() {
        let mut s = Stream::new(W, W);
        s.received(1).unwrap();
        s.received(1).unwrap();
        s.received(1).unwrap();
        assert!(!s.consumed(1, false));
        assert!(s.consumed(1, false), "half of four messages");
        assert_eq!(s.ack(), Count { messages: 2, bytes: 2 });
        assert!(!s.owes_ack());
        assert!(s.consumed(1, true), "the peer waits");
        assert!(s.owes_ack());
    }
}
