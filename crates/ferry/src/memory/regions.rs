//! The owner's side: the regions a team exports, and the handler of remote
//! memory's frames, which opens them for importers of other processes and
//! serves the operations of importers on other machines.

use super::import::RegionRef;
use super::ops::{self, status, Op, Request};
use super::view::View;
use super::{mapped_len, path, Key, KINDS, MAX_REGION_BYTES, OP, OPEN, PAGE};
use crate::error::{Error, Limit, Result};
use crate::extend::{FrameHandler, PerTeam, ServedFrame};
use crate::id::{EndpointId, TeamId};
use crate::sys::shm::Mapping;
use crate::Team;
use parking_lot::Mutex;
use rustix::fd::AsFd;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// A region's memory: its bytes, and its control page (the epoch, which
/// importers map read-only).
pub(crate) struct RegionMemory {
    data: Mapping,
    control: Mapping,
    len: usize,
}

impl RegionMemory {
    /// The memory of region `name` at `epoch` (the memfds are named after
    /// it, as `/proc/<pid>/maps` and `fd/` show them).
    pub(crate) fn create(name: &str, len: usize, epoch: u64) -> Result<RegionMemory> {
        let data = Mapping::create(&format!("ferry-region:{name}"), mapped_len(len))?;
        // Sealed against writable mappings once ours is made: importers map it read-only.
        let control = Mapping::create_published(&format!("ferry-region-control:{name}"), PAGE)?;
        let memory = RegionMemory { data, control, len };
        memory.epoch_word().store(epoch, Ordering::Release);
        Ok(memory)
    }

    /// An importer's: the memfds the owner handed over, checked (sealed,
    /// of the size `len` maps to) and mapped.
    pub(super) fn open(len: usize, data: rustix::fd::OwnedFd, control: rustix::fd::OwnedFd) -> Result<RegionMemory> {
        let data = Mapping::open(data, mapped_len(len))?;
        let control = Mapping::open_read_only(control, PAGE)?;
        Ok(RegionMemory { data, control, len })
    }

    pub(super) fn view(&self) -> View {
        // SAFETY: `data` maps `mapped_len(len) >= len` bytes, page-aligned,
        // readable and writable, for as long as `self` lives; views are
        // used only while their `RegionMemory` is held (`RegionRef`).
        unsafe { View::new(self.data.as_ptr(), self.len) }
    }

    /// The epoch word (in the control page: the owner alone writes it).
    pub(super) fn epoch_word(&self) -> &AtomicU64 {
        // SAFETY: the control page is mapped (read-only for importers, who
        // only load), page-aligned, for as long as `self` lives.
        unsafe { AtomicU64::from_ptr(self.control.as_ptr().cast()) }
    }

    pub(super) fn epoch(&self) -> u64 {
        self.epoch_word().load(Ordering::Acquire)
    }

    /// Copies `old`'s bytes in (a revocation's move), only the pages that
    /// hold data: a large region written in few places stays small.
    fn copy_from(&self, old: &RegionMemory) {
        use rustix::fs::{seek, SeekFrom};
        let (from, to, end) = (old.view(), self.view(), self.len as u64);
        let mut at = 0u64;
        while at < end {
            // Where data starts and ends (a tmpfs file's holes are never
            // written pages); on any error, the rest is copied whole.
            let start = match seek(old.data.fd(), SeekFrom::Data(at)) {
                Ok(s) => s.min(end),
                Err(rustix::io::Errno::NXIO) => end,
                Err(_) => at,
            };
            let stop = seek(old.data.fd(), SeekFrom::Hole(start)).map_or(end, |s| s.min(end));
            let mut buf = vec![0u8; (stop - start).min(1 << 20) as usize];
            let mut p = start;
            while p < stop {
                let n = ((stop - p) as usize).min(buf.len());
                // In bounds of both (same length): cannot fail.
                let _ = from.get(p as usize, &mut buf[..n]);
                let _ = to.put(p as usize, &buf[..n]);
                p += n as u64;
            }
            at = stop.max(start + 1);
        }
    }
}

/// An exported region, as the table holds it.
struct Entry {
    key: Key,
    memory: Arc<RegionMemory>,
}

/// A team's remote-memory state: the regions it exports, how many it has
/// open as an importer, and the handler of its frames.
pub(super) struct Regions {
    table: Mutex<HashMap<u32, Entry>>,
    /// Bytes of the exported regions' mappings.
    exported: AtomicU64,
    /// Regions this team has open as an importer.
    imported: AtomicUsize,
    max_regions: usize,
    max_exported_bytes: u64,
    max_imported: usize,
}

/// Every team of this process that exports or imports regions: an
/// importer in the owner's process shares the owner's mapping instead of
/// opening its own.
static TEAMS: PerTeam<Regions> = PerTeam::new(KINDS);

impl Regions {
    /// `team`'s.
    pub fn of(team: &Team) -> Result<Arc<Regions>> {
        TEAMS.of(team, |team| {
            let cfg = team.config();
            Regions {
                table: Mutex::default(),
                exported: AtomicU64::new(0),
                imported: AtomicUsize::new(0),
                max_regions: cfg.max_regions,
                max_exported_bytes: cfg.max_exported_bytes,
                max_imported: cfg.max_imported_regions,
            }
        })
    }

    /// The regions a team of this process exports, if it does.
    pub fn in_this_process(team: TeamId) -> Option<Arc<Regions>> {
        TEAMS.find(team)
    }

    /// The memory of the region at `slot`, if `key` is its key; else why
    /// not (a [`status`], as an `OPEN` answer says it).
    pub fn find(&self, slot: u32, key: &[u8]) -> std::result::Result<Arc<RegionMemory>, u8> {
        match self.table.lock().get(&slot) {
            None => Err(status::NO_REGION),
            Some(e) if !e.key.matches(key) => Err(status::DENIED),
            Some(e) => Ok(e.memory.clone()),
        }
    }

    /// Counts one more region open as an importer, within the limit.
    pub fn import(self: &Arc<Regions>) -> Result<Imported> {
        let n = self.imported.fetch_add(1, Ordering::Relaxed);
        let held = Imported(self.clone());
        match n < self.max_imported {
            true => Ok(held),
            false => Err(Error::LimitReached { limit: Limit::ImportedRegions, max: self.max_imported as u64 }),
        }
    }

    /// Serves one operation of an importer on another machine: the answer.
    fn run(&self, slot: u32, req: Request<'_>) -> Vec<u8> {
        // The epoch first: a handle opened before a revocation or a
        // re-keying is told so, whichever key it has.
        let memory = match self.table.lock().get(&slot) {
            None => return vec![status::NO_REGION],
            Some(e) if e.memory.epoch() != req.epoch => return vec![status::REVOKED],
            Some(e) if !e.key.matches(req.key) => return vec![status::DENIED],
            Some(e) => e.memory.clone(),
        };
        serve_op(&memory, req)
    }
}

/// The answer to `req` on `memory` (its key and epoch checked).
pub(crate) fn serve_op(memory: &RegionMemory, req: Request<'_>) -> Vec<u8> {
    let view = memory.view();
    let at = usize::try_from(req.offset).unwrap_or(usize::MAX);
    let word = |r: Result<u64>| {
        r.map(|old| {
            let mut a = vec![status::OK];
            a.extend_from_slice(&old.to_le_bytes());
            a
        })
    };
    let read = |from: u64, len: u64| -> Result<Vec<u8>> {
        let (from, len) = (usize::try_from(from).unwrap_or(usize::MAX), len as usize);
        view.check(from, len)?;
        let mut a = vec![0u8; 1 + len];
        view.get(from, &mut a[1..])?;
        Ok(a)
    };
    let answer = match req.op {
        Op::Get { len } => read(req.offset, len),
        Op::Put(bytes) => view.put(at, bytes).map(|()| vec![status::OK]),
        Op::Swap(v) => word(view.swap(at, v)),
        Op::FetchAdd(v) => word(view.fetch_add(at, v)),
        Op::Cas { current, new } => word(view.compare_and_swap(at, current, new)),
        Op::Path { steps, len } => path::resolve(&view, req.offset, &steps).and_then(|at| read(at, len)),
    };
    answer.unwrap_or_else(|e| ops::error_answer(&e))
}

/// One region open as an importer (counted against the limit while held).
pub(super) struct Imported(Arc<Regions>);

impl Drop for Imported {
    fn drop(&mut self) {
        self.0.imported.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The error an `OPEN` status other than `OK` means.
pub(super) fn refusal(status: u8, region: EndpointId) -> Error {
    match status {
        status::DENIED => Error::AccessDenied { region },
        _ => Error::NoSuchEndpoint(region),
    }
}

impl FrameHandler for Regions {
    fn serve(&self, frame: ServedFrame<'_>) {
        match frame.kind() {
            OPEN => self.serve_open(frame),
            OP => {
                // Bounded work: a read answers at most MAX_SERVED_BYTES
                // (importers split larger ones), a path takes at most 64 steps.
                let answer = frame.with_payload(|bytes| ops::decode_request(bytes).map(|r| self.run(frame.slot(), r)));
                match answer {
                    Some(a) => {
                        // An unacknowledged put's sender waits for nothing: no answer goes.
                        let _ = frame.reply(&a);
                    }
                    None => frame.refuse("a remote-memory operation of no known form"),
                }
            }
            _ => frame.refuse("a remote-memory request this team does not serve"),
        }
    }
}

impl Regions {
    /// Opens a region: over shared memory its memfds go with the answer
    /// (the importer maps them); else the importer's operations will be
    /// served here.
    fn serve_open(&self, frame: ServedFrame<'_>) {
        let memory = match frame.with_payload(|key| self.find(frame.slot(), key)) {
            Ok(memory) => memory,
            Err(why) => {
                let _ = frame.reply(&[why]);
                return;
            }
        };
        let mut answer = [0u8; 17];
        answer[0] = status::OK;
        answer[1..9].copy_from_slice(&(memory.len as u64).to_le_bytes());
        answer[9..].copy_from_slice(&memory.epoch().to_le_bytes());
        if !frame.asks_for_descriptors() {
            let _ = frame.reply(&answer);
            return;
        }
        // Failed: the frame is dropped, and its sender told so (`NoReply`).
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
        if regions.table.lock().len() >= regions.max_regions {
            return Err(Error::LimitReached { limit: Limit::Regions, max: regions.max_regions as u64 });
        }
        let bytes = mapped_len(len) as u64;
        let fits = regions.exported.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            n.checked_add(bytes).filter(|&t| t <= regions.max_exported_bytes)
        });
        if fits.is_err() {
            return Err(Error::LimitReached { limit: Limit::ExportedBytes, max: regions.max_exported_bytes });
        }
        let made = self.reserve_endpoint().and_then(|id| {
            // The name first: it is checked there (its memfds are named after it).
            self.bind_name(name, id)?;
            match RegionMemory::create(name, len, 1) {
                Ok(m) => Ok((id, Arc::new(m))),
                Err(e) => {
                    self.unbind_name(name);
                    Err(e)
                }
            }
        });
        let (id, memory) = made.inspect_err(|_| {
            regions.exported.fetch_sub(bytes, Ordering::Relaxed);
        })?;
        regions.table.lock().insert(id.slot(), Entry { key, memory: memory.clone() });
        let handle = RegionRef::mapped(id, memory, None);
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

    /// Withdraws it from every importer that has it open: their operations
    /// fail `Revoked` from now on (they may open it again, with its key).
    ///
    /// On one machine an importer keeps the pages it mapped, so the region
    /// moves: its bytes are copied to a fresh segment (the pages written
    /// so far), which this handle and later importers use, and the old
    /// segment's epoch says it is revoked. An importer that ignores that
    /// (a hostile one, writing the old mapping directly) sees the bytes as
    /// they were when it was revoked, and nothing written after; what it
    /// writes there reaches no one. Writes made while the copy runs may
    /// or may not reach the new segment.
    pub fn revoke(&mut self) -> Result<()> {
        self.move_to(self.key)
    }

    /// [`Region::revoke`], and from now on the region opens only with `key`.
    pub fn rekey(&mut self, key: Key) -> Result<()> {
        self.move_to(key)
    }

    fn move_to(&mut self, key: Key) -> Result<()> {
        let old = self.handle.memory().expect("an owner's handle maps its region").clone();
        let epoch = old.epoch() + 1;
        let fresh = Arc::new(RegionMemory::create(&self.name, old.len, epoch)?);
        // 1. Importers stop (each operation checks the epoch first);
        old.epoch_word().store(epoch, Ordering::Release);
        // 2. the bytes move;
        fresh.copy_from(&old);
        // 3. openings and operations served from here find the fresh one.
        let id = self.handle.id();
        self.regions.table.lock().insert(id.slot(), Entry { key, memory: fresh.clone() });
        self.handle = RegionRef::mapped(id, fresh, None);
        self.key = key;
        Ok(())
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
        if let Some(e) = self.regions.table.lock().remove(&self.handle.id().slot()) {
            self.regions.exported.fetch_sub(mapped_len(e.memory.len) as u64, Ordering::Relaxed);
        }
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
        let memory = RegionMemory::create("test", 100, 1).unwrap();
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

    /// A revocation's move copies every byte written, across holes.
    #[test]
    fn a_move_copies_what_was_written() {
        let len = 64 * PAGE + 100;
        let old = RegionMemory::create("old", len, 1).unwrap();
        let marks = [0, 5, PAGE - 1, 3 * PAGE + 7, 40 * PAGE, len - 1];
        for (i, &at) in marks.iter().enumerate() {
            old.view().put(at, &[i as u8 + 1]).unwrap();
        }
        let fresh = RegionMemory::create("fresh", len, 2).unwrap();
        fresh.copy_from(&old);
        let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
        old.view().get(0, &mut a).unwrap();
        fresh.view().get(0, &mut b).unwrap();
        assert!(a == b, "the fresh segment differs");
        assert_eq!(b[len - 1], marks.len() as u8);
    }
}
