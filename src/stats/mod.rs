//! The shared sample (M1): node and per-VM figures read from /proc and the VM cgroup
//! scopes, built from the published views outside any loop lock, and reused for 2 s by every
//! surface so a scrape storm reads the kernel at most once per 2 s.

pub mod procfs;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::runtime::views::{Views, VmView};

const FRESH_FOR: Duration = Duration::from_secs(2);

#[derive(Clone, Debug, Default)]
pub struct NodeSample {
    pub cpu_seconds: f64,
    pub memory_used: u64,
    pub storage_available: u64,
    pub storage_total: u64,
}

#[derive(Clone, Debug)]
pub struct VmSample {
    pub vm: VmView,
    pub cpu: procfs::CpuStat,
    pub rss: u64,
    /// Allocated bytes of the COW disk (sparse files count what they hold, not their size).
    pub cow_bytes: u64,
    /// Through the VM's TAPs, seen from the guest: a TAP's transmit is the guest's receive.
    pub net: procfs::NetBytes,
}

#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub node: NodeSample,
    pub vms: Vec<VmSample>,
}

pub struct Sampler {
    views: Views,
    /// `<cgroup2 mount>/<COCOON_CGROUP_PARENT>`; `None` on a host without cgroup v2.
    scopes: Option<PathBuf>,
    root_dir: String,
    cache: Mutex<Option<(Instant, Arc<Sample>)>>,
}

fn read(path: impl AsRef<std::path::Path>) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

impl Sampler {
    /// DEC-1: COCOON_CGROUP_PARENT is taken relative to the cgroup v2 mount.
    pub fn new(views: Views, cgroup_parent: &str, root_dir: &str) -> Self {
        let scopes = procfs::cgroup2_mount(&read("/proc/self/mountinfo"))
            .map(|m| PathBuf::from(m).join(cgroup_parent.trim_start_matches('/')));
        Self {
            views,
            scopes,
            root_dir: root_dir.to_string(),
            cache: Mutex::new(None),
        }
    }

    pub fn sample(&self) -> Arc<Sample> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, s)) = cache.as_ref() {
            if at.elapsed() < FRESH_FOR {
                return s.clone();
            }
        }
        let s = Arc::new(self.build());
        *cache = Some((Instant::now(), s.clone()));
        s
    }

    fn build(&self) -> Sample {
        // SAFETY: sysconf has no preconditions.
        let (hz, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK) as f64,
                libc::sysconf(libc::_SC_PAGESIZE) as u64,
            )
        };
        let (avail, total) = statfs(&self.root_dir);
        let node = NodeSample {
            cpu_seconds: procfs::node_cpu_seconds(&read("/proc/stat"), hz.max(1.0)),
            memory_used: procfs::node_memory_used(&read("/proc/meminfo")),
            storage_available: avail,
            storage_total: total,
        };
        let vms: Vec<VmView> = self.views.vms.iter().map(|e| e.value().clone()).collect();
        // A TAP lives in the hypervisor's network namespace (CNI) or in the host's (bridge
        // mode): the VMM's /proc view is tried first, the host's once per sample after it.
        let host_net = std::sync::OnceLock::new();
        let vms = vms
            .into_iter()
            .filter(|v| v.pid > 0 && !v.unmanaged)
            .map(|vm| {
                let cpu = self
                    .scopes
                    .as_ref()
                    .map(|s| {
                        procfs::cpu_stat(&read(
                            s.join(format!("vm-{}.scope", vm.vm_id)).join("cpu.stat"),
                        ))
                    })
                    .unwrap_or_default();
                let rss = procfs::rss_bytes(&read(format!("/proc/{}/stat", vm.pid)), page);
                let cow_bytes = vm.cow.as_deref().map_or(0, allocated_bytes);
                let own = procfs::net_dev(&read(format!("/proc/{}/net/dev", vm.pid)));
                let net = vm
                    .taps
                    .iter()
                    .fold(procfs::NetBytes::default(), |sum, tap| {
                        let dev = own.get(tap).copied().or_else(|| {
                            host_net
                                .get_or_init(|| procfs::net_dev(&read("/proc/net/dev")))
                                .get(tap)
                                .copied()
                        });
                        let dev = dev.unwrap_or_default();
                        procfs::NetBytes {
                            rx: sum.rx + dev.tx,
                            tx: sum.tx + dev.rx,
                        }
                    });
                VmSample {
                    vm,
                    cpu,
                    rss,
                    cow_bytes,
                    net,
                }
            })
            .collect();
        Sample { node, vms }
    }
}

fn allocated_bytes(path: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).map_or(0, |m| m.blocks() * 512)
}

fn statfs(path: &str) -> (u64, u64) {
    let Ok(c) = std::ffi::CString::new(path) else {
        return (0, 0);
    };
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid C string and s a properly sized out-parameter.
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return (0, 0);
    }
    let b = s.f_bsize as u64;
    (s.f_bavail as u64 * b, s.f_blocks as u64 * b)
}
