//! What of a killed team a survivor still holds, read from `/proc`.
//!
//! Just before the kill, the harness stops the victim (SIGSTOP) and takes
//! what identifies its resources ([`snapshot`]): the inodes of the memfds
//! it mapped or held (channel segments, doorbell pages: its own and those
//! its peers made for it), the ids of its eventfds (doorbell lines; a
//! duplicate of each is kept here meanwhile, so no new eventfd can take
//! one of those ids), the local addresses of its TCP sockets, its pid,
//! and the pids at the other end of its Unix sockets (the teams of this
//! machine it had a channel with).
//! After the round, a survivor holds something of the dead team ([`leaks`]) if
//!
//! - one of its mappings (`/proc/PID/maps`) is of one of those memfds,
//! - one of its descriptors (`/proc/PID/fd`) is one of those memfds or
//!   eventfds, or a socket whose other end was the dead team's (a Unix
//!   socket whose peer credentials name its pid, a TCP socket connected to
//!   one of its addresses; read on a duplicate taken with `pidfd_getfd`),
//!
//! except the survivors' own doorbell pages, which the victim mapped
//! read-only (and survivors map each other's): they are the survivors',
//! not the dead team's.

use rustix::fd::{AsFd, OwnedFd};
use rustix::net::AddressFamily;
use rustix::process::{pidfd_getfd, pidfd_open, Pid, PidfdFlags, PidfdGetfdFlags};
use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::unix::fs::MetadataExt;

/// What identifies a killed team's resources (see the module's documentation).
pub(crate) struct Victim {
    pub pid: u32,
    memfds: HashSet<u64>,
    eventfds: HashSet<u64>,
    /// Duplicates of its eventfds, so that their ids stay taken.
    _pinned: Vec<OwnedFd>,
    pub tcp: HashSet<SocketAddr>,
    /// The processes at the other end of its Unix sockets.
    pub unix_peers: HashSet<u32>,
}

/// One descriptor of a process, as `/proc` shows it.
enum Fd {
    Memfd { ino: u64 },
    Eventfd { id: u64 },
    Socket { ino: u64 },
    Other,
}

fn fds(pid: u32) -> Vec<(i32, Fd)> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    let mut v = Vec::new();
    for e in dir.flatten() {
        let Some(n) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Ok(link) = std::fs::read_link(e.path()) else { continue };
        let link = link.to_string_lossy().into_owned();
        let fd = if link.starts_with("/memfd:") {
            match std::fs::metadata(e.path()) {
                Ok(md) => Fd::Memfd { ino: md.ino() },
                Err(_) => continue,
            }
        } else if link == "anon_inode:[eventfd]" {
            match eventfd_id(pid, n) {
                Some(id) => Fd::Eventfd { id },
                None => continue,
            }
        } else if let Some(ino) = link.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
            Fd::Socket { ino: ino.parse().unwrap_or(0) }
        } else {
            Fd::Other
        };
        v.push((n, fd));
    }
    v
}

fn eventfd_id(pid: u32, fd: i32) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
    info.lines().find_map(|l| l.strip_prefix("eventfd-id:")).and_then(|v| v.trim().parse().ok())
}

/// The memfd mappings: (inode, whether writable, whether a doorbell page, the line).
fn memfd_maps(pid: u32) -> Vec<(u64, bool, bool, String)> {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { return Vec::new() };
    maps.lines()
        .filter(|l| l.contains("/memfd:"))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let ino = f.get(4)?.parse().ok()?;
            let writable = f.get(1)?.starts_with("rw");
            Some((ino, writable, l.contains("/memfd:ferry-doorbell"), l.to_string()))
        })
        .collect()
}

/// Local addresses of the TCP sockets (IPv4) with these inodes, in the
/// process's network namespace.
fn tcp_addrs(pid: u32, inodes: &HashSet<u64>) -> HashSet<SocketAddr> {
    let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/net/tcp")) else { return HashSet::new() };
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let ino: u64 = f.get(9)?.parse().ok()?;
            inodes.contains(&ino).then_some(())?;
            let (ip, port) = f.get(1)?.split_once(':')?;
            let ip = Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.to_le_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_str_radix(port, 16).ok()?)))
        })
        .collect()
}

/// Takes the victim's identities; call it while the victim is stopped.
pub(crate) fn snapshot(pid: u32) -> Victim {
    let mut memfds: HashSet<u64> = memfd_maps(pid).into_iter().map(|m| m.0).collect();
    let (mut eventfds, mut sockets, mut pinned) = (HashSet::new(), HashSet::new(), Vec::new());
    let mut unix_peers = HashSet::new();
    let pidfd = Pid::from_raw(pid as i32).and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok());
    for (n, fd) in fds(pid) {
        match fd {
            Fd::Memfd { ino } => {
                memfds.insert(ino);
            }
            Fd::Eventfd { id } => {
                eventfds.insert(id);
                if let Some(dup) = pidfd.as_ref().and_then(|p| pidfd_getfd(p, n, PidfdGetfdFlags::empty()).ok()) {
                    pinned.push(dup);
                }
            }
            Fd::Socket { ino } => {
                sockets.insert(ino);
                // Read on a duplicate, closed at once: holding one of its
                // sockets would keep its peers from seeing it hang up.
                let dup = pidfd.as_ref().and_then(|p| pidfd_getfd(p, n, PidfdGetfdFlags::empty()).ok());
                if let Some(peer) = dup.as_ref().and_then(unix_peer) {
                    unix_peers.insert(peer);
                }
            }
            Fd::Other => {}
        }
    }
    let tcp = tcp_addrs(pid, &sockets);
    Victim { pid, memfds, eventfds, _pinned: pinned, tcp, unix_peers }
}

/// The pid at the other end of a connected Unix socket.
fn unix_peer(sock: &OwnedFd) -> Option<u32> {
    use rustix::net::sockopt;
    let listening = sockopt::socket_acceptconn(sock.as_fd()).unwrap_or(true);
    if listening || sockopt::socket_domain(sock.as_fd()).ok()? != AddressFamily::UNIX {
        return None;
    }
    Some(sockopt::socket_peercred(sock.as_fd()).ok()?.pid.as_raw_nonzero().get() as u32)
}

/// What a survivor still holds of the victim.
#[derive(Default, Debug)]
pub(crate) struct Leaks {
    pub mappings: Vec<String>,
    pub fds: Vec<String>,
}

impl Leaks {
    pub fn is_empty(&self) -> bool {
        self.mappings.is_empty() && self.fds.is_empty()
    }
}

/// The inode of a team's own doorbell page: the one it maps writable.
pub(crate) fn own_doorbell(pid: u32) -> HashSet<u64> {
    memfd_maps(pid).into_iter().filter(|m| m.1 && m.2).map(|m| m.0).collect()
}

/// What survivor `pid` holds of `victim` (see the module's documentation);
/// `own`: the survivors' own doorbell pages.
pub(crate) fn leaks(pid: u32, victim: &Victim, own: &HashSet<u64>) -> Leaks {
    let maps = memfd_maps(pid);
    let mut leaks = Leaks::default();
    for (ino, _, _, line) in &maps {
        if victim.memfds.contains(ino) && !own.contains(ino) {
            leaks.mappings.push(line.clone());
        }
    }
    let pidfd = Pid::from_raw(pid as i32).and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok());
    for (n, fd) in fds(pid) {
        let what = match fd {
            Fd::Memfd { ino } if victim.memfds.contains(&ino) && !own.contains(&ino) => format!("memfd inode {ino}"),
            Fd::Eventfd { id } if victim.eventfds.contains(&id) => format!("eventfd id {id}"),
            Fd::Socket { .. } => match pidfd.as_ref().and_then(|p| pidfd_getfd(p, n, PidfdGetfdFlags::empty()).ok()) {
                Some(dup) => match socket_toward(&dup, victim) {
                    Some(what) => what,
                    None => continue,
                },
                None => continue,
            },
            _ => continue,
        };
        leaks.fds.push(format!("fd {n}: {what}"));
    }
    leaks
}

/// Whether this socket (a duplicate of a survivor's) is connected to the victim.
fn socket_toward(sock: &OwnedFd, victim: &Victim) -> Option<String> {
    use rustix::net::sockopt;
    if sockopt::socket_acceptconn(sock.as_fd()).unwrap_or(true) {
        return None; // a listener
    }
    match sockopt::socket_domain(sock.as_fd()).ok()? {
        AddressFamily::UNIX => (unix_peer(sock)? == victim.pid).then(|| "Unix socket to its pid".to_string()),
        AddressFamily::INET => {
            let peer = SocketAddr::try_from(rustix::net::getpeername(sock.as_fd()).ok()??).ok()?;
            victim.tcp.contains(&peer).then(|| format!("TCP socket to {peer}"))
        }
        _ => None,
    }
}

/// Whether a process is stopped (`T` in `/proc/PID/stat`).
pub(crate) fn is_stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('T')))
        .unwrap_or(false)
}
