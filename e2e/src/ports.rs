//! Free loopback ports.

use std::collections::HashSet;
use std::net::TcpListener;
use std::sync::Mutex;

use anyhow::Result;

/// A port the kernel just handed out on 127.0.0.1. The listener is closed before the caller
/// binds, so two calls in one process could otherwise return the same port; remembering what
/// was handed out closes that window for tests running in parallel threads.
pub fn free_port() -> Result<u16> {
    static TAKEN: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    loop {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
        if taken.get_or_insert_with(HashSet::new).insert(port) {
            return Ok(port);
        }
    }
}
