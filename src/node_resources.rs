//! Node capacity and allocatable (N10–N12), read once at startup.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};

#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub cpu: Option<String>,
    pub memory: Option<String>,
    pub storage: Option<String>,
    pub hugepages: Option<String>,
    pub pods: Option<u64>,
    pub reserve_percent: u32,
    pub root_dir: String,
}

/// (capacity, allocatable) as whole-unit integers keyed by resource name.
pub fn compute(o: &Overrides) -> Result<(BTreeMap<String, i128>, BTreeMap<String, i128>)> {
    if o.reserve_percent > 100 {
        bail!(
            "VK_RESERVE_PERCENT must be 0-100, got {}",
            o.reserve_percent
        );
    }
    let q = |name: &str, v: &str| {
        reconcilers::quantity::parse_ceil_units(v)
            .filter(|x| *x >= 0)
            .with_context(|| format!("{name}={v:?} is not a quantity"))
    };
    let meminfo = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    let field = |k: &str| -> Option<i128> {
        meminfo
            .lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
    };
    let mut cap = BTreeMap::new();
    let cpu = match &o.cpu {
        Some(v) => q("VK_NODE_CPU", v)?,
        None => std::thread::available_parallelism()
            .map(|n| n.get() as i128)
            .unwrap_or(1),
    };
    cap.insert("cpu".to_string(), cpu);
    let mem = match &o.memory {
        Some(v) => q("VK_NODE_MEM", v)?,
        None => field("MemTotal:").context("MemTotal missing from /proc/meminfo")? * 1024,
    };
    cap.insert("memory".to_string(), mem);
    let (storage_cap, storage_base) = match &o.storage {
        Some(v) => {
            let s = q("VK_NODE_STORAGE", v)?;
            (s, s)
        }
        None => statfs(&o.root_dir)?,
    };
    cap.insert("ephemeral-storage".to_string(), storage_cap);
    let page_kb = field("Hugepagesize:").unwrap_or(0);
    if page_kb > 0 {
        let value = match &o.hugepages {
            Some(v) => q("VK_NODE_HUGEPAGES", v)?,
            None => field("HugePages_Total:").unwrap_or(0) * page_kb * 1024,
        };
        if value > 0 {
            cap.insert(format!("hugepages-{}", page_size_name(page_kb)), value);
        }
    }
    let pods = o.pods.unwrap_or(256) as i128;
    cap.insert("pods".to_string(), pods);
    let keep = 100 - o.reserve_percent as i128;
    let mut alloc = BTreeMap::new();
    for (k, v) in &cap {
        let base = if k == "ephemeral-storage" {
            storage_base
        } else {
            *v
        };
        let a = if k == "pods" { *v } else { base * keep / 100 };
        alloc.insert(k.clone(), a);
    }
    Ok((cap, alloc))
}

/// A whole-unit value as the apiserver's canonical `resource.Quantity` text writes it, so the
/// Node reads as the Go original wrote it (`512Gi`, not `549755813888`) and a status patch
/// never differs from its echo only in spelling (N12). Byte values are BinarySI: the largest
/// power-of-1024 suffix that keeps the number whole. The rest (cpu, pods), and as in Go a byte
/// value under 1Ki, are DecimalSI: the largest power-of-1000 suffix that keeps it whole.
pub fn canonical(resource: &str, value: i128) -> String {
    let bytes = (matches!(resource, "memory" | "ephemeral-storage" | "storage")
        || resource.starts_with("hugepages-"))
        && value.abs() >= 1024;
    let (step, suffixes): (i128, &[&str]) = match bytes {
        true => (1024, &["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]),
        false => (1000, &["", "k", "M", "G", "T", "P", "E"]),
    };
    let mut n = value;
    let mut i = 0;
    while n != 0 && n % step == 0 && i + 1 < suffixes.len() {
        n /= step;
        i += 1;
    }
    format!("{n}{}", suffixes[i])
}

fn page_size_name(kb: i128) -> String {
    if kb % (1024 * 1024) == 0 {
        format!("{}Gi", kb / (1024 * 1024))
    } else if kb % 1024 == 0 {
        format!("{}Mi", kb / 1024)
    } else {
        format!("{kb}Ki")
    }
}

fn statfs(path: &str) -> Result<(i128, i128)> {
    let c = std::ffi::CString::new(path).context("COCOON_ROOT_DIR contains a NUL byte")?;
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid C string and s a properly sized out-parameter.
    let rc = unsafe { libc::statfs(c.as_ptr(), &mut s) };
    if rc != 0 {
        bail!(
            "statfs({path}) failed: {}; set COCOON_ROOT_DIR to cocoon's root or VK_NODE_STORAGE explicitly",
            std::io::Error::last_os_error()
        );
    }
    let bsize = s.f_bsize as i128;
    Ok((s.f_blocks as i128 * bsize, s.f_bavail as i128 * bsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_rounds_down_and_keeps_pods() {
        let o = Overrides {
            cpu: Some("32".into()),
            memory: Some("100".into()),
            storage: Some("1500m".into()),
            pods: Some(110),
            reserve_percent: 20,
            root_dir: "/".into(),
            ..Overrides::default()
        };
        let (cap, alloc) = compute(&o).unwrap();
        assert_eq!(cap["cpu"], 32);
        assert_eq!(alloc["cpu"], 25);
        assert_eq!(alloc["memory"], 80);
        assert_eq!(cap["ephemeral-storage"], 2);
        assert_eq!(alloc["ephemeral-storage"], 1);
        assert_eq!(alloc["pods"], 110);
        let all = Overrides {
            reserve_percent: 100,
            ..o
        };
        assert_eq!(compute(&all).unwrap().1["cpu"], 0);
    }

    #[test]
    fn quantities_are_written_in_canonical_form() {
        let gi = 1024_i128.pow(3);
        assert_eq!(canonical("memory", 512 * gi), "512Gi");
        assert_eq!(canonical("memory", 640 * gi * 80 / 100), "512Gi");
        assert_eq!(canonical("memory", 512 * gi * 80 / 100), "439804651110");
        assert_eq!(canonical("memory", 3 * gi / 2), "1536Mi");
        assert_eq!(canonical("ephemeral-storage", 1536), "1536");
        assert_eq!(canonical("ephemeral-storage", 1000), "1k");
        assert_eq!(canonical("ephemeral-storage", 1023), "1023");
        assert_eq!(canonical("hugepages-1Gi", 4 * gi), "4Gi");
        assert_eq!(canonical("hugepages-2Mi", 2048 * 1024), "2Mi");
        assert_eq!(canonical("memory", 0), "0");
        assert_eq!(canonical("cpu", 25), "25");
        assert_eq!(canonical("cpu", 640), "640");
        assert_eq!(canonical("cpu", 2000), "2k");
        assert_eq!(canonical("pods", 256), "256");
        assert_eq!(canonical("pods", 1000), "1k");
        assert_eq!(canonical("pods", 1024), "1024");
    }
}
