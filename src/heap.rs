//! How much memory the allocator keeps after the daemon is done with it. glibc gives each
//! thread that meets contention an arena of its own (up to eight per core) and gives freed
//! pages back to the kernel only from the top of each heap, so after a mass create the RSS
//! stayed near its peak long after the pods had settled. The daemon's work is one loop and a
//! few I/O threads: two arenas serve it, and a periodic trim returns what a burst left free.
//! musl's allocator already unmaps freed memory eagerly, so the static build does neither.

use std::time::Duration;

/// How often the free memory a burst left is given back.
const TRIM_EVERY: Duration = Duration::from_secs(30);

/// Before any thread of the runtime starts: arenas are created lazily, by the threads.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// Gives free pages in every arena back to the kernel.
pub fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes the allocator's own locks; it frees nothing in use.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Trims every [`TRIM_EVERY`] for the life of the runtime.
pub fn spawn_trimmer() -> tokio::task::JoinHandle<()> {
    tokio::spawn(async {
        let mut every = tokio::time::interval(TRIM_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        every.tick().await;
        loop {
            every.tick().await;
            // Walks the arenas under their locks: off the runtime's workers.
            let _ = tokio::task::spawn_blocking(trim).await;
        }
    })
}
