//! The importer's side: opening a region, and the operations on it — on
//! its memory directly (one machine), or served by its owner (across
//! machines).

use super::ops::{self, status, Op, Request};
use super::path::{self, Step, MAX_PATH_STEPS};
use super::regions::{refusal, Imported, Region, RegionMemory, Regions};
use super::view::{self, View};
use super::{Key, MAX_REGION_BYTES, MAX_SERVED_BYTES, OP, OPEN};
use crate::error::{Error, Result};
use crate::extend::PeerLiveness;
use crate::id::EndpointId;
use crate::port::RawSender;
use crate::runtime::Delivery;
use crate::wire::Checkpoint;
use crate::Team;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};

/// How long opening a region of another process waits for its owner's answer.
pub const OPEN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long an operation served by a region's owner (across machines)
/// waits for its answer, unless [`RegionRef::with_timeout`] says otherwise:
/// an owner that never drains its channels (no processor, its threads in
/// user code) makes it fail `DeadlineExceeded`, not hang.
pub const OPERATION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The value an ack flag gets when its write failed
/// ([`RegionRef::put_flagged`]).
pub const FLAG_FAILED: u64 = u64::MAX;

/// An opened region (see [`crate::memory`]): every operation is checked
/// against its bounds, then made on its memory directly (one machine) or
/// by its owner's runtime (across machines).
pub struct RegionRef {
    id: EndpointId,
    len: usize,
    /// The epoch it was opened at: a revocation moves the region's on.
    epoch: u64,
    place: Place,
    /// Counts it against this team's `max_imported_regions` (an owner's own handle: none).
    _imported: Option<Imported>,
}

enum Place {
    /// Mapped in this process: operations are loads, stores and atomics.
    Mapped {
        view: View,
        /// The owner's liveness, for a region of another process: once it
        /// is gone, operations fail `PeerGone` rather than touch orphaned memory.
        owner: Option<PeerLiveness>,
        /// Keeps `view`'s memory mapped; its control page has the epoch.
        memory: Arc<RegionMemory>,
    },
    /// On another machine: operations are served frames to its owner.
    Served { sender: RawSender, key: Key },
}

impl Team {
    /// Opens the region exported under `name` with `key`.
    pub fn open_region(&self, name: &str, key: Key) -> Result<RegionRef> {
        let id = self.lookup(name)?;
        self.open_region_at(id, key)
    }

    /// Opens the region `region` with `key`: `AccessDenied` if the key is
    /// not its key, `NoSuchEndpoint` if its team exports no such region,
    /// `LimitReached` past [`TeamBuilder::max_imported_regions`](crate::TeamBuilder::max_imported_regions),
    /// `DeadlineExceeded` if its owner did not answer within
    /// [`OPEN_TIMEOUT`] (a team with no processor answers only while one of
    /// its threads waits in a ferry call).
    pub fn open_region_at(&self, region: EndpointId, key: Key) -> Result<RegionRef> {
        let imported = Regions::of(self)?.import()?;
        let mut opened = self.open_uncounted(region, key)?;
        opened._imported = Some(imported);
        Ok(opened)
    }

    fn open_uncounted(&self, region: EndpointId, key: Key) -> Result<RegionRef> {
        // The owner is in this process (and node: a node is a machine,
        // even two of a test's in one process): its mapping is shared as it is.
        let on_this_machine = region.node() == self.id().node;
        if let Some(regions) = Regions::in_this_process(region.team_id()).filter(|_| on_this_machine) {
            let memory = regions.find(region.slot(), &key.to_bytes()).map_err(|s| refusal(s, region))?;
            return Ok(RegionRef::mapped(region, memory, None));
        }
        // Bounded: an owner none of whose threads drains its channels (no
        // processor, its threads all in user code) never answers.
        let opening = self.open_at_owner(region, OPEN, &key.to_bytes(), OPEN_TIMEOUT)?;
        let bad = |what: &str| Error::Protocol {
            peer: region.team_id(),
            violation: crate::Violation::BadRegionAnswer(what.to_string()),
        };
        let (len, epoch) = match parse_open_answer(&opening.answer) {
            Ok(opened) => opened,
            Err(Ok(status)) => return Err(refusal(status, region)),
            Err(Err(what)) => return Err(bad(what)),
        };
        if !on_this_machine {
            let sender = self.frame_sender(region, OP)?.with_timeout(OPERATION_TIMEOUT);
            let place = Place::Served { sender, key };
            return Ok(RegionRef { id: region, len, epoch, place, _imported: None });
        }
        let [data, control]: [_; 2] = opening.descriptors.try_into().map_err(|_| bad("not its two memfds"))?;
        let memory = Arc::new(RegionMemory::open(len, data, control)?);
        if memory.epoch() != epoch {
            return Err(Error::Revoked { region });
        }
        Ok(RegionRef::mapped(region, memory, opening.owner))
    }
}

/// An `OPEN` answer (a peer's bytes): the region's length and epoch if it
/// opened; else the status that refused it, or what is wrong with the answer.
pub(crate) fn parse_open_answer(
    answer: &[u8],
) -> std::result::Result<(usize, u64), std::result::Result<u8, &'static str>> {
    match answer.first() {
        Some(&status::OK) if answer.len() == 17 => {}
        Some(&s @ (status::NO_REGION | status::DENIED)) if answer.len() == 1 => return Err(Ok(s)),
        _ => return Err(Err("an answer of no known form")),
    }
    let word = |at: usize| u64::from_le_bytes(answer[at..at + 8].try_into().expect("8 bytes"));
    let len = usize::try_from(word(1)).ok().filter(|l| (1..=MAX_REGION_BYTES).contains(l)).ok_or(Err("its length"))?;
    Ok((len, word(9)))
}

impl RegionRef {
    pub(super) fn mapped(id: EndpointId, memory: Arc<RegionMemory>, owner: Option<PeerLiveness>) -> RegionRef {
        let (len, epoch) = (memory.view().len(), memory.epoch());
        RegionRef { id, len, epoch, place: Place::Mapped { view: memory.view(), owner, memory }, _imported: None }
    }

    /// Its memory, if it is mapped here.
    pub(super) fn memory(&self) -> Option<&Arc<RegionMemory>> {
        match &self.place {
            Place::Mapped { memory, .. } => Some(memory),
            Place::Served { .. } => None,
        }
    }

    /// The view of a mapped region (`None`: served), while its owner lives
    /// and has not revoked it: each operation's first step.
    #[inline]
    fn mapped_view(&self) -> Result<Option<&View>> {
        let Place::Mapped { view, owner, memory } = &self.place else { return Ok(None) };
        if let Some(owner) = owner {
            owner.check()?;
        }
        if memory.epoch_word().load(Ordering::Acquire) != self.epoch {
            return Err(Error::Revoked { region: self.id });
        }
        Ok(Some(view))
    }

    /// Runs `op` at `offset` at the owner; `read` takes the answer's bytes.
    fn served<R>(&self, offset: usize, op: Op<'_>, read: impl FnOnce(&[u8]) -> Result<R>) -> Result<R> {
        let Place::Served { sender, key, .. } = &self.place else { unreachable!("served() of a mapped region") };
        let answer = sender.call(&self.request(key, offset, op)).map_err(Error::gone_if_missing)?;
        read(ops::parse_answer(&answer, self.id, self.len as u64)?)
    }

    fn request(&self, key: &Key, offset: usize, op: Op<'_>) -> Vec<u8> {
        Request { key: &key.to_bytes(), epoch: self.epoch, offset: offset as u64, op }.encode()
    }

    /// An atomic's answer: the old value.
    fn served_word(&self, offset: usize, op: Op<'_>) -> Result<u64> {
        view::check_word(self.len, offset)?;
        self.served(offset, op, |b| b.try_into().map(u64::from_le_bytes).map_err(|_| self.bad_answer()))
    }

    fn bad_answer(&self) -> Error {
        Error::Protocol {
            peer: self.id.team_id(),
            violation: crate::Violation::BadRegionAnswer("an answer of the wrong length".into()),
        }
    }

    /// The region's id.
    pub fn id(&self) -> EndpointId {
        self.id
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is empty (never: a region has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The same handle, whose operations served by the owner (across
    /// machines) wait at most `limit` for their answer (default
    /// [`OPERATION_TIMEOUT`]; `Duration::MAX`: no limit). Mapped
    /// operations never wait.
    pub fn with_timeout(mut self, limit: std::time::Duration) -> RegionRef {
        if let Place::Served { sender, .. } = &mut self.place {
            *sender = sender.clone().with_timeout(limit);
        }
        self
    }

    /// Whether it is mapped in this process (its operations are this
    /// thread's own loads, stores and atomics), rather than served by its
    /// owner on another machine.
    pub fn is_mapped(&self) -> bool {
        matches!(self.place, Place::Mapped { .. })
    }

    /// Writes `bytes` at `offset`; done when it returns (across machines,
    /// when the owner answered: a round trip).
    pub fn put(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        match self.mapped_view()? {
            Some(view) => view.put(offset, bytes),
            None => {
                view::check(self.len, offset, bytes.len())?;
                bytes
                    .chunks(MAX_SERVED_BYTES)
                    .enumerate()
                    .try_for_each(|(i, part)| self.served(offset + i * MAX_SERVED_BYTES, Op::Put(part), |_| Ok(())))
            }
        }
    }

    /// Writes `bytes` at `offset` without waiting for it to be done (no
    /// acknowledgement). On one machine it is done when this returns, as a
    /// `put`. Across machines it goes out in order with this handle's other
    /// operations (a `get` after it sees it), as at most 1 MiB; a full
    /// channel is `WouldBlock`; an error at the owner (the region revoked
    /// meanwhile) reaches no one — `put` or [`RegionRef::put_flagged`]
    /// report it.
    pub fn put_unacked(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        let Place::Served { sender, key, .. } = &self.place else { return self.put(offset, bytes) };
        view::check(self.len, offset, bytes.len())?;
        if bytes.len() > MAX_SERVED_BYTES {
            return Err(Error::TooLarge { len: bytes.len(), max: MAX_SERVED_BYTES });
        }
        sender
            .send(&self.request(key, offset, Op::Put(bytes)), Checkpoint::Immediate)
            .map(drop)
            .map_err(Error::gone_if_missing)
    }

    /// Writes `bytes` at `offset`; the future resolves when it is done
    /// (at once on one machine; across machines when the owner answers,
    /// at most 1 MiB). It needs no task of its own: the team's threads
    /// complete it.
    pub fn put_async(&self, offset: usize, bytes: &[u8]) -> PutDone {
        let ready = |r| PutDone(Done::Ready(Some(r)));
        let Place::Served { sender, key, .. } = &self.place else { return ready(self.put(offset, bytes)) };
        if let Err(e) = view::check(self.len, offset, bytes.len()) {
            return ready(Err(e));
        }
        if bytes.len() > MAX_SERVED_BYTES {
            return ready(Err(Error::TooLarge { len: bytes.len(), max: MAX_SERVED_BYTES }));
        }
        let delivery = sender.send_async(&self.request(key, offset, Op::Put(bytes)), Checkpoint::OnReturn);
        PutDone(Done::Served { delivery, region: self.id, len: self.len as u64 })
    }

    /// Writes `bytes` at `offset`, and when it is done stores `value` in
    /// the word at `flag_offset` of `flag`, a region of the writer's own
    /// (MBCF's acknowledgement flag): the writer learns that its write is
    /// done by loading its own memory. [`FLAG_FAILED`] is stored instead
    /// if the write failed. On one machine the write and the flag are done
    /// when this returns; across machines the team's runtime stores the
    /// flag when the owner's answer comes (a `processors(0)` team: while
    /// one of its threads is in a ferry call). Errors found before the
    /// write starts (bounds, the flag's word) are returned, and no flag is
    /// stored.
    pub fn put_flagged(
        &self,
        offset: usize,
        bytes: &[u8],
        flag: &Region,
        flag_offset: usize,
        value: u64,
    ) -> Result<()> {
        let flag_memory = flag.memory().expect("an owner's handle maps its region").clone();
        view::check_word(flag.len(), flag_offset)?;
        let store = move |r: Result<()>| {
            let v = if r.is_ok() { value } else { FLAG_FAILED };
            // In bounds and aligned (checked above), mapped while `flag_memory` is held.
            let _ = flag_memory.view().swap(flag_offset, v);
        };
        match &self.place {
            Place::Served { sender, .. } => {
                view::check(self.len, offset, bytes.len())?;
                let done = self.put_async(offset, bytes);
                // Detached: it ends with the answer, or the team.
                drop(sender.spawn(async move { store(done.await) }));
            }
            Place::Mapped { .. } => {
                self.put(offset, bytes)?;
                // SeqCst: a process that sees the flag sees the bytes.
                store(Ok(()));
            }
        }
        Ok(())
    }

    /// Writes each `(offset, bytes)` in order (all checked first: none is
    /// written if one is out of bounds). Across machines, one round trip each.
    pub fn put_vectored(&self, parts: &[(usize, &[u8])]) -> Result<()> {
        parts.iter().try_for_each(|(offset, bytes)| view::check(self.len, *offset, bytes.len()))?;
        parts.iter().try_for_each(|(offset, bytes)| self.put(*offset, bytes))
    }

    /// Reads `out.len()` bytes at `offset` into `out`.
    pub fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        match self.mapped_view()? {
            Some(view) => view.get(offset, out),
            None => {
                view::check(self.len, offset, out.len())?;
                out.chunks_mut(MAX_SERVED_BYTES).enumerate().try_for_each(|(i, part)| {
                    let op = Op::Get { len: part.len() as u64 };
                    self.served(offset + i * MAX_SERVED_BYTES, op, |b| self.fill(part, b))
                })
            }
        }
    }

    /// Copies an answer's bytes into `out`, which they must fill exactly.
    fn fill(&self, out: &mut [u8], answer: &[u8]) -> Result<()> {
        if answer.len() != out.len() {
            return Err(self.bad_answer());
        }
        out.copy_from_slice(answer);
        Ok(())
    }

    /// Reads `len` bytes at `offset`.
    pub fn get_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        // Checked before the vector is made: a huge `len` allocates nothing.
        view::check(self.len, offset, len)?;
        let mut out = vec![0u8; len];
        self.get(offset, &mut out)?;
        Ok(out)
    }

    /// Reads into each `(offset, out)` in order (all checked first).
    /// Across machines, one round trip each.
    pub fn get_vectored(&self, parts: &mut [(usize, &mut [u8])]) -> Result<()> {
        parts.iter().try_for_each(|(offset, out)| view::check(self.len, *offset, out.len()))?;
        parts.iter_mut().try_for_each(|(offset, out)| self.get(*offset, out))
    }

    /// Reads `out.len()` bytes where `steps` lead from `offset` (StarMod's
    /// qualified references): e.g. `[Index { index: 3, size: 16 },
    /// Field(8), Indirect]` reads through the pointer in field 8 of element
    /// 3 of the array at `offset`. Every step is checked (`OutOfBounds`,
    /// `Misaligned` name the step's offset); at most [`MAX_PATH_STEPS`].
    /// One round trip across machines (at most 1 MiB), none on one machine.
    pub fn get_path(&self, offset: usize, steps: &[Step], out: &mut [u8]) -> Result<()> {
        match self.mapped_view()? {
            Some(view) => {
                let at = path::resolve(view, offset as u64, steps)?;
                view.get(at as usize, out)
            }
            None => {
                if steps.len() > MAX_PATH_STEPS || out.len() > MAX_SERVED_BYTES {
                    return Err(Error::InvalidArgument(format!(
                        "a path read of {} steps and {} bytes (at most {MAX_PATH_STEPS} and {MAX_SERVED_BYTES})",
                        steps.len(),
                        out.len()
                    )));
                }
                let op = Op::Path { steps: steps.to_vec(), len: out.len() as u64 };
                self.served(offset, op, |b| self.fill(out, b))
            }
        }
    }

    /// The `u64` word at `offset` (a multiple of 8).
    pub fn load(&self, offset: usize) -> Result<u64> {
        match self.mapped_view()? {
            Some(view) => view.load(offset),
            // An atomic read at the owner.
            None => self.served_word(offset, Op::FetchAdd(0)),
        }
    }

    /// Sets the word at `offset` to `value`; returns what it was.
    pub fn swap(&self, offset: usize, value: u64) -> Result<u64> {
        match self.mapped_view()? {
            Some(view) => view.swap(offset, value),
            None => self.served_word(offset, Op::Swap(value)),
        }
    }

    /// Adds `value` to the word at `offset` (wrapping); returns what it was.
    pub fn fetch_add(&self, offset: usize, value: u64) -> Result<u64> {
        match self.mapped_view()? {
            Some(view) => view.fetch_add(offset, value),
            None => self.served_word(offset, Op::FetchAdd(value)),
        }
    }

    /// Sets the word at `offset` to `new` if it is `current`; returns what
    /// it was (`current` if it was set).
    pub fn compare_and_swap(&self, offset: usize, current: u64, new: u64) -> Result<u64> {
        match self.mapped_view()? {
            Some(view) => view.compare_and_swap(offset, current, new),
            None => self.served_word(offset, Op::Cas { current, new }),
        }
    }
}

/// A `put` under way ([`RegionRef::put_async`]): resolves when it is done.
pub struct PutDone(Done);

enum Done {
    Ready(Option<Result<()>>),
    Served { delivery: Delivery, region: EndpointId, len: u64 },
}

impl Future for PutDone {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<()>> {
        match &mut self.get_mut().0 {
            Done::Ready(r) => Poll::Ready(r.take().unwrap_or(Err(Error::Cancelled))),
            Done::Served { delivery, region, len } => {
                Pin::new(delivery).poll(cx).map(|answer| ops::parse_answer(&answer?, *region, *len).map(drop))
            }
        }
    }
}
