//! Readers of /proc and the cgroup v2 tree (M2). Every reader takes the file's text, so
//! tests feed fixtures; an unreadable value reads as 0.

/// Node CPU seconds from the `cpu ` line of /proc/stat: busy time only (DEC-2). Idle and
/// iowait are left out (summing every column would show metrics-server every core busy), and so
/// are guest/guest_nice, which user/nice already contain.
pub fn node_cpu_seconds(proc_stat: &str, user_hz: f64) -> f64 {
    let Some(line) = proc_stat.lines().find(|l| l.starts_with("cpu ")) else {
        return 0.0;
    };
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    let col = |i: usize| v.get(i).copied().unwrap_or(0.0);
    // user nice system idle iowait irq softirq steal guest guest_nice
    (col(0) + col(1) + col(2) + col(5) + col(6) + col(7)) / user_hz
}

/// (MemTotal − MemAvailable) in bytes.
pub fn node_memory_used(meminfo: &str) -> u64 {
    let kb = |k: &str| -> u64 {
        meminfo
            .lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    kb("MemTotal:").saturating_sub(kb("MemAvailable:")) * 1024
}

/// RSS in bytes: field 24 of /proc/<pid>/stat × page size.
pub fn rss_bytes(pid_stat: &str, page_size: u64) -> u64 {
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let Some(after) = pid_stat.rsplit_once(')').map(|(_, a)| a) else {
        return 0;
    };
    after
        .split_whitespace()
        .nth(21)
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0)
        * page_size
}

#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CpuStat {
    pub usage_seconds: f64,
    pub throttled_seconds: f64,
    pub throttled_periods: f64,
}

/// cgroup v2 `cpu.stat`: usage_usec, throttled_usec, nr_throttled.
pub fn cpu_stat(text: &str) -> CpuStat {
    let get = |k: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    CpuStat {
        usage_seconds: get("usage_usec") / 1e6,
        throttled_seconds: get("throttled_usec") / 1e6,
        throttled_periods: get("nr_throttled"),
    }
}

/// Bytes through one network device, as the kernel counts them on that device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetBytes {
    pub rx: u64,
    pub tx: u64,
}

/// `/proc/<pid>/net/dev`: device → received and transmitted bytes (columns 1 and 9).
pub fn net_dev(text: &str) -> std::collections::BTreeMap<String, NetBytes> {
    text.lines()
        .skip(2)
        .filter_map(|l| {
            let (name, rest) = l.split_once(':')?;
            let v: Vec<u64> = rest
                .split_whitespace()
                .map(|x| x.parse().unwrap_or(0))
                .collect();
            Some((
                name.trim().to_string(),
                NetBytes {
                    rx: *v.first()?,
                    tx: *v.get(8)?,
                },
            ))
        })
        .collect()
}

/// The cgroup v2 mount point, from /proc/self/mountinfo (never assumed: hybrid hosts mount it
/// at /sys/fs/cgroup/unified).
pub fn cgroup2_mount(mountinfo: &str) -> Option<String> {
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (post.split_whitespace().next()? == "cgroup2")
            .then(|| pre.split_whitespace().nth(4).map(str::to_string))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_cpu_leaves_idle_out() {
        let stat = "cpu  100 20 30 1000 50 5 5 0 10 0\ncpu0 1 2 3 4\n";
        assert_eq!(node_cpu_seconds(stat, 100.0), 1.6);
    }

    #[test]
    fn rss_counts_from_the_last_paren() {
        let s = "42 (a (weird) name) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 321 22";
        assert_eq!(rss_bytes(s, 4096), 321 * 4096);
        assert_eq!(rss_bytes("garbage", 4096), 0);
    }

    #[test]
    fn net_dev_reads_rx_and_tx_bytes() {
        let text = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo:    1200      12    0    0    0     0          0         0     1200      12    0    0    0     0       0          0\ntapQ3ZK7M2X-0: 5000 40 0 0 0 0 0 0 7000 50 0 0 0 0 0 0\nbroken: x\n";
        let d = net_dev(text);
        assert_eq!(d["tapQ3ZK7M2X-0"], NetBytes { rx: 5000, tx: 7000 });
        assert_eq!(d["lo"], NetBytes { rx: 1200, tx: 1200 });
        assert!(!d.contains_key("broken"));
    }

    #[test]
    fn cpu_stat_and_mounts() {
        let c =
            cpu_stat("usage_usec 2500000\nuser_usec 1\nthrottled_usec 500000\nnr_throttled 7\n");
        assert_eq!(
            c,
            CpuStat {
                usage_seconds: 2.5,
                throttled_seconds: 0.5,
                throttled_periods: 7.0
            }
        );
        let mi = "30 23 0:26 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw\n31 23 0:27 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n";
        assert_eq!(cgroup2_mount(mi).as_deref(), Some("/sys/fs/cgroup/unified"));
        assert_eq!(
            node_memory_used("MemTotal: 100 kB\nMemAvailable: 40 kB\n"),
            60 * 1024
        );
    }
}
