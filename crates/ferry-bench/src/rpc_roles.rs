//! The ferry processes of the many-process cases (`ferry.shm.oversub*`,
//! `ferry bench scale`), as crowd roles (see [`crate::crowd`]): a server,
//! a caller that counts its calls in time slices, a timer that times calls
//! one by one, and a holder of idle client teams. Each takes `dir=` (the
//! run's runtime dir) and `name=` (the service), and most `mode=` (see
//! [`Waiting`]); with `cpu=` the process pins itself to that CPU (members
//! are unpinned otherwise).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry::{Team, TeamBuilder};

use crate::crowd::{Member, Role};
use crate::ferry_rpc::{BenchClient, BenchImpl, BenchServer};
use crate::windows::{counts_line, Windows};

pub(crate) fn roles() -> [Role; 4] {
    [
        Role { name: "rpc.server", run: server },
        Role { name: "rpc.caller", run: caller },
        Role { name: "rpc.timer", run: timer },
        Role { name: "rpc.idle", run: idle },
    ]
}

/// How a team's waiting threads wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Waiting {
    /// The default settings.
    Default,
    /// Spinning off: sleep at once (`TeamBuilder::blocking`).
    NoSpin,
    /// The old default: every waiting thread spins its full `spin`
    /// whatever its peer is doing (see [`crate::oversub::old_default`]).
    SpinAll,
}

impl Waiting {
    pub fn word(self) -> &'static str {
        match self {
            Waiting::Default => "default",
            Waiting::NoSpin => "nospin",
            Waiting::SpinAll => "spinall",
        }
    }

    fn from_word(w: &str) -> Result<Waiting, String> {
        [Waiting::Default, Waiting::NoSpin, Waiting::SpinAll]
            .into_iter()
            .find(|m| m.word() == w)
            .ok_or_else(|| format!("no mode {w:?}"))
    }

    fn builder(self, dir: &str) -> TeamBuilder {
        let b = Team::builder().runtime_dir(dir);
        match self {
            Waiting::Default => b,
            Waiting::NoSpin => b.blocking(),
            Waiting::SpinAll => crate::oversub::old_default(b),
        }
    }
}

fn start(m: &Member, b: impl FnOnce(TeamBuilder) -> TeamBuilder) -> Result<Team, String> {
    if let Ok(cpu) = m.parse::<usize>("cpu") {
        crate::pin_current_thread(cpu); // before the team's threads, which inherit it
    }
    let mode = Waiting::from_word(m.get("mode")?)?;
    b(mode.builder(m.get("dir")?)).start().map_err(|e| format!("start team: {e}"))
}

fn bind(team: &Team, m: &Member) -> Result<BenchClient, String> {
    let c = BenchClient::bind_wait(team, m.get("name")?, Duration::from_secs(10)).map_err(|e| format!("bind: {e}"))?;
    null(&c)?; // the channel is bound and used once
    Ok(c)
}

fn null(c: &BenchClient) -> Result<(), String> {
    c.null_blocking().map_err(|e| format!("null call: {e}"))
}

/// Serves `Bench` on one team until stopped: one processor, or
/// `processors=`.
fn server(m: &mut Member) -> Result<(), String> {
    let processors = match m.get("processors") {
        Ok(_) => Some(m.parse::<usize>("processors")?),
        Err(_) => None,
    };
    let team = start(m, |b| match processors {
        Some(n) => b.processors(n),
        None => b,
    })?;
    let serving = BenchServer::serve(&team, m.get("name")?, BenchImpl::new(Arc::new(AtomicBool::new(false))))
        .map_err(|e| format!("serve: {e}"))?;
    m.say("ready")?;
    while m.hear().is_some() {}
    drop(serving);
    team.shutdown();
    Ok(())
}

/// A client of the bench service that answers each order the parent
/// sends with `answer(client, order)`, until the parent hangs up.
fn answer_orders(
    m: &mut Member,
    mut answer: impl FnMut(&BenchClient, &str) -> Result<String, String>,
) -> Result<(), String> {
    let team = start(m, |b| b)?;
    let c = bind(&team, m)?;
    m.say("ready")?;
    while let Some(line) = m.hear() {
        m.say(&answer(&c, &line)?)?;
    }
    drop(c);
    team.shutdown();
    Ok(())
}

/// Makes blocking null calls for each order `go ...` (see [`Windows`]) and
/// answers the counts per slice.
fn caller(m: &mut Member) -> Result<(), String> {
    answer_orders(m, |c, line| Ok(counts_line(&Windows::parse(line)?.count(|| null(c))?)))
}

/// Answers `time N` with `warm=` untimed null calls, then N timed one by
/// one: `ns T1 T2 ...`.
fn timer(m: &mut Member) -> Result<(), String> {
    let warm: usize = m.parse("warm")?;
    answer_orders(m, |c, line| {
        let n: usize = line.strip_prefix("time ").and_then(|n| n.parse().ok()).ok_or(format!("bad order {line:?}"))?;
        for _ in 0..warm {
            null(c)?;
        }
        let mut times = Vec::with_capacity(n);
        for _ in 0..n {
            let start = Instant::now();
            null(c)?;
            times.push(start.elapsed().as_nanos() as u64);
        }
        let mut out = String::with_capacity(8 * n + 2);
        out.push_str("ns");
        for t in times {
            out.push_str(&format!(" {t}"));
        }
        Ok(out)
    })
}

/// Starts `n=` client teams with no processor (an idle team needs none: a
/// blocking call drives its channels), binds each to the server with one
/// call, and holds them, idle, until stopped.
fn idle(m: &mut Member) -> Result<(), String> {
    let n: usize = m.parse("n")?;
    let mut held = Vec::with_capacity(n);
    for i in 0..n {
        let team = start(m, |b| b.processors(0)).map_err(|e| format!("idle team {i}: {e}"))?;
        let c = bind(&team, m).map_err(|e| format!("idle team {i}: {e}"))?;
        held.push((team, c));
    }
    m.say("ready")?;
    while m.hear().is_some() {}
    for (team, c) in held {
        drop(c);
        team.shutdown();
    }
    Ok(())
}
