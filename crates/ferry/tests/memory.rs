//! Remote memory (`ferry::memory`): regions exported by one team, opened
//! by another in every placement (the same team, two teams of one process
//! sharing the owner's mapping, two processes mapping the memfd the owner
//! handed over, two nodes — in namespaces, and on loopback in this process —
//! whose owner serves the operations), with keys, bounds, atomics, paths,
//! acknowledgements and revocation; many importer processes at once.

mod common;

use common::pair::{pair, Placement, Side};
use common::{Child, ROLE};
use ferry::memory::{Key, Step, MAX_PATH_STEPS};
use ferry::{Error, Limit, Team};
use std::time::Duration;

const LEN: usize = 10_000;

/// The tests of this file run one at a time: some count this process's
/// descriptors and mappings, which another test's teams would change.
static ONE_AT_A_TIME: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

/// Puts, gets and atomics of an importer reach the owner's memory, and the
/// owner's its; the owner's only processor is blocked meanwhile (no task
/// of the owner serves an access: on one machine the importer maps the
/// region, across machines the owner's runtime serves it).
fn a_region_is_shared_in_every_placement(p: Placement) {
    let _one = ONE_AT_A_TIME.lock();
    pair(p).config_a(|b| b.processors(1)).run(
        |a: &Side| {
            let region = a.team.export("shared", LEN).unwrap();
            region.put(0, b"from the owner").unwrap();
            a.put("key", region.key());
            a.put("id", region.id());
            a.get::<String>("opened");
            // Every task of the owner blocks while the importer works.
            let stuck = a.team.spawn(async { std::thread::sleep(Duration::from_millis(500)) });
            a.put("blocked", "");
            a.get::<String>("done");
            a.team.block_on(stuck).unwrap();
            assert_eq!(region.get_vec(5000, 14).unwrap(), b"from the other");
            assert_eq!(region.load(8000).unwrap(), 1000);
            assert_eq!(region.load(8008).unwrap(), 2);
        },
        |b: &Side| {
            let key: Key = b.get("key");
            let id: ferry::EndpointId = b.get("id");
            let r = b.team.open_region("shared", key).unwrap();
            assert_eq!((r.len(), r.id()), (LEN, id));
            assert_eq!(r.is_mapped(), !p.two_nodes());
            assert_eq!(b.team.open_region_at(id, key).unwrap().len(), LEN);
            b.put("opened", "");
            b.get::<String>("blocked");
            assert_eq!(r.get_vec(0, 14).unwrap(), b"from the owner");
            r.put(5000, b"from the other").unwrap();
            for _ in 0..1000 {
                r.fetch_add(8000, 1).unwrap();
            }
            assert_eq!(r.compare_and_swap(8008, 0, 1).unwrap(), 0);
            assert_eq!(r.compare_and_swap(8008, 0, 5).unwrap(), 1, "not swapped");
            assert_eq!(r.swap(8008, 2).unwrap(), 1);
            let mut parts = [(5000, &mut [0u8; 4][..]), (0, &mut [0u8; 4][..])];
            r.get_vectored(&mut parts).unwrap();
            assert_eq!((&*parts[0].1, &*parts[1].1), (&b"from"[..], &b"from"[..]));
            b.put("done", "");
        },
    );
}

/// Hostile and mistaken accesses fail with typed errors and touch nothing.
fn mistakes_are_typed_errors(p: Placement) {
    let _one = ONE_AT_A_TIME.lock();
    pair(p).run(
        |a: &Side| {
            let region = a.team.export("guarded", LEN).unwrap();
            a.put("key", region.key());
            a.get::<String>("done");
            assert_eq!(region.get_vec(0, LEN).unwrap(), vec![0u8; LEN], "nothing was written");
        },
        |b: &Side| {
            let key: Key = b.get("key");
            let wrong = Key::from_bytes([7; 16]);
            assert!(matches!(b.team.open_region("guarded", wrong), Err(Error::AccessDenied { .. })));
            assert!(matches!(b.team.open_region("no-such-region", key), Err(Error::NameNotFound(_))));
            if !p.two_nodes() {
                assert!(matches!(b.team.export("guarded", 8), Err(Error::NameTaken { .. })), "one name space");
            }
            assert!(matches!(b.team.export("bad name!", 8), Err(Error::InvalidName(_))));
            assert!(matches!(b.team.export("empty", 0), Err(Error::InvalidArgument(_))));
            let r = b.team.open_region("guarded", key).unwrap();
            // A slot of the owner's team that is no region.
            let other = r.id().team_id().endpoint(r.id().slot() + 1000).unwrap();
            assert!(matches!(b.team.open_region_at(other, key), Err(Error::NoSuchEndpoint(_))));
            assert!(matches!(r.put(LEN - 1, b"xy"), Err(Error::OutOfBounds { .. })));
            assert!(matches!(r.put(usize::MAX, b"x"), Err(Error::OutOfBounds { .. })));
            assert!(matches!(r.get_vec(1, usize::MAX), Err(Error::OutOfBounds { .. })));
            assert!(matches!(r.fetch_add(4, 1), Err(Error::Misaligned { offset: 4 })));
            assert!(matches!(r.swap(LEN - 4, 1), Err(Error::Misaligned { .. })));
            assert!(matches!(r.compare_and_swap(10_000, 0, 1), Err(Error::OutOfBounds { .. })));
            assert!(matches!(r.put_unacked(LEN, b"x"), Err(Error::OutOfBounds { .. })));
            let parts = [(0, &b"ok"[..]), (LEN, &b"no"[..])];
            assert!(matches!(r.put_vectored(&parts), Err(Error::OutOfBounds { .. })));
            // Paths: out of the region at a step, a misaligned pointer, a
            // cycle (ends with the path), a path too long.
            let mut out = [0u8; 8];
            assert!(matches!(r.get_path(0, &[Step::Field(LEN as u64 + 1)], &mut out), Err(Error::OutOfBounds { .. })));
            assert!(matches!(r.get_path(4, &[Step::Indirect], &mut out), Err(Error::Misaligned { offset: 4 })));
            let cycle = [Step::Indirect; MAX_PATH_STEPS];
            r.get_path(0, &cycle, &mut out).unwrap(); // word 0 is 0: a pointer to itself
            let too_long = [Step::Indirect; MAX_PATH_STEPS + 1];
            assert!(matches!(r.get_path(0, &too_long, &mut out), Err(Error::InvalidArgument(_))));
            let far = Step::Index { index: u64::MAX, size: 8 };
            assert!(matches!(r.get_path(0, &[far], &mut out), Err(Error::OutOfBounds { .. })));
            b.put("done", "");
        },
    );
}

/// Path reads (StarMod's qualified references) and the acknowledgement
/// modes: a put whose completion is a future, one without acknowledgement
/// (a get after it sees it), one whose acknowledgement is a flag in the
/// writer's own region (MBCF).
fn paths_and_acknowledgements(p: Placement) {
    let _one = ONE_AT_A_TIME.lock();
    pair(p).run(
        |a: &Side| {
            // A table of 4 records of 16 bytes at 64: [value u64, next u64
            // (an offset)]; record i's value is 100 + i, its next record i + 1.
            let region = a.team.export("records", 4096).unwrap();
            for i in 0..4u64 {
                let at = 64 + 16 * i as usize;
                region.put(at, &(100 + i).to_le_bytes()).unwrap();
                region.put(at + 8, &(64 + 16 * (i + 1)).to_le_bytes()).unwrap();
            }
            a.put("key", region.key());
            a.get::<String>("done");
            assert_eq!(region.get_vec(1000, 5).unwrap(), b"async");
            assert_eq!(region.get_vec(2000, 7).unwrap(), b"unacked");
            assert_eq!(region.get_vec(3000, 7).unwrap(), b"flagged");
        },
        |b: &Side| {
            let key: Key = b.get("key");
            let r = b.team.open_region("records", key).unwrap();
            let mut out = [0u8; 8];
            // Record 1's next pointer, then the value of the record it points to (2).
            let path = [Step::Index { index: 1, size: 16 }, Step::Field(8), Step::Indirect];
            r.get_path(64, &path, &mut out).unwrap();
            assert_eq!(u64::from_le_bytes(out), 102);
            b.team.block_on(r.put_async(1000, b"async")).unwrap();
            assert!(matches!(b.team.block_on(r.put_async(4095, b"xy")), Err(Error::OutOfBounds { .. })));
            r.put_unacked(2000, b"unacked").unwrap();
            assert_eq!(r.get_vec(2000, 7).unwrap(), b"unacked", "a get after a put sees it");
            let flags = b.team.export("flags", 64).unwrap();
            r.put_flagged(3000, b"flagged", &flags, 8, 7).unwrap();
            let flagged = || flags.load(8).unwrap() == 7;
            assert!(common::eventually(Duration::from_secs(5), flagged), "the flag was not set");
            assert!(matches!(r.put_flagged(0, b"x", &flags, 4, 1), Err(Error::Misaligned { .. })));
            b.put("done", "");
        },
    );
}

/// The owner revokes a region, then re-keys it: importers' operations fail
/// `Revoked`; opened again (with the new key after re-keying) they see
/// what the region held; the old key opens it no more.
fn revocation_and_rekeying(p: Placement) {
    let _one = ONE_AT_A_TIME.lock();
    pair(p).run(
        |a: &Side| {
            let mut region = a.team.export("revocable", 3 * 4096).unwrap();
            region.put(5000, b"kept").unwrap();
            a.put("key", region.key());
            a.get::<String>("opened");
            region.revoke().unwrap();
            assert_eq!(region.get_vec(5000, 4).unwrap(), b"kept", "the owner's handle moved with it");
            a.put("revoked", "");
            a.get::<String>("reopened");
            let new = Key::random();
            region.rekey(new).unwrap();
            a.put("new-key", new);
            a.get::<String>("done");
            assert_eq!(region.get_vec(6000, 5).unwrap(), b"after");
        },
        |b: &Side| {
            let key: Key = b.get("key");
            let r = b.team.open_region("revocable", key).unwrap();
            b.put("opened", "");
            b.get::<String>("revoked");
            assert!(matches!(r.get_vec(5000, 4), Err(Error::Revoked { .. })));
            assert!(matches!(r.fetch_add(0, 1), Err(Error::Revoked { .. })));
            assert!(matches!(r.put(0, b"x"), Err(Error::Revoked { .. })));
            let r = b.team.open_region("revocable", key).unwrap();
            assert_eq!(r.get_vec(5000, 4).unwrap(), b"kept");
            b.put("reopened", "");
            let new: Key = b.get("new-key");
            assert!(matches!(r.load(0), Err(Error::Revoked { .. })));
            assert!(matches!(b.team.open_region("revocable", key), Err(Error::AccessDenied { .. })));
            let r = b.team.open_region("revocable", new).unwrap();
            r.put(6000, b"after").unwrap();
            b.put("done", "");
        },
    );
}

/// Across machines an operation whose owner drains nothing (its one
/// processor stuck in user code, no replacement allowed) fails
/// `DeadlineExceeded` at the handle's deadline, not hangs; the handle works
/// again once the owner does. (On one machine nothing waits.)
fn a_served_operation_has_a_deadline(p: Placement) {
    let _one = ONE_AT_A_TIME.lock();
    if !p.two_nodes() {
        return;
    }
    pair(p).config_a(|b| b.processors(1).max_replacements(0)).run(
        |a: &Side| {
            let region = a.team.export("slow", 64).unwrap();
            a.put("key", region.key());
            a.get::<String>("opened");
            let stuck = a.team.spawn(async { std::thread::sleep(Duration::from_millis(1500)) });
            std::thread::sleep(Duration::from_millis(50));
            a.put("stuck", "");
            // Not in a ferry call meanwhile: a thread waiting in one would serve.
            std::thread::sleep(Duration::from_millis(1500));
            a.team.block_on(stuck).unwrap();
            a.get::<String>("done");
        },
        |b: &Side| {
            let key: Key = b.get("key");
            let r = b.team.open_region("slow", key).unwrap().with_timeout(Duration::from_millis(200));
            r.put(0, b"x").unwrap();
            b.put("opened", "");
            b.get::<String>("stuck");
            let t0 = std::time::Instant::now();
            assert!(matches!(r.get_vec(0, 1), Err(Error::DeadlineExceeded)));
            assert!(t0.elapsed() < Duration::from_secs(1), "waited {:?}", t0.elapsed());
            assert!(common::eventually(Duration::from_secs(5), || r.get_vec(0, 1).is_ok_and(|v| v == b"x")));
            b.put("done", "");
        },
    );
}

loopback_placements!(
    a_served_operation_has_a_deadline,
    a_region_is_shared_in_every_placement,
    mistakes_are_typed_errors,
    paths_and_acknowledgements,
    revocation_and_rekeying
);

/// The limits of `TeamBuilder`: regions exported, bytes exported, regions
/// opened; each a typed error, and what is dropped makes room again.
#[test]
fn limits_are_typed_errors() {
    let _one = ONE_AT_A_TIME.lock();
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder()
        .runtime_dir(dir.path())
        .max_regions(2)
        .max_exported_bytes(3 * 4096)
        .max_imported_regions(1)
        .start()
        .unwrap();
    let limited =
        |r: ferry::Result<_>, which: Limit| matches!(r, Err(Error::LimitReached { limit, .. }) if limit == which);
    let a = team.export("a", 4097).unwrap(); // two pages
    assert!(limited(team.export("b", 4097).map(drop), Limit::ExportedBytes));
    let b = team.export("b", 10).unwrap();
    assert!(limited(team.export("c", 10).map(drop), Limit::Regions));
    drop(a);
    let _c = team.export("c", 10).unwrap();
    let opened = team.open_region("b", b.key()).unwrap();
    assert!(limited(team.open_region("b", b.key()).map(drop), Limit::ImportedRegions));
    drop(opened);
    team.open_region("b", b.key()).unwrap();
    for bad in
        [Team::builder().max_regions(0), Team::builder().max_exported_bytes(1), Team::builder().max_imported_regions(0)]
    {
        assert!(matches!(bad.start(), Err(Error::InvalidSetting { .. })));
    }
}

/// 8 importer processes × 100,000 `fetch_add` on one word: the exact total.
#[test]
fn eight_processes_count_exactly() {
    let _one = ONE_AT_A_TIME.lock();
    let dir = tempfile::tempdir().unwrap();
    let owner = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let region = owner.export("counter", 64).unwrap();
    let key = region.key();
    let mut children: Vec<Child> = (0..8).map(|_| Child::spawn_with_key("count", dir.path(), &key)).collect();
    for c in &mut children {
        c.expect("counted", Duration::from_secs(60));
    }
    assert_eq!(region.load(0).unwrap(), 800_000);
}

/// Hostile accesses by one importer process — a wrong key, accesses out of
/// bounds, misaligned and with overflowing offsets, a path with a cycle,
/// and through the descriptors it was handed: the region's control page
/// mapped (or its mapping made) writable, written, the data shrunk — fail
/// cleanly in that process and hurt no other: an importer counting in
/// another process meanwhile counts exactly, and the epoch stays.
#[test]
fn a_hostile_importer_hurts_no_other() {
    let _one = ONE_AT_A_TIME.lock();
    let dir = tempfile::tempdir().unwrap();
    let owner = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let region = owner.export("counter", 64).unwrap();
    // Word 8 points to itself: the hostile importer's path cycles there.
    region.put(8, &8u64.to_le_bytes()).unwrap();
    let mut hostile = Child::spawn_with_key("hostile", dir.path(), &region.key());
    let mut honest = Child::spawn_with_key("count", dir.path(), &region.key());
    hostile.expect("refused", Duration::from_secs(60));
    honest.expect("counted", Duration::from_secs(60));
    assert_eq!(region.load(0).unwrap(), 100_000, "the honest importer's count");
    assert_eq!(region.load(8).unwrap(), 8);
    assert_eq!(region.get_vec(16, 48).unwrap(), vec![0u8; 48], "nothing else was written");
}

/// The owner's death: the importer's operations fail `PeerGone` within a
/// bounded time — in a team with no processor, where only its reactor
/// learns it — and once the importer drops its handle, nothing of the
/// region is left in its process (no mapping, no descriptor).
#[test]
fn an_importer_learns_its_owners_death_and_keeps_nothing() {
    let _one = ONE_AT_A_TIME.lock();
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).processors(0).start().unwrap();
    let mut owner = Child::spawn("owner", dir.path());
    let key: Key = owner.expect("key", Duration::from_secs(10)).parse().unwrap();
    let region_files = || {
        let fds = std::fs::read_dir("/proc/self/fd").unwrap().filter_map(|f| std::fs::read_link(f.ok()?.path()).ok());
        let ours = |s: &str| s.contains("ferry-region:owned") || s.contains("ferry-region-control:owned");
        let maps = common::shared_mappings().into_iter().filter(|m| ours(m)).count();
        fds.filter(|l| ours(&l.to_string_lossy())).count() + maps
    };
    let r = team.open_region("owned", key).unwrap();
    assert_eq!(r.fetch_add(0, 1).unwrap(), 0);
    assert!(region_files() > 0, "mapped while open");
    owner.kill();
    let t0 = std::time::Instant::now();
    assert!(
        common::eventually(Duration::from_secs(5), || matches!(r.fetch_add(0, 1), Err(Error::PeerGone { .. }))),
        "operations on a dead owner's region went on"
    );
    eprintln!("learnt the owner's death in {:?}", t0.elapsed());
    assert!(matches!(r.get_vec(0, 8), Err(Error::PeerGone { .. })));
    drop(r);
    assert_eq!(region_files(), 0, "the region's memfds or mappings stayed");
}

/// An importer's death leaves its owner whole: the region works on, and
/// once the dead importer's channel is reclaimed the owner holds no
/// descriptor or mapping more than before it came.
#[test]
fn a_killed_importer_leaves_its_owner_whole() {
    let _one = ONE_AT_A_TIME.lock();
    let dir = tempfile::tempdir().unwrap();
    let owner = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let region = owner.export("counter", 64).unwrap();
    // Its processor's first sleep makes that thread's epoll set (kept for
    // the thread's life): counted before, not as the importer's.
    std::thread::sleep(Duration::from_millis(300));
    let before = (common::fd_count(), common::shared_mappings().len());
    let mut importer = Child::spawn_with_key("count", dir.path(), &region.key());
    importer.expect("counted", Duration::from_secs(60));
    // Killed and reaped, its pipes closed: what is left is the runtime's.
    drop(importer);
    assert_eq!(region.fetch_add(0, 1).unwrap(), 100_000);
    let whole = || (common::fd_count(), common::shared_mappings().len()) == before;
    assert!(
        common::eventually(Duration::from_secs(10), whole),
        "left behind: {:?} then {:?}",
        before,
        (common::fd_count(), common::shared_mappings().len())
    );
}

/// A lock-free stack (Treiber's, the head word tagged against ABA) of
/// node indices in one region, popped and pushed by 4 processes at once
/// through `compare_and_swap`: at the end it holds every node once.
#[test]
fn a_lock_free_stack_shared_by_four_processes_stays_whole() {
    let _one = ONE_AT_A_TIME.lock();
    let dir = tempfile::tempdir().unwrap();
    let owner = Team::builder().runtime_dir(dir.path()).start().unwrap();
    let region = owner.export("stack", stack::LEN).unwrap();
    for node in 0..stack::NODES {
        stack::push(&region, node);
    }
    let key = region.key();
    let mut children: Vec<Child> = (0..4).map(|_| Child::spawn_with_key("stack", dir.path(), &key)).collect();
    for c in &mut children {
        c.expect("churned", Duration::from_secs(60));
    }
    let mut seen = vec![false; stack::NODES as usize];
    while let Some(node) = stack::pop(&region) {
        assert!(!std::mem::replace(&mut seen[node as usize], true), "node {node} twice");
    }
    assert!(seen.iter().all(|s| *s), "nodes lost");
}

/// Treiber's stack in a region: word 0 the head (tag << 32 | node + 1,
/// 0 empty), then each node's next (node + 1, 0 none).
mod stack {
    use ferry::memory::RegionRef;

    pub const NODES: u64 = 256;
    pub const LEN: usize = 8 + 8 * NODES as usize;

    fn next_of(node: u64) -> usize {
        8 + 8 * node as usize
    }

    pub fn push(r: &RegionRef, node: u64) {
        loop {
            let head = r.load(0).unwrap();
            r.swap(next_of(node), head & 0xffff_ffff).unwrap();
            let new = ((head >> 32) + 1) << 32 | (node + 1);
            if r.compare_and_swap(0, head, new).unwrap() == head {
                return;
            }
        }
    }

    pub fn pop(r: &RegionRef) -> Option<u64> {
        loop {
            let head = r.load(0).unwrap();
            let top = head & 0xffff_ffff;
            if top == 0 {
                return None;
            }
            let next = r.load(next_of(top - 1)).unwrap();
            let new = ((head >> 32) + 1) << 32 | next;
            if r.compare_and_swap(0, head, new).unwrap() == head {
                return Some(top - 1);
            }
        }
    }
}

/// What a hostile importer does with the descriptors of a region it was
/// handed (found as `/proc/self/fd` and `maps` name them).
mod hostile {
    use rustix::fd::BorrowedFd;
    use rustix::mm::{mmap, mprotect, MapFlags, MprotectFlags, ProtFlags};

    const PAGE: usize = 4096;

    /// This process's descriptor of the memfd named `name`.
    fn fd_named(name: &str) -> BorrowedFd<'static> {
        for entry in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
            let to = std::fs::read_link(entry.path()).unwrap_or_default();
            if to.to_string_lossy().starts_with(&format!("/memfd:{name} ")) {
                let fd: i32 = entry.file_name().to_string_lossy().parse().unwrap();
                // SAFETY: an open descriptor of this process, which the
                // runtime keeps open while the region is.
                return unsafe { BorrowedFd::borrow_raw(fd) };
            }
        }
        panic!("no descriptor of {name}");
    }

    /// Every write to region `region`'s control page, and shrinking its data, fails.
    pub fn attack_the_descriptors(region: &str) {
        let control = fd_named(&format!("ferry-region-control:{region}"));
        let data = fd_named(&format!("ferry-region:{region}"));
        // SAFETY: a fresh mapping at an address the kernel picks (none is made).
        let writable = unsafe {
            mmap(std::ptr::null_mut(), PAGE, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, control, 0)
        };
        assert!(writable.is_err(), "the control page was mapped writable");
        assert!(rustix::io::write(control, b"epoch").is_err(), "the control page was written");
        assert!(rustix::fs::ftruncate(data, 0).is_err(), "the data was shrunk");
        // The runtime's own (read-only) mapping of the control page cannot be made writable.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let line = maps.lines().find(|l| l.contains(&format!("ferry-region-control:{region}"))).unwrap();
        let start = usize::from_str_radix(line.split('-').next().unwrap(), 16).unwrap();
        // SAFETY: only the protection of an existing mapping is asked to
        // change; refused, nothing changes (and nothing is written).
        let r = unsafe { mprotect(start as *mut _, PAGE, MprotectFlags::READ | MprotectFlags::WRITE) };
        assert!(r.is_err(), "the control page's mapping was made writable");
    }
}

/// What the child processes run.
#[test]
fn child_entry() {
    let Ok(role) = std::env::var(ROLE) else { return };
    let dir = std::env::var("FERRY_RUNTIME_DIR").unwrap();
    let team = Team::builder().runtime_dir(&dir).start().unwrap();
    let key = || -> Key { std::env::var("FERRY_TEST_KEY").unwrap().parse().unwrap() };
    match role.as_str() {
        "count" => {
            let r = team.open_region("counter", key()).unwrap();
            for _ in 0..100_000 {
                r.fetch_add(0, 1).unwrap();
            }
            common::say("counted");
        }
        // Tries every hostile access to "counter" while an honest importer counts.
        "hostile" => {
            let wrong = Key::from_bytes([7; 16]);
            assert!(matches!(team.open_region("counter", wrong), Err(Error::AccessDenied { .. })));
            let r = team.open_region("counter", key()).unwrap();
            let mut out = [0u8; 8];
            for _ in 0..2_000 {
                assert!(matches!(r.put(60, b"overflow"), Err(Error::OutOfBounds { .. })));
                assert!(matches!(r.put(usize::MAX, b"x"), Err(Error::OutOfBounds { .. })));
                assert!(matches!(r.get_vec(1, usize::MAX), Err(Error::OutOfBounds { .. })));
                assert!(matches!(r.fetch_add(4, 1), Err(Error::Misaligned { offset: 4 })));
                assert!(matches!(r.compare_and_swap(64, 0, 1), Err(Error::OutOfBounds { .. })));
                let far = Step::Index { index: u64::MAX, size: 8 };
                assert!(matches!(r.get_path(0, &[far], &mut out), Err(Error::OutOfBounds { .. })));
                // A cycle (word 8 points to itself), followed to the path's end.
                r.get_path(8, &[Step::Indirect; MAX_PATH_STEPS], &mut out).unwrap();
            }
            hostile::attack_the_descriptors("counter");
            common::say("refused");
        }
        // Exports a region and lives until killed.
        "owner" => {
            let region = team.export("owned", 4096).unwrap();
            common::say(format!("key {}", region.key()));
            std::thread::sleep(Duration::from_secs(60));
        }
        "stack" => {
            let r = team.open_region("stack", key()).unwrap();
            for _ in 0..20_000 {
                if let Some(node) = stack::pop(&r) {
                    stack::push(&r, node);
                }
            }
            common::say("churned");
        }
        other => panic!("unknown role {other}"),
    }
}
