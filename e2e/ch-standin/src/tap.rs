//! Opening the TAP cocoon made (in the netns the process runs in) as cloud-hypervisor's
//! virtio-net does: one fd per queue pair, `IFF_TAP | IFF_NO_PI | IFF_VNET_HDR`, plus
//! `IFF_MULTI_QUEUE` when there is more than one pair (the kernel refuses a mismatch with how
//! the device was created), and a 12-byte virtio-net header on every frame. A name that
//! names no device makes the kernel create one, which lives as long as its fds: the same
//! thing happens to cloud-hypervisor when a restored config.json names a TAP that is gone.

use std::os::fd::{FromRawFd, OwnedFd};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_MULTI_QUEUE: libc::c_short = 0x0100;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;

/// `struct virtio_net_hdr_v1`: what cloud-hypervisor sets with TUNSETVNETHDRSZ.
pub const VNET_HDR_LEN: usize = 12;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Opens `num_queues / 2` (at least one) queues of TAP `name`.
pub fn open(name: &str, num_queues: u64) -> std::io::Result<Vec<OwnedFd>> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(std::io::Error::other(format!("invalid TAP name {name:?}")));
    }
    let pairs = (num_queues / 2).max(1);
    let mut flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
    if pairs > 1 {
        flags |= IFF_MULTI_QUEUE;
    }
    (0..pairs).map(|_| open_queue(name, flags)).collect()
}

fn open_queue(name: &str, flags: libc::c_short) -> std::io::Result<OwnedFd> {
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags,
        _pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: open(2) of a constant path; the ioctls get a live, correctly sized ifreq / int.
    unsafe {
        let fd = libc::open(
            c"/dev/net/tun".as_ptr(),
            libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let owned = OwnedFd::from_raw_fd(fd);
        if libc::ioctl(fd, TUNSETIFF as _, &mut req) < 0 {
            let e = std::io::Error::last_os_error();
            return Err(std::io::Error::new(
                e.kind(),
                format!("TUNSETIFF {name}: {e}"),
            ));
        }
        let hdr: libc::c_int = VNET_HDR_LEN as libc::c_int;
        if libc::ioctl(fd, TUNSETVNETHDRSZ as _, &hdr) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // No offloads: the kernel hands over whole, checksummed frames, which is all the
        // stand-in's stack takes.
        if libc::ioctl(fd, TUNSETOFFLOAD as _, 0 as libc::c_uint) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(owned)
    }
}
