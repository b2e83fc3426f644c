//! Argument rules cocoon applies before doing anything: sizes, VM names, default names.

use crate::error::{fail, Result};

/// docker/go-units `RAMInBytes`: binary multiples, optional `i`/`b` suffix, plain byte counts.
pub fn ram_in_bytes(s: &str) -> Result<i64> {
    let bad = || fail(format!("invalid size: '{s}'"));
    let t = s.trim_end_matches(['b', 'B']);
    let t = t.trim_end_matches(['i', 'I']);
    let (num, mult) = match t.chars().last() {
        Some(c) if c.is_ascii_alphabetic() => {
            let m: i64 = match c.to_ascii_lowercase() {
                'k' => 1 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                't' => 1 << 40,
                'p' => 1 << 50,
                _ => return bad(),
            };
            (&t[..t.len() - 1], m)
        }
        _ => (t, 1),
    };
    let num = num.trim_end_matches(' ');
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return bad();
    }
    match num.parse::<f64>() {
        Ok(v) => Ok((v * mult as f64) as i64),
        Err(_) => bad(),
    }
}

/// cocoon's name rule: an alphanumeric first byte, then up to 62 of alphanumerics, `._-`
/// and the given extra punctuation.
fn valid_name(n: &str, extra: &[u8]) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[1..]
            .iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c) || extra.contains(c))
}

/// go-units' `HumanSize` (cocoon's `FormatSize`): decimal units, four significant digits,
/// trailing zeros dropped as Go's `%.4g` does.
pub fn human_size(bytes: i64) -> String {
    const UNITS: [&str; 9] = ["B", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"];
    let mut size = bytes as f64;
    let mut unit = 0;
    while size >= 1000.0 && unit < UNITS.len() - 1 {
        size /= 1000.0;
        unit += 1;
    }
    let int_digits = if size < 1.0 {
        1
    } else {
        size.log10().floor() as usize + 1
    };
    let mut s = format!("{:.*}", 4usize.saturating_sub(int_digits), size);
    if s.contains('.') {
        s = s.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    format!("{s}{}", UNITS[unit])
}

/// cocoon refuses more vCPUs than the host has (Go's `runtime.NumCPU`: the CPUs this process
/// may run on).
pub fn check_host_cpu(cpu: i64) -> Result<()> {
    let host = host_cpus();
    if cpu > host {
        return fail(format!("requested {cpu} vCPUs exceeds host cores ({host})"));
    }
    Ok(())
}

fn host_cpus() -> i64 {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel fills it in.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
            return libc::CPU_COUNT(&set) as i64;
        }
    }
    std::thread::available_parallelism().map_or(1, |n| n.get() as i64)
}

pub fn valid_vm_name(n: &str) -> bool {
    valid_name(n, b"")
}

/// Snapshot names also allow `:` and `/` (`repo:tag`), as newer cocoon releases do (CLI-2).
pub fn valid_snapshot_name(n: &str) -> bool {
    valid_name(n, b":/")
}

/// `types.VMConfig.Validate`, same order and wording.
pub fn validate_vm(name: &str, cpu: i64, memory: i64, storage: i64) -> Result<()> {
    if name.is_empty() {
        return fail("vm name cannot be empty");
    }
    if !valid_vm_name(name) {
        return fail(format!(
            "vm name {name:?} is invalid: must match ^[a-zA-Z0-9][a-zA-Z0-9._-]{{0,62}}$ (max 63 chars)"
        ));
    }
    if cpu <= 0 {
        return fail(format!("--cpu must be at least 1, got {cpu}"));
    }
    if memory < 512 << 20 {
        return fail(format!("--memory must be at least 512M, got {memory}"));
    }
    if storage < 10 << 30 {
        return fail(format!("--storage must be at least 10G, got {storage}"));
    }
    Ok(())
}

pub fn is_url(image: &str) -> bool {
    image.starts_with("http://") || image.starts_with("https://")
}

/// `sanitizeVMName`: `cocoon-<repo without registry and library/>[-<tag unless latest>]`.
pub fn default_vm_name(image: &str) -> String {
    let fallback = || {
        let mut n = format!("cocoon-{}", image.replace(['/', ':'], "-"));
        n.truncate(63);
        n
    };
    if is_url(image) || image.is_empty() {
        return fallback();
    }
    let without_digest = image.split('@').next().unwrap_or(image);
    let mut parts: Vec<&str> = without_digest.split('/').collect();
    if parts.len() > 1 {
        let first = parts[0];
        if first.contains('.') || first.contains(':') || first == "localhost" {
            parts.remove(0);
        }
    }
    let last = parts.pop().unwrap_or_default();
    let (repo_last, tag) = match last.split_once(':') {
        Some((r, t)) => (r, Some(t)),
        None => (last, None),
    };
    parts.push(repo_last);
    let mut repo = parts.join("/");
    if let Some(stripped) = repo.strip_prefix("library/") {
        repo = stripped.to_string();
    }
    let mut n = format!("cocoon-{}", repo.replace('/', "-"));
    if let Some(t) = tag {
        if t != "latest" && !image.contains('@') {
            n.push('-');
            n.push_str(t);
        }
    }
    n.truncate(63);
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(ram_in_bytes("1G").unwrap(), 1 << 30);
        assert_eq!(ram_in_bytes("512M").unwrap(), 512 << 20);
        assert_eq!(ram_in_bytes("4294967296").unwrap(), 4294967296);
        assert_eq!(ram_in_bytes("2Gi").unwrap(), 2 << 30);
        assert_eq!(ram_in_bytes("1GB").unwrap(), 1 << 30);
        assert!(ram_in_bytes("lots").is_err());
    }

    #[test]
    fn human_sizes_read_like_go_units() {
        assert_eq!(human_size(512 << 20), "536.9MB");
        assert_eq!(human_size(1 << 30), "1.074GB");
        assert_eq!(human_size(10 << 30), "10.74GB");
        assert_eq!(human_size(1000), "1kB");
        assert_eq!(human_size(999), "999B");
        assert_eq!(human_size(0), "0B");
    }

    #[test]
    fn names() {
        assert_eq!(
            default_vm_name("ghcr.io/cocoonstack/cocoon/ubuntu:24.04"),
            "cocoon-cocoonstack-cocoon-ubuntu-24.04"
        );
        assert_eq!(default_vm_name("ubuntu"), "cocoon-ubuntu");
        assert_eq!(default_vm_name("library/ubuntu:latest"), "cocoon-ubuntu");
        assert!(valid_vm_name("vk-default-demo-0"));
        assert!(!valid_vm_name("-x"));
        assert!(valid_snapshot_name("ghcr.io/acme/agent:v2"));
    }
}
