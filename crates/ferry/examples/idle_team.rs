//! A small program that only starts a team and waits: its resident size is
//! what the library costs a program (`ferry bench pingpong` reports it as
//! `memory.idle_team_rss_kib`). Its one port, `idle`, answers each message
//! with nothing, so that the benchmark can measure the shared memory of
//! a channel to it. Ends when its standard input closes.
//!
//!     cargo run --release -p ferry --example idle_team -- RUNTIME_DIR
fn main() {
    let dir = std::env::args().nth(1).unwrap_or_else(|| std::env::temp_dir().join("ferry-idle").display().to_string());
    let team = ferry::Team::builder().runtime_dir(&dir).start().expect("start a team");
    let port = team.open_named_raw_port("idle").expect("open a port");
    std::thread::spawn(move || {
        while let Ok(m) = port.recv_blocking() {
            let _ = m.reply(&[]);
        }
    });
    println!("ready");
    let _ = std::io::stdin().read_line(&mut String::new());
    team.shutdown();
}
