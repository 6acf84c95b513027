//! Sending file descriptors with a message over a Unix stream socket (SCM_RIGHTS).

use crate::error::{Error, Result};
use rustix::fd::{AsFd, BorrowedFd, OwnedFd};
use rustix::net::{
    recvmsg, sendmsg, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 5;

/// Sends `bytes` (all of it, in one message) with `fds` attached.
pub fn send(sock: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut cmsg = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !cmsg.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(Error::io("attach descriptors")(std::io::ErrorKind::InvalidInput.into()));
    }
    let n = sendmsg(sock, &[IoSlice::new(bytes)], &mut cmsg, SendFlags::NOSIGNAL)
        .map_err(|e| Error::io("sendmsg")(e.into()))?;
    if n != bytes.len() {
        return Err(Error::io("sendmsg (short write)")(std::io::ErrorKind::WriteZero.into()));
    }
    Ok(())
}

/// Receives one message of at most `buf.len()` bytes and the descriptors attached to it.
/// Returns the byte count (0 = the peer closed) and the descriptors.
pub fn recv(sock: impl AsFd, buf: &mut [u8]) -> Result<(usize, Vec<OwnedFd>)> {
    recv_with(sock, buf, RecvFlags::empty())?.ok_or_else(|| Error::io("recvmsg")(std::io::ErrorKind::WouldBlock.into()))
}

/// Like [`recv`], but without waiting: `None` if no message is there yet.
pub fn try_recv(sock: impl AsFd, buf: &mut [u8]) -> Result<Option<(usize, Vec<OwnedFd>)>> {
    recv_with(sock, buf, RecvFlags::DONTWAIT)
}

fn recv_with(sock: impl AsFd, buf: &mut [u8], flags: RecvFlags) -> Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut cmsg = RecvAncillaryBuffer::new(&mut space);
    let msg = match recvmsg(&sock, &mut [IoSliceMut::new(buf)], &mut cmsg, flags | RecvFlags::CMSG_CLOEXEC) {
        Ok(msg) => msg,
        Err(rustix::io::Errno::AGAIN) => return Ok(None),
        Err(e) => return Err(Error::io("recvmsg")(e.into())),
    };
    let mut fds = Vec::new();
    for m in cmsg.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = m {
            fds.extend(rights);
        }
    }
    if msg.flags.contains(ReturnFlags::CTRUNC) && out_of_descriptors(&sock) {
        // The kernel dropped descriptors it could not give us: the message
        // is lost for want of descriptors here, not for what the peer sent.
        return Err(Error::io("recvmsg")(std::io::Error::from_raw_os_error(libc::EMFILE)));
    }
    Ok(Some((msg.bytes, fds)))
}

/// Whether this process is at its open-files limit now (a descriptor
/// cannot be duplicated): what a truncated `SCM_RIGHTS` message meant, as
/// opposed to a peer that sent more descriptors than we take.
fn out_of_descriptors(sock: &impl AsFd) -> bool {
    matches!(rustix::io::fcntl_dupfd_cloexec(sock, 0), Err(rustix::io::Errno::MFILE))
}
