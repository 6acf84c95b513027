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
