use ferry::{Checkpoint, Team};
use std::time::Duration;

fn team(dir: &std::path::Path) -> Team {
    Team::builder().runtime_dir(dir).spin(Duration::from_micros(5)).start().unwrap()
}

#[test]
fn smoke_inproc_and_shm() {
    let dir = tempfile::tempdir().unwrap();
    let a = team(dir.path());
    let b = team(dir.path());
    let port = b.open_named_port::<String>("echo").unwrap();
    let pid = port.id();
    let t = std::thread::spawn(move || {
        for _ in 0..3 {
            let m = port.recv_blocking().unwrap();
            let v = m.value.clone();
            if m.wants_reply() {
                m.reply(&format!("re:{v}")).unwrap();
            }
        }
    });
    let s = a.connect::<String>("echo").unwrap();
    assert_eq!(s.to(), pid);
    s.send(&"one".to_string(), Checkpoint::Immediate).unwrap();
    s.send(&"two".to_string(), Checkpoint::OnReceipt).unwrap();
    let r: String = s.call(&"three".to_string()).unwrap();
    assert_eq!(r, "re:three");
    t.join().unwrap();
    // inproc
    let p2 = a.open_port::<u32>().unwrap();
    a.sender::<u32>(p2.id()).send(&5, Checkpoint::Immediate).unwrap();
    assert_eq!(p2.recv_blocking().unwrap().value, 5);
}

#[test]
fn two_threads_bounce_over_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let team = Team::builder().runtime_dir(dir.path()).processors(0).spin(Duration::from_micros(50)).start().unwrap();
    let (a, b) = (team.open_raw_port().unwrap(), team.open_raw_port().unwrap());
    let (to_a, to_b) = (team.raw_sender(a.id()), team.raw_sender(b.id()));
    let echo = std::thread::spawn(move || loop {
        let m = b.recv_timeout(Duration::from_secs(5)).unwrap();
        if m.payload().is_empty() {
            break;
        }
        to_a.send(m.payload(), Checkpoint::Immediate).unwrap();
    });
    for i in 0..5000u32 {
        to_b.send(&i.to_le_bytes(), Checkpoint::Immediate).unwrap();
        let t = std::time::Instant::now();
        let m = a.recv_timeout(Duration::from_secs(5)).unwrap_or_else(|e| panic!("round {i}: {e}"));
        if t.elapsed() > Duration::from_millis(5) {
            eprintln!("round {i} took {:?}", t.elapsed());
        }
        assert_eq!(m.payload(), i.to_le_bytes());
    }
    to_b.send(b"", Checkpoint::Immediate).unwrap();
    echo.join().unwrap();
}
