//! Socket options icmp-socket gives no way to set. icmp-socket 0.2 fixes its raw socket's
//! SO_RCVBUF at 512 bytes, which the kernel raises to its minimum (2,304 bytes on 6.x: two
//! or three packets), and every raw ICMP socket is handed a copy of all the ICMP the host
//! takes in. With that, replies are lost whenever the receive thread is a moment late: at
//! 1,000 guests a second on a busy host, about one in ten. It keeps its descriptor private,
//! so the descriptor is found by what it is, the one IPv4 raw ICMP socket that appeared while
//! icmp-socket made it, and given a receive buffer for a burst and a filter that lets in only
//! the messages that socket is read for.

use std::collections::HashSet;
use std::io;
use std::os::fd::RawFd;
use std::sync::Mutex;

use icmp_socket::IcmpSocket4;

/// linux/icmp.h: a bitmask of the ICMP types a raw socket drops.
const ICMP_FILTER: libc::c_int = 1;
const ICMP_ECHO_REPLY: u32 = 0;
/// Asked for; the kernel doubles it (and without CAP_NET_ADMIN caps it at
/// net.core.rmem_max). About a thousand replies fit.
const RECV_BUFFER: libc::c_int = 512 * 1024;

/// Two sockets made at once could not be told apart.
static MAKING: Mutex<()> = Mutex::new(());

#[derive(Clone, Copy)]
pub enum Reads {
    /// The receive socket: echo replies only, with room for a burst of them.
    EchoReplies,
    /// The send socket: never read, so nothing may queue on it.
    Nothing,
}

/// A new icmp-socket raw socket and, if it could not be tuned, why.
pub fn raw_socket(reads: Reads) -> io::Result<(IcmpSocket4, Result<(), String>)> {
    let _one_at_a_time = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    let before = raw_icmp_fds();
    let socket = IcmpSocket4::new()?;
    let tuned = match (before, raw_icmp_fds()) {
        (Ok(before), Ok(after)) => match after.difference(&before).collect::<Vec<_>>()[..] {
            [fd] => tune(*fd, reads).map_err(|e| format!("setting its options: {e}")),
            ref new => Err(format!(
                "{} new raw ICMP descriptors instead of one",
                new.len()
            )),
        },
        (Err(e), _) | (_, Err(e)) => Err(format!("listing /proc/self/fd: {e}")),
    };
    Ok((socket, tuned))
}

fn raw_icmp_fds() -> io::Result<HashSet<RawFd>> {
    let mut fds = HashSet::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let Ok(fd) = entry?.file_name().to_string_lossy().parse::<RawFd>() else {
            continue;
        };
        // Descriptors that are no sockets (the listing's own, among others) fail the query.
        let is = |name, value| get_int(fd, libc::SOL_SOCKET, name) == Some(value);
        if is(libc::SO_DOMAIN, libc::AF_INET)
            && is(libc::SO_TYPE, libc::SOCK_RAW)
            && is(libc::SO_PROTOCOL, libc::IPPROTO_ICMP)
        {
            fds.insert(fd);
        }
    }
    Ok(fds)
}

fn tune(fd: RawFd, reads: Reads) -> io::Result<()> {
    let dropped: u32 = match reads {
        Reads::EchoReplies => !(1 << ICMP_ECHO_REPLY),
        Reads::Nothing => !0,
    };
    set(fd, libc::SOL_RAW, ICMP_FILTER, dropped)?;
    if let Reads::EchoReplies = reads {
        // The forced size needs CAP_NET_ADMIN; the plain one is capped by rmem_max.
        set(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, RECV_BUFFER)
            .or_else(|_| set(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, RECV_BUFFER))?;
    }
    Ok(())
}

fn get_int(fd: RawFd, level: libc::c_int, name: libc::c_int) -> Option<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: value and len are valid for writes of the sizes given; an fd that is closed or
    // no socket only makes the call fail.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(value)
}

fn set<T: Copy>(fd: RawFd, level: libc::c_int, name: libc::c_int, value: T) -> io::Result<()> {
    // SAFETY: value lives across the call and its size is the length given; fd is the socket
    // the caller holds open.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Needs CAP_NET_RAW; skipped (with the reason printed) without it.
    #[test]
    fn the_new_socket_is_found_and_tuned() {
        let (socket, tuned) = match raw_socket(Reads::EchoReplies) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("skipped: no raw ICMP socket here ({e})");
                return;
            }
        };
        tuned.expect("tuned");
        let fds = raw_icmp_fds().unwrap();
        let big = fds
            .iter()
            .filter(|fd| get_int(**fd, libc::SOL_SOCKET, libc::SO_RCVBUF) >= Some(RECV_BUFFER))
            .count();
        assert!(big >= 1, "no raw ICMP socket with the larger buffer");
        drop(socket);
    }
}
