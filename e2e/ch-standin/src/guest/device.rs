//! smoltcp's `phy::Device` over the TAP queues: a frame comes from whichever queue has one
//! (the kernel spreads flows over them), goes out on the first, each behind the virtio-net
//! header cloud-hypervisor's device uses (all zeros: no offloads were negotiated).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::time::Instant;

use crate::tap::VNET_HDR_LEN;

const MTU: usize = 1514;
const FRAME_MAX: usize = 65536 + VNET_HDR_LEN;

pub struct TapDevice {
    queues: Vec<Arc<OwnedFd>>,
    next: usize,
    buf: Vec<u8>,
}

impl TapDevice {
    pub fn new(queues: Vec<Arc<OwnedFd>>) -> TapDevice {
        TapDevice {
            queues,
            next: 0,
            buf: vec![0; FRAME_MAX],
        }
    }

    pub fn fds(&self) -> Vec<i32> {
        self.queues.iter().map(|q| q.as_raw_fd()).collect()
    }

    /// One frame from the first queue (round robin) that has one, header stripped.
    fn read_frame(&mut self) -> Option<Vec<u8>> {
        for i in 0..self.queues.len() {
            let q = (self.next + i) % self.queues.len();
            let fd = self.queues[q].as_raw_fd();
            // SAFETY: reads into a live buffer of the given length from a non-blocking fd.
            let n = unsafe { libc::read(fd, self.buf.as_mut_ptr().cast(), self.buf.len()) };
            if n > VNET_HDR_LEN as isize {
                self.next = (q + 1) % self.queues.len();
                return Some(self.buf[VNET_HDR_LEN..n as usize].to_vec());
            }
        }
        None
    }
}

pub struct RxToken(Vec<u8>);

pub struct TxToken(Arc<OwnedFd>);

impl phy::RxToken for RxToken {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for TxToken {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut frame = vec![0u8; VNET_HDR_LEN + len];
        let r = f(&mut frame[VNET_HDR_LEN..]);
        // A full TAP queue drops the frame, as a NIC's full ring would.
        // SAFETY: writes a live buffer of the given length.
        unsafe { libc::write(self.0.as_raw_fd(), frame.as_ptr().cast(), frame.len()) };
        r
    }
}

impl phy::Device for TapDevice {
    type RxToken<'a> = RxToken;
    type TxToken<'a> = TxToken;

    fn receive(&mut self, _now: Instant) -> Option<(RxToken, TxToken)> {
        let frame = self.read_frame()?;
        Some((RxToken(frame), TxToken(self.queues.first()?.clone())))
    }

    fn transmit(&mut self, _now: Instant) -> Option<TxToken> {
        Some(TxToken(self.queues.first()?.clone()))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = MTU;
        caps
    }
}
