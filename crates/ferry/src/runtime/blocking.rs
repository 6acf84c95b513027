//! Blocking jobs: a small pool of extra threads beside the processors, for
//! code that must block (a file read, a long computation) without stalling
//! the team's tasks. Threads start when jobs need them, up to a bound, and
//! end after a while without work.

use super::executor::{self, JoinHandle};
use crate::error::{Error, Result};
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::VecDeque;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

/// Runs the job, or (`Err`) tells its handle why it never will.
type Job = Box<dyn FnOnce(Result<()>) + Send>;

pub(crate) struct BlockingPool {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    max_threads: usize,
    idle_timeout: Duration,
    team: u32,
}

struct State {
    jobs: VecDeque<Job>,
    threads: usize,
    /// Threads waiting for a job.
    idle: usize,
    closed: bool,
}

impl BlockingPool {
    pub fn new(team: u32, max_threads: usize, idle_timeout: Duration) -> BlockingPool {
        let state = State { jobs: VecDeque::new(), threads: 0, idle: 0, closed: false };
        let shared = Shared { state: Mutex::new(state), work: Condvar::new(), max_threads, idle_timeout, team };
        BlockingPool { shared: Arc::new(shared) }
    }

    pub fn spawn<F, T>(&self, f: F) -> JoinHandle<T>
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        let (handle, done) = executor::external();
        let job: Job = Box::new(move |go| {
            let r = go.and_then(|()| {
                std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|p| Error::Panicked(executor::panic_message(&*p)))
            });
            done.finish(r);
        });
        let shared = &self.shared;
        let mut s = shared.state.lock();
        if s.closed {
            drop(s);
            job(Err(Error::Shutdown));
            return handle;
        }
        s.jobs.push_back(job);
        // Enough idle threads for every queued job, or no room for another thread.
        if s.idle >= s.jobs.len() || s.threads >= shared.max_threads {
            shared.work.notify_one();
            return handle;
        }
        s.threads += 1;
        drop(s);
        let worker = shared.clone();
        let started =
            std::thread::Builder::new().name(format!("ferry-blocking-{}", shared.team)).spawn(move || worker.run());
        if let Err(e) = started {
            tracing::warn!(team = shared.team, error = %e, "cannot start a blocking thread");
            let mut s = shared.state.lock();
            s.threads -= 1;
            // With no thread at all, queued jobs would wait forever: fail them.
            let stranded = if s.threads == 0 { std::mem::take(&mut s.jobs) } else { VecDeque::new() };
            drop(s);
            for job in stranded {
                job(Err(Error::Io { context: "start blocking thread", source: std::io::Error::from(e.kind()) }));
            }
        }
        handle
    }

    /// At shutdown: idle threads end, queued jobs fail with `Shutdown`;
    /// running jobs finish on their own.
    pub fn close(&self) {
        let jobs = {
            let mut s = self.shared.state.lock();
            s.closed = true;
            std::mem::take(&mut s.jobs)
        };
        self.shared.work.notify_all();
        for job in jobs {
            job(Err(Error::Shutdown));
        }
    }

    #[cfg(test)]
    fn threads(&self) -> usize {
        self.shared.state.lock().threads
    }
}

impl Shared {
    /// A blocking thread: runs jobs; ends after `idle_timeout` without one.
    fn run(&self) {
        let mut s = self.state.lock();
        loop {
            if let Some(job) = s.jobs.pop_front() {
                MutexGuard::unlocked(&mut s, || job(Ok(())));
                continue;
            }
            if s.closed {
                break;
            }
            s.idle += 1;
            let timed_out = self.work.wait_for(&mut s, self.idle_timeout).timed_out();
            s.idle -= 1;
            if timed_out && s.jobs.is_empty() {
                break;
            }
        }
        s.threads -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Team;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    fn wait<T>(h: JoinHandle<T>) -> Result<T> {
        let dir = tempfile::tempdir().unwrap();
        Team::builder().runtime_dir(dir.path()).processors(0).start().unwrap().block_on(h)
    }

    /// Threads start on demand up to the bound (further jobs queue), and end
    /// once idle for the timeout.
    #[test]
    fn threads_are_bounded_and_end_when_idle() {
        let pool = BlockingPool::new(0, 2, Duration::from_millis(50));
        let running = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..5)
            .map(|i| {
                let (running, most) = (running.clone(), most.clone());
                pool.spawn(move || {
                    most.fetch_max(running.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                    running.fetch_sub(1, Ordering::SeqCst);
                    i
                })
            })
            .collect();
        assert!(pool.threads() <= 2);
        for (i, h) in handles.into_iter().enumerate() {
            assert_eq!(wait(h).unwrap(), i);
        }
        assert!(most.load(Ordering::SeqCst) <= 2, "{} jobs ran at once", most.load(Ordering::SeqCst));
        let until = Instant::now() + Duration::from_secs(5);
        while pool.threads() > 0 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(pool.threads(), 0, "idle threads did not end");
        // And come back when needed.
        assert_eq!(wait(pool.spawn(|| 7)).unwrap(), 7);
    }

    #[test]
    fn a_panic_is_reported_and_the_pool_goes_on() {
        let pool = BlockingPool::new(0, 1, Duration::from_secs(10));
        let r = wait(pool.spawn(|| -> u32 { panic!("on purpose") }));
        assert!(matches!(&r, Err(Error::Panicked(m)) if m == "on purpose"), "{r:?}");
        assert_eq!(wait(pool.spawn(|| 1)).unwrap(), 1);
    }

    /// Queued jobs and jobs spawned after the close fail with `Shutdown`;
    /// the running one finishes.
    #[test]
    fn close_fails_queued_jobs() {
        let pool = BlockingPool::new(0, 1, Duration::from_secs(10));
        let (started, has_started) = std::sync::mpsc::channel();
        let running = pool.spawn(move || {
            started.send(()).unwrap();
            std::thread::sleep(Duration::from_millis(50));
        });
        has_started.recv().unwrap();
        let queued = pool.spawn(|| ());
        pool.close();
        assert!(matches!(wait(queued), Err(Error::Shutdown)));
        assert!(matches!(wait(pool.spawn(|| ())), Err(Error::Shutdown)));
        wait(running).unwrap();
    }
}
