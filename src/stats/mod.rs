//! The shared sample (M1): node and per-VM figures read from /proc and the VM cgroup
//! scopes, built from the published views outside any loop lock, and reused for 2 s by every
//! surface so a scrape storm reads the kernel at most once per 2 s.

pub mod procfs;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::views::{Views, VmView};

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
    /// The first NIC's TAP as the host counts it on that device (M2): rx is what the guest
    /// sent, tx what the host delivered to the guest. Swapping them to the guest's view would
    /// break dashboards and alerts written against the TAP's own columns.
    pub net: procfs::NetBytes,
}

#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub node: NodeSample,
    pub vms: Vec<VmSample>,
}

/// Where the figures are read and the kernel units they are read in: the host's for the
/// daemon, a fixture tree's for tests.
#[derive(Clone, Debug)]
pub struct Sources {
    /// The procfs root: `stat`, `meminfo`, `net/dev` and `<pid>/{stat,net/dev}` under it.
    pub proc: PathBuf,
    /// `<cgroup2 mount>/<COCOON_CGROUP_PARENT>`; `None` on a host without cgroup v2.
    pub scopes: Option<PathBuf>,
    pub page_size: u64,
    /// Clock ticks per second, the unit of /proc/stat.
    pub user_hz: f64,
}

impl Sources {
    /// DEC-1: COCOON_CGROUP_PARENT is taken relative to the cgroup v2 mount.
    pub fn host(cgroup_parent: &str) -> Self {
        let scopes = procfs::cgroup2_mount(&read("/proc/self/mountinfo"))
            .map(|m| PathBuf::from(m).join(cgroup_parent.trim_start_matches('/')));
        // SAFETY: sysconf has no preconditions.
        let (hz, page) = unsafe {
            (
                libc::sysconf(libc::_SC_CLK_TCK) as f64,
                libc::sysconf(libc::_SC_PAGESIZE) as u64,
            )
        };
        Self {
            proc: PathBuf::from("/proc"),
            scopes,
            page_size: page,
            user_hz: hz.max(1.0),
        }
    }
}

pub struct Sampler {
    views: Views,
    sources: Sources,
    root_dir: String,
    cache: Mutex<Option<(Instant, Arc<Sample>)>>,
}

fn read(path: impl AsRef<std::path::Path>) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

impl Sampler {
    pub fn new(views: Views, cgroup_parent: &str, root_dir: &str) -> Self {
        Self::with_sources(views, Sources::host(cgroup_parent), root_dir)
    }

    pub fn with_sources(views: Views, sources: Sources, root_dir: &str) -> Self {
        Self {
            views,
            sources,
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

    /// Ages the cached sample past the window, so the next ask builds a new one.
    #[cfg(test)]
    pub(crate) fn expire(&self) {
        if let Some((at, _)) = self.cache.lock().unwrap().as_mut() {
            *at -= FRESH_FOR;
        }
    }

    fn build(&self) -> Sample {
        let src = &self.sources;
        let (avail, total) = statfs(&self.root_dir);
        let node = NodeSample {
            cpu_seconds: procfs::node_cpu_seconds(&read(src.proc.join("stat")), src.user_hz),
            memory_used: procfs::node_memory_used(&read(src.proc.join("meminfo"))),
            storage_available: avail,
            storage_total: total,
        };
        let mut vms: Vec<VmView> = self.views.vms.iter().map(|e| e.value().clone()).collect();
        // Pod order, so every surface lists the VMs the same way from one scrape to the next.
        vms.sort_by(|a, b| (&a.namespace, &a.pod).cmp(&(&b.namespace, &b.pod)));
        // A TAP lives in the hypervisor's network namespace (CNI) or in the host's (bridge
        // mode): the VMM's view is tried first, the host's after it. Each namespace's table is
        // read once per sample: VMMs sharing the host's namespace all see its every TAP, and
        // reading that per VM grows with the square of the VM count.
        let mut tables: BTreeMap<PathBuf, NetTable> = BTreeMap::new();
        let mut host_net: Option<NetTable> = None;
        let mut samples = Vec::with_capacity(vms.len());
        for vm in vms.into_iter().filter(|v| v.pid > 0 && !v.unmanaged) {
            let cpu = src
                .scopes
                .as_ref()
                .map(|s| {
                    procfs::cpu_stat(&read(
                        s.join(format!("vm-{}.scope", vm.vm_id)).join("cpu.stat"),
                    ))
                })
                .unwrap_or_default();
            let pid_dir = src.proc.join(vm.pid.to_string());
            let rss = procfs::rss_bytes(&read(pid_dir.join("stat")), src.page_size);
            let cow_bytes = vm.cow.as_deref().map_or(0, allocated_bytes);
            let net = match vm.taps.first() {
                None => Default::default(),
                Some(tap) => {
                    let own = match std::fs::read_link(pid_dir.join("ns/net")) {
                        Ok(ns) => tables
                            .entry(ns)
                            .or_insert_with(|| procfs::net_dev(&read(pid_dir.join("net/dev"))))
                            .get(tap)
                            .copied(),
                        Err(_) => procfs::net_dev(&read(pid_dir.join("net/dev")))
                            .get(tap)
                            .copied(),
                    };
                    own.or_else(|| {
                        host_net
                            .get_or_insert_with(|| procfs::net_dev(&read(src.proc.join("net/dev"))))
                            .get(tap)
                            .copied()
                    })
                    .unwrap_or_default()
                }
            };
            samples.push(VmSample {
                vm,
                cpu,
                rss,
                cow_bytes,
                net,
            });
        }
        let vms = samples;
        Sample { node, vms }
    }
}

/// One network namespace's devices, by name.
type NetTable = BTreeMap<String, procfs::NetBytes>;

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

#[cfg(test)]
mod tests {
    use super::*;

    /// M1: every surface asking within the freshness window gets the same sample, so a
    /// scrape storm reads the kernel once; what changed meanwhile shows in the next one.
    #[test]
    fn a_sample_is_shared_until_it_goes_stale() {
        let dir = tempfile::tempdir().unwrap();
        let stat = dir.path().join("stat");
        std::fs::write(&stat, "cpu  100 0 100 0 0 0 0 0 0 0\n").unwrap();
        std::fs::write(
            dir.path().join("meminfo"),
            "MemTotal: 1024 kB\nMemAvailable: 512 kB\n",
        )
        .unwrap();
        let sources = Sources {
            proc: dir.path().to_path_buf(),
            scopes: None,
            page_size: 4096,
            user_hz: 100.0,
        };
        let sampler = Sampler::with_sources(Views::default(), sources, "/");
        let first = sampler.sample();
        assert_eq!(first.node.cpu_seconds, 2.0);
        std::fs::write(&stat, "cpu  900 0 100 0 0 0 0 0 0 0\n").unwrap();
        let again = sampler.sample();
        assert!(Arc::ptr_eq(&first, &again), "read again within the window");
        sampler.expire();
        let fresh = sampler.sample();
        assert!(!Arc::ptr_eq(&first, &fresh));
        assert_eq!(fresh.node.cpu_seconds, 10.0);
    }

    /// DEC-3: a sparse COW disk counts the blocks it holds, not the size it claims, so a fresh
    /// clone of a 1 GiB disk shows what the guest wrote.
    #[test]
    fn cow_size_is_the_allocated_bytes_not_the_apparent_size() {
        use std::io::{Seek, SeekFrom, Write};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cow.raw");
        let mut f = std::fs::File::create(&path).unwrap();
        f.set_len(1 << 30).unwrap();
        f.seek(SeekFrom::Start(1 << 20)).unwrap();
        f.write_all(&[7u8; 65536]).unwrap();
        f.sync_all().unwrap();
        let got = allocated_bytes(path.to_str().unwrap());
        assert!((65536..1 << 24).contains(&got), "{got} bytes allocated");
        assert_eq!(allocated_bytes("/nonexistent/cow.raw"), 0);
    }
}
