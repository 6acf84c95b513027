//! The owner's side: the regions a team exports, and the handler of remote
//! memory's frames, which opens them for importers of other processes.

use super::import::RegionRef;
use super::view::View;
use super::{mapped_len, Key, KINDS, MAX_REGIONS, MAX_REGION_BYTES, OPEN, PAGE};
use crate::error::{Error, Limit, Result};
use crate::extend::{FrameHandler, ServedFrame, ServedKinds};
use crate::id::{EndpointId, TeamId};
use crate::sys::shm::Mapping;
use crate::Team;
use parking_lot::Mutex;
use rustix::fd::AsFd;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};

/// What an `OPEN` answer's first byte says.
pub(super) mod status {
    pub const OPENED: u8 = 0;
    pub const NO_REGION: u8 = 1;
    pub const DENIED: u8 = 2;
}

/// A region's memory: its bytes, and its control page (the epoch, which
/// importers map read-only).
pub(super) struct RegionMemory {
    data: Mapping,
    control: Mapping,
    len: usize,
}

impl RegionMemory {
    /// The memory of region `name` (the memfds are named after it, as
    /// `/proc/<pid>/maps` and `fd/` show them).
    fn create(name: &str, len: usize) -> Result<RegionMemory> {
        let data = Mapping::create(&format!("ferry-region:{name}"), mapped_len(len))?;
        // Sealed against writable mappings once ours is made: importers map it read-only.
        let control = Mapping::create_published(&format!("ferry-region-control:{name}"), PAGE)?;
        let memory = RegionMemory { data, control, len };
        memory.epoch_word().store(1, Ordering::Release);
        Ok(memory)
    }

    /// An importer's: the memfds the owner handed over, checked (sealed,
    /// of the size `len` maps to) and mapped.
    pub fn open(len: usize, data: rustix::fd::OwnedFd, control: rustix::fd::OwnedFd) -> Result<RegionMemory> {
        let data = Mapping::open(data, mapped_len(len))?;
        let control = Mapping::open_read_only(control, PAGE)?;
        Ok(RegionMemory { data, control, len })
    }

    pub fn view(&self) -> View {
        // SAFETY: `data` maps `mapped_len(len) >= len` bytes, page-aligned,
        // readable and writable, for as long as `self` lives; views are
        // used only while their `RegionMemory` is held (`RegionRef`).
        unsafe { View::new(self.data.as_ptr(), self.len) }
    }

    fn epoch_word(&self) -> &AtomicU64 {
        // SAFETY: the control page is mapped (read-only for importers, who
        // only load), page-aligned, for as long as `self` lives.
        unsafe { AtomicU64::from_ptr(self.control.as_ptr().cast()) }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch_word().load(Ordering::Acquire)
    }
}

/// The regions a team exports: remote memory's own state, and the handler
/// of its frames.
pub(super) struct Regions {
    table: Mutex<HashMap<u32, (Key, Arc<RegionMemory>)>>,
    /// Keeps the handler registered while the team lives.
    serving: Mutex<Option<ServedKinds>>,
}

/// Every team of this process that exports regions: an importer in the
/// owner's process shares the owner's mapping instead of opening its own.
static EXPORTERS: LazyLock<Mutex<HashMap<TeamId, Weak<Regions>>>> = LazyLock::new(Default::default);

impl Regions {
    /// The regions `team` exports (registered as its handler on first use).
    fn of(team: &Team) -> Result<Arc<Regions>> {
        let mut exporters = EXPORTERS.lock();
        if let Some(r) = exporters.get(&team.id()).and_then(Weak::upgrade) {
            return Ok(r);
        }
        exporters.retain(|_, r| r.strong_count() > 0);
        let regions = Arc::new(Regions { table: Mutex::default(), serving: Mutex::default() });
        *regions.serving.lock() = Some(team.serve_frames(KINDS, regions.clone())?);
        exporters.insert(team.id(), Arc::downgrade(&regions));
        Ok(regions)
    }

    /// The regions a team of this process exports, if it does.
    pub fn in_this_process(team: TeamId) -> Option<Arc<Regions>> {
        EXPORTERS.lock().get(&team).and_then(Weak::upgrade)
    }

    /// The memory of the region at `slot`, if `key` is its key; else why
    /// not (a [`status`], as an `OPEN` answer says it).
    pub fn find(&self, slot: u32, key: &[u8]) -> std::result::Result<Arc<RegionMemory>, u8> {
        match self.table.lock().get(&slot) {
            None => Err(status::NO_REGION),
            Some((k, _)) if !k.matches(key) => Err(status::DENIED),
            Some((_, memory)) => Ok(memory.clone()),
        }
    }
}

/// The error an `OPEN` status other than `OPENED` means.
pub(super) fn refusal(status: u8, region: EndpointId) -> Error {
    match status {
        status::DENIED => Error::AccessDenied { region },
        _ => Error::NoSuchEndpoint(region),
    }
}

impl FrameHandler for Regions {
    fn serve(&self, frame: ServedFrame<'_>) {
        if frame.kind() != OPEN {
            return frame.refuse("a remote-memory request this team does not serve");
        }
        let memory = match frame.with_payload(|key| self.find(frame.slot(), key)) {
            Ok(memory) => memory,
            Err(why) => {
                let _ = frame.reply(&[why]);
                return;
            }
        };
        let mut answer = [0u8; 17];
        answer[0] = status::OPENED;
        answer[1..9].copy_from_slice(&(memory.len as u64).to_le_bytes());
        answer[9..].copy_from_slice(&memory.epoch().to_le_bytes());
        // Refused (the sender did not ask: another node) or failed: the
        // frame is dropped, and its sender told so (`NoReply`).
        let fds = [memory.data.fd().as_fd(), memory.control.fd().as_fd()];
        if let Err(e) = frame.reply_with_descriptors(&answer, &fds) {
            tracing::debug!(error = %e, "a region could not be handed over");
        }
    }
}

/// A region this team exports (see [`crate::memory`]). It derefs to a
/// [`RegionRef`]: the owner reads and writes it as importers do. Dropping
/// it withdraws the region: its name is unbound and no importer can open
/// it any more (those that did keep their mapping until they drop it).
pub struct Region {
    team: Team,
    name: String,
    key: Key,
    regions: Arc<Regions>,
    handle: RegionRef,
}

impl Team {
    /// Exports a region of `len` bytes (zeroed) under `name`, with a random key.
    pub fn export(&self, name: &str, len: usize) -> Result<Region> {
        self.export_with_key(name, len, Key::random())
    }

    /// Exports a region of `len` bytes (zeroed) under `name` and `key`.
    pub fn export_with_key(&self, name: &str, len: usize, key: Key) -> Result<Region> {
        if len == 0 || len > MAX_REGION_BYTES {
            return Err(Error::InvalidArgument(format!("a region of {len} bytes (1 to {MAX_REGION_BYTES} bytes)")));
        }
        let regions = Regions::of(self)?;
        if regions.table.lock().len() >= MAX_REGIONS {
            return Err(Error::LimitReached { limit: Limit::Regions, max: MAX_REGIONS as u64 });
        }
        let id = self.reserve_endpoint()?;
        // The name first: it is checked there (its memfds are named after it).
        self.bind_name(name, id)?;
        let memory = match RegionMemory::create(name, len) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                self.unbind_name(name);
                return Err(e);
            }
        };
        regions.table.lock().insert(id.slot(), (key, memory.clone()));
        let handle = RegionRef::shared(id, memory);
        Ok(Region { team: self.clone(), name: name.to_string(), key, regions, handle })
    }
}

impl Region {
    /// Its key: what an importer opens it with.
    pub fn key(&self) -> Key {
        self.key
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl std::ops::Deref for Region {
    type Target = RegionRef;
    fn deref(&self) -> &RegionRef {
        &self.handle
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.team.unbind_name(&self.name);
        self.regions.table.lock().remove(&self.handle.id().slot());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::mm::{mmap, MapFlags, ProtFlags};

    /// A hostile importer holding the control page's memfd cannot map it
    /// writable (the epoch is the owner's alone), nor shrink the data
    /// (which would fault every other process's accesses).
    #[test]
    fn an_importer_can_neither_write_the_control_page_nor_shrink_the_data() {
        let memory = RegionMemory::create("test", 100).unwrap();
        let control = rustix::io::dup(memory.control.fd()).unwrap();
        // SAFETY: a fresh mapping at an address the kernel picks; unmapped if made.
        let writable = unsafe {
            mmap(std::ptr::null_mut(), PAGE, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &control, 0)
        };
        assert!(writable.is_err(), "the control page was mapped writable");
        assert!(rustix::io::write(&control, b"x").is_err());
        assert!(RegionMemory::open(100, rustix::io::dup(memory.data.fd()).unwrap(), control).is_ok());
        assert!(rustix::fs::ftruncate(memory.data.fd(), 0).is_err());
        assert_eq!(memory.epoch(), 1);
    }
}
