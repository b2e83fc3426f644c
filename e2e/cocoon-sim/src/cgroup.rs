//! Per-VM cgroup v2 scopes `<parent>/vm-<ID>.scope`, so `cpu.stat` readers see real numbers.
//! The cgroup2 mount is looked up in mountinfo: on hybrid hosts it is not /sys/fs/cgroup.

use std::fs;
use std::path::PathBuf;

use crate::config::Env;

pub fn cgroup2_mount() -> Option<PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|line| {
        let (pre, post) = line.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        let mount = pre.split_whitespace().nth(4)?;
        Some(PathBuf::from(mount.replace("\\040", " ")))
    })
}

pub fn parent_dir(env: &Env) -> Option<PathBuf> {
    Some(cgroup2_mount()?.join(env.cgroup_parent.as_ref()?))
}

/// Creates the scope and returns its path, or `None` when cgroup v2 is absent or read-only.
pub fn create_scope(env: &Env, id: &str) -> Option<PathBuf> {
    let scope = parent_dir(env)?.join(format!("vm-{id}.scope"));
    // Another root's cleanup may rmdir the shared parent between our two mkdirs: retry.
    for _ in 0..3 {
        if fs::create_dir_all(&scope).is_ok() {
            return scope.join("cgroup.procs").exists().then_some(scope);
        }
    }
    None
}

pub fn remove_scope(path: &str) {
    if path.is_empty() {
        return;
    }
    for _ in 0..50 {
        match fs::remove_dir(path) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            // EBUSY until the killed guest has fully exited.
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(20)),
        }
    }
}

pub fn remove_parent_if_empty(env: &Env) {
    if let Some(p) = parent_dir(env) {
        let _ = fs::remove_dir(p);
    }
}
