//! What the VMM and the guest share: the guest's memory, whether its vCPUs run, and the NIC
//! it sees. The VMM changes it and wakes the guest thread through an eventfd; the guest
//! changes only its memory (the value).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::mac::Mac;
use crate::memory::GuestMemory;

#[derive(Clone)]
pub struct NicLink {
    pub mac: Mac,
    pub queues: Vec<Arc<OwnedFd>>,
}

#[derive(Default)]
pub struct GuestView {
    /// `None` while there is no VM (before boot, after shutdown).
    pub memory: Option<GuestMemory>,
    pub running: bool,
    pub nic: Option<NicLink>,
    /// Bumped whenever memory or NIC are replaced, so the guest rebuilds its stack.
    pub generation: u64,
    pub exit: bool,
}

pub struct GuestShared {
    view: Mutex<GuestView>,
    wake: OwnedFd,
}

impl GuestShared {
    pub fn new() -> std::io::Result<Arc<GuestShared>> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Arc::new(GuestShared {
            view: Mutex::new(GuestView::default()),
            // SAFETY: fd is a fresh descriptor nobody else owns.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
        }))
    }

    pub fn lock(&self) -> MutexGuard<'_, GuestView> {
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Changes the view and wakes the guest to act on it.
    pub fn update(&self, f: impl FnOnce(&mut GuestView)) {
        f(&mut self.lock());
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    pub fn wake_fd(&self) -> i32 {
        self.wake.as_raw_fd()
    }

    pub fn clear_wake(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd.
        unsafe { libc::read(self.wake.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
    }
}
