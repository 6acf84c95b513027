//! The child process of a case: the same binary, re-executed by the parent
//! with the case name and its inherited descriptors in the environment.

use std::io::Write;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};

use rustix::io::{fcntl_getfd, fcntl_setfd, FdFlags};
use rustix::process::{getppid, set_parent_process_death_signal, Signal};
use rustix::thread::{sched_setaffinity, CpuSet};

use crate::harness::{env, Case, ChildCtx, Params, READY};
use crate::shm::{ShmRegion, SHM_BYTES};

/// Call first thing in `main()`, with every case the binary may run. If this
/// process was started as the child of a case, runs that case's child side
/// and exits the process (0 on success, 101 if it panicked, 2 on a setup
/// error); otherwise returns at once.
pub fn child_main_if_requested(cases: &[Case]) {
    let Ok(name) = std::env::var(env::CHILD) else { return };
    let code = match setup(&name, cases) {
        Ok((case, ctx)) => match catch_unwind(AssertUnwindSafe(|| (case.child)(&ctx))) {
            Ok(()) => 0,
            Err(_) => 101, // the panic hook has already printed the message
        },
        Err(msg) => {
            eprintln!("ferry-bench child {name}: {msg}");
            2
        }
    };
    std::process::exit(code);
}

fn setup<'a>(name: &str, cases: &'a [Case]) -> Result<(&'a Case, ChildCtx), String> {
    let case = cases.iter().find(|c| c.name == name).ok_or_else(|| format!("no case named {name:?} in this binary"))?;

    // Die with the parent, so a crashed parent leaves no spinning child.
    set_parent_process_death_signal(Some(Signal::KILL)).map_err(|e| format!("prctl: {e}"))?;
    let parent: i32 = var(env::PARENT_PID)?;
    if getppid().map(|p| p.as_raw_nonzero().get()) != Some(parent) {
        return Err("the parent is already gone".into());
    }
    if let Ok(cpu) = var::<usize>(env::CPU) {
        let mut set = CpuSet::new();
        set.set(cpu);
        let _ = sched_setaffinity(None, &set); // best effort, like the parent
    }

    let shm =
        ShmRegion::map(inherited_fd(env::SHM_FD)?, SHM_BYTES).map_err(|e| format!("mapping the shared region: {e}"))?;
    let sock = UnixStream::from(inherited_fd(env::SOCK_FD)?);
    let params = Params::from_env(&var::<String>(env::PARAMS)?).ok_or("bad params")?;
    let run_id = var(env::RUN_ID)?;
    for key in [env::CHILD, env::SHM_FD, env::SOCK_FD, env::RUN_ID, env::PARAMS, env::CPU, env::PARENT_PID] {
        // Processes this child starts are not children of a case.
        std::env::remove_var(key);
    }

    (&sock).write_all(&[READY]).map_err(|e| format!("sending ready: {e}"))?;
    Ok((case, ChildCtx { shm, sock, run_id, params }))
}

fn var<T: std::str::FromStr>(key: &str) -> Result<T, String> {
    let s = std::env::var(key).map_err(|_| format!("{key} is not set"))?;
    s.parse().map_err(|_| format!("{key}={s:?} does not parse"))
}

/// Takes ownership of a descriptor the parent left open across exec, and
/// marks it CLOEXEC again so it goes no further.
fn inherited_fd(key: &str) -> Result<OwnedFd, String> {
    let raw: RawFd = var(key)?;
    if raw < 0 {
        return Err(format!("{key}={raw} is not a descriptor"));
    }
    // SAFETY: the parent put in `key` the number of a descriptor it made
    // inheritable for this child alone; nothing else in this process refers
    // to it, so the OwnedFd becomes its only owner. `fcntl_getfd` checks
    // that it is open before ownership is taken.
    let fd = unsafe {
        fcntl_getfd(BorrowedFd::borrow_raw(raw)).map_err(|e| format!("{key}={raw}: {e}"))?;
        OwnedFd::from_raw_fd(raw)
    };
    fcntl_setfd(&fd, FdFlags::CLOEXEC).map_err(|e| format!("{key}={raw}: {e}"))?;
    Ok(fd)
}
