//! The MPI peer of `ferry bench memory`: MPI's one-sided operations on one
//! machine, measured as the OSU one-sided benchmarks measure them
//! (`osu_get_latency`, `osu_put_latency`, `osu_fop_latency` with
//! `-w allocate -s lock_all`).
//!
//! Two ranks of Open MPI (`mpirun -np 2`) run `mpi/one_sided.c`: a window
//! from `MPI_Win_allocate`, `MPI_Win_lock_all` once, then per operation one
//! 8-byte operation on rank 1's window followed by `MPI_Win_flush(1)`, timed
//! by rank 0; rank 1 only waits (in `MPI_Barrier`):
//!
//! * `mpi.get.8` — `MPI_Get` of 8 bytes;
//! * `mpi.put.8` — `MPI_Put` of 8 bytes;
//! * `mpi.fetch_add` — `MPI_Fetch_and_op(MPI_SUM, MPI_UINT64_T)` of 1.
//!
//! Unlike ferry's cases, no operation waits for the other side: rank 1
//! never touches its window while rank 0 works on it (OSU's latency), so
//! after the first operation the word stays in rank 0's cache. Ferry's
//! `ferry.shm.get.8` and `ferry.shm.fetch_add` move the line between the
//! two CPUs on every round trip: a ratio between the two is between
//! different things. The samples are [`Params::measure`]'s: `warmup` untimed rounds, then one
//! sample (ns per operation) per timed round of `iters` operations.
//!
//! The window is Open MPI's `osc/sm` component (`--mca osc sm`): the
//! window in shared memory, each operation a load, store or atomic of
//! rank 0's. It is MPI's fastest path on one machine; left to choose, Open
//! MPI 4.1 takes `osc/rdma` (priority 101 against 100), slower here.
//!
//! The ranks pin themselves to the CPUs the harness gives the case (rank 0
//! to the parent's, rank 1 to the child's); mpirun binds nothing. The
//! harness's child process has nothing to do and exits at once.
//!
//! The program is compiled with `mpicc -O2` on first use, next to the
//! running binary (`target/release/ferry-bench-mpi/`). Without `mpirun`
//! and `mpicc` (Debian: `openmpi-bin libopenmpi-dev`, see
//! `scripts/bench-deps.sh`) the suite leaves these cases out: see
//! [`missing`].

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};
use rustix::thread::sched_getaffinity;

use crate::harness::{Case, ChildCtx, Params, Peer};

/// The program both ranks run (compiled by [`program`]).
const SOURCE: &str = include_str!("../mpi/one_sided.c");
const MPIRUN: &str = "mpirun";
const MPICC: &str = "mpicc";

pub fn cases() -> Vec<Case> {
    vec![
        Case::new("mpi.get.8", |p, q| parent(p, q, "get"), idle_child),
        Case::new("mpi.put.8", |p, q| parent(p, q, "put"), idle_child),
        Case::new("mpi.fetch_add", |p, q| parent(p, q, "fetch_add"), idle_child),
    ]
}

/// Why the MPI cases cannot run here (`mpirun` or `mpicc` not on `PATH`),
/// if they cannot.
pub fn missing() -> Option<String> {
    let absent: Vec<&str> = [MPIRUN, MPICC].into_iter().filter(|t| on_path(t).is_none()).collect();
    if absent.is_empty() {
        return None;
    }
    Some(format!(
        "{} not found on PATH (Debian: apt-get install openmpi-bin libopenmpi-dev, or scripts/bench-deps.sh)",
        absent.join(" and ")
    ))
}

fn on_path(tool: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|p| p.metadata().is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// Rank 1 is the target; the harness's child is not needed.
fn idle_child(_: &ChildCtx) {}

/// The compiled program, built once per process (every case of every pass
/// uses it).
fn program() -> &'static Result<PathBuf, String> {
    static PROGRAM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PROGRAM.get_or_init(build)
}

/// Compiles [`SOURCE`] unless the same source was compiled before, in a
/// directory beside the running binary (in `target/`), or in the temporary
/// directory if that one is not writable (an installed binary).
fn build() -> Result<PathBuf, String> {
    let beside_exe = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join("ferry-bench-mpi")));
    let uid = rustix::process::getuid().as_raw();
    let in_tmp = std::env::temp_dir().join(format!("ferry-bench-mpi-{uid}"));
    let mut why = Vec::new();
    for dir in beside_exe.into_iter().chain([in_tmp]) {
        match build_in(&dir) {
            Ok(p) => return Ok(p),
            Err(e) => why.push(format!("{}: {e}", dir.display())),
        }
    }
    Err(format!("cannot build the MPI program: {}", why.join("; ")))
}

fn build_in(dir: &Path) -> Result<PathBuf, String> {
    let src = dir.join("one_sided.c");
    let exe = dir.join("one_sided");
    if exe.is_file() && std::fs::read_to_string(&src).is_ok_and(|s| s == SOURCE) {
        return Ok(exe);
    }
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    std::fs::write(&src, SOURCE).map_err(|e| e.to_string())?;
    // Built under another name and renamed: a binary in place is whole.
    let tmp = dir.join(format!("one_sided.{}.tmp", std::process::id()));
    let out = Command::new(MPICC)
        .arg("-O2")
        .arg("-o")
        .arg(&tmp)
        .arg(&src)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("running {MPICC}: {e}"))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("{MPICC} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim()));
    }
    std::fs::rename(&tmp, &exe).map_err(|e| e.to_string())?;
    Ok(exe)
}

/// The first CPU the calling thread may run on: the one the harness pinned
/// it to, for a pinned case.
fn own_cpu() -> Option<usize> {
    let set = sched_getaffinity(None).ok()?;
    (0..rustix::thread::CpuSet::MAX_CPU).find(|&c| set.is_set(c))
}

/// Runs `mpirun` for `op` and returns rank 0's samples. Panics (failing
/// the case) if the program cannot be built, or mpirun fails, hangs or
/// prints other than `rounds` samples.
fn parent(peer: &mut Peer, p: &Params, op: &str) -> Vec<f64> {
    let exe = program().as_ref().unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(MPIRUN);
    // `--bind-to none`: the ranks pin themselves where the harness says.
    // `--mca osc sm`: see the module's documentation.
    cmd.args(["-np", "2", "--bind-to", "none", "--mca", "osc", "sm"]).arg(exe).arg(op);
    cmd.args([p.iters, p.rounds, p.warmup].map(|n| n.to_string()));
    // Rank 0 where the harness pinned this thread, rank 1 on the child's CPU.
    if let (Some(mine), Some(child)) = (own_cpu(), peer.child_cpu) {
        cmd.args([mine.to_string(), child.to_string()]);
    }
    // Open MPI refuses to run as root without both (ignored otherwise).
    cmd.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    // mpirun would forward stdin to rank 0; its messages go to stderr.
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start {MPIRUN}: {e}"));

    // Read on a thread, so that a hung mpirun can be stopped here.
    let mut stdout = child.stdout.take().expect("piped stdout");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stdout.read_to_string(&mut s);
        s
    });
    // Generous: an operation takes well under 10 µs, start-up about a second.
    let ops = ((p.warmup + p.rounds) * p.iters) as u64;
    let timeout = Duration::from_secs(30) + Duration::from_micros(ops.saturating_mul(10));
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                // SIGTERM first: mpirun passes it on to the ranks and cleans up.
                let pid = Pid::from_raw(child.id() as i32).expect("mpirun's pid");
                let _ = kill_process(pid, Signal::TERM);
                std::thread::sleep(Duration::from_secs(2));
                let _ = child.kill();
                let _ = child.wait();
                panic!("{MPIRUN} still running after {timeout:?}; killed");
            }
            Err(e) => panic!("waiting for {MPIRUN}: {e}"),
        }
    };
    let out = reader.join().expect("stdout reader");
    assert!(status.success(), "{MPIRUN} failed ({status}); stdout: {out:?}");
    let samples: Vec<f64> = out.lines().filter_map(|l| l.trim().parse().ok()).collect();
    assert_eq!(samples.len(), p.rounds, "expected {} samples from rank 0, got {out:?}", p.rounds);
    samples
}
