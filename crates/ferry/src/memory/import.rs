//! The importer's side: opening a region, and the operations on it.

use super::regions::{refusal, status, RegionMemory, Regions};
use super::view::View;
use super::{Key, MAX_REGION_BYTES, OPEN};
use crate::error::{Error, Refusal, Result};
use crate::extend::PeerLiveness;
use crate::id::EndpointId;
use crate::Team;
use std::sync::Arc;

/// How long opening a region of another process waits for its owner's answer.
pub const OPEN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// An opened region (see [`crate::memory`]): every operation is checked
/// against its bounds, then made on its memory directly.
pub struct RegionRef {
    id: EndpointId,
    view: View,
    /// The owner's liveness, for a region of another process: once it is
    /// gone, operations fail `PeerGone` rather than touch orphaned memory.
    owner: Option<PeerLiveness>,
    /// Keeps `view`'s memory mapped.
    _memory: Arc<RegionMemory>,
}

impl Team {
    /// Opens the region exported under `name` with `key`.
    pub fn open_region(&self, name: &str, key: Key) -> Result<RegionRef> {
        let id = self.lookup(name)?;
        self.open_region_at(id, key)
    }

    /// Opens the region `region` with `key`: `AccessDenied` if the key is
    /// not its key, `NoSuchEndpoint` if its team exports no such region,
    /// `DeadlineExceeded` if its owner did not answer within
    /// [`OPEN_TIMEOUT`] (a team with no processor answers only while one of
    /// its threads waits in a ferry call).
    pub fn open_region_at(&self, region: EndpointId, key: Key) -> Result<RegionRef> {
        // The owner is in this process: its mapping is shared as it is.
        if let Some(regions) = Regions::in_this_process(region.team_id()) {
            let memory = regions.find(region.slot(), &key.to_bytes()).map_err(|s| refusal(s, region))?;
            return Ok(RegionRef::shared(region, memory));
        }
        if region.node() != self.id().node {
            return Err(Error::InvalidArgument(format!(
                "region {region} is on another node: regions are opened on their own machine only (for now)"
            )));
        }
        // Bounded: an owner none of whose threads drains its channels (no
        // processor, its threads all in user code) never answers.
        let sender = self.frame_sender(region, OPEN)?.with_timeout(OPEN_TIMEOUT);
        let (answer, fds) = match sender.call_for_descriptors(&key.to_bytes()) {
            Ok(got) => got,
            // The team exports no region at all.
            Err(Error::Refused(Refusal::NotServed { .. })) => return Err(Error::NoSuchEndpoint(region)),
            Err(e) => return Err(e),
        };
        let bad = |what: &str| Error::Protocol {
            peer: region.team_id(),
            violation: crate::Violation::BadRegionAnswer(what.to_string()),
        };
        let len = match parse_open_answer(&answer) {
            Ok(len) => len,
            Err(Ok(status)) => return Err(refusal(status, region)),
            Err(Err(what)) => return Err(bad(what)),
        };
        let [data, control]: [_; 2] = fds.try_into().map_err(|_| bad("not its two memfds"))?;
        let mut opened = RegionRef::shared(region, Arc::new(RegionMemory::open(len, data, control)?));
        opened.owner = sender.peer_liveness();
        Ok(opened)
    }
}

/// An `OPEN` answer (a peer's bytes): the region's length if it opened;
/// else the status that refused it, or what is wrong with the answer.
pub(crate) fn parse_open_answer(answer: &[u8]) -> std::result::Result<usize, std::result::Result<u8, &'static str>> {
    match answer.first() {
        Some(&status::OPENED) if answer.len() == 17 => {}
        Some(&s @ (status::NO_REGION | status::DENIED)) => return Err(Ok(s)),
        _ => return Err(Err("an answer of no known form")),
    }
    let len = u64::from_le_bytes(answer[1..9].try_into().expect("8 bytes"));
    usize::try_from(len).ok().filter(|l| (1..=MAX_REGION_BYTES).contains(l)).ok_or(Err("its length"))
}

impl RegionRef {
    pub(super) fn shared(id: EndpointId, memory: Arc<RegionMemory>) -> RegionRef {
        RegionRef { id, view: memory.view(), owner: None, _memory: memory }
    }

    /// The view, while the owner lives.
    #[inline]
    fn live(&self) -> Result<&View> {
        if let Some(owner) = &self.owner {
            owner.check()?;
        }
        Ok(&self.view)
    }

    /// The region's id.
    pub fn id(&self) -> EndpointId {
        self.id
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.view.len()
    }

    /// Whether it is empty (never: a region has at least one byte).
    pub fn is_empty(&self) -> bool {
        self.view.len() == 0
    }

    /// Writes `bytes` at `offset`.
    pub fn put(&self, offset: usize, bytes: &[u8]) -> Result<()> {
        self.live()?.put(offset, bytes)
    }

    /// Writes each `(offset, bytes)` in order (all checked first: none is
    /// written if one is out of bounds).
    pub fn put_vectored(&self, parts: &[(usize, &[u8])]) -> Result<()> {
        let view = self.live()?;
        parts.iter().try_for_each(|(offset, bytes)| view.check(*offset, bytes.len()))?;
        parts.iter().try_for_each(|(offset, bytes)| view.put(*offset, bytes))
    }

    /// Reads `out.len()` bytes at `offset` into `out`.
    pub fn get(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        self.live()?.get(offset, out)
    }

    /// Reads `len` bytes at `offset`.
    pub fn get_vec(&self, offset: usize, len: usize) -> Result<Vec<u8>> {
        // Checked before the vector is made: a huge `len` allocates nothing.
        let view = self.live()?;
        view.check(offset, len)?;
        let mut out = vec![0u8; len];
        view.get(offset, &mut out)?;
        Ok(out)
    }

    /// Reads into each `(offset, out)` in order (all checked first).
    pub fn get_vectored(&self, parts: &mut [(usize, &mut [u8])]) -> Result<()> {
        let view = self.live()?;
        parts.iter().try_for_each(|(offset, out)| view.check(*offset, out.len()))?;
        parts.iter_mut().try_for_each(|(offset, out)| view.get(*offset, out))
    }

    /// The `u64` word at `offset` (a multiple of 8).
    pub fn load(&self, offset: usize) -> Result<u64> {
        self.live()?.load(offset)
    }

    /// Sets the word at `offset` to `value`; returns what it was.
    pub fn swap(&self, offset: usize, value: u64) -> Result<u64> {
        self.live()?.swap(offset, value)
    }

    /// Adds `value` to the word at `offset` (wrapping); returns what it was.
    pub fn fetch_add(&self, offset: usize, value: u64) -> Result<u64> {
        self.live()?.fetch_add(offset, value)
    }

    /// Sets the word at `offset` to `new` if it is `current`; returns what
    /// it was (`current` if it was set).
    pub fn compare_and_swap(&self, offset: usize, current: u64, new: u64) -> Result<u64> {
        self.live()?.compare_and_swap(offset, current, new)
    }
}
