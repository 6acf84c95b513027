//! Passing a descriptor over the case's socket (SCM_RIGHTS), for cases that
//! build their own shared memory (a ferry channel, say) in the parent after
//! the child has started.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer, SendAncillaryMessage,
    SendFlags,
};

/// Sends `fd` (and one marker byte) on `sock`.
pub(crate) fn send_fd(sock: &UnixStream, fd: BorrowedFd<'_>) -> io::Result<()> {
    let fds = [fd];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(io::Error::other("control buffer too small"));
    }
    sendmsg(sock, &[IoSlice::new(b"F")], &mut control, SendFlags::empty())?;
    Ok(())
}

/// Receives a descriptor sent by [`send_fd`] (marked CLOEXEC). Blocks.
pub(crate) fn recv_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let mut byte = [0u8];
    let got = recvmsg(sock, &mut [IoSliceMut::new(&mut byte)], &mut control, RecvFlags::CMSG_CLOEXEC)?;
    if got.bytes == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = msg {
            if let Some(fd) = fds.next() {
                return Ok(fd);
            }
        }
    }
    Err(io::Error::other("message carried no descriptor"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_descriptor_crosses_a_socketpair() {
        let (a, b) = UnixStream::pair().unwrap();
        let (x, _y) = UnixStream::pair().unwrap();
        send_fd(&a, x.as_fd()).unwrap();
        let got = recv_fd(&b).unwrap();
        let got = rustix::fs::fstat(&got).unwrap();
        let want = rustix::fs::fstat(&x).unwrap();
        assert_eq!((got.st_dev, got.st_ino), (want.st_dev, want.st_ino));
    }
}
