//! The VmConfig as cloud-hypervisor serialises it (vm.info's `config`, a snapshot's
//! config.json), built from the command line. It stays a JSON value: a restored config.json
//! that cocoon patched keeps every field it carries, as cloud-hypervisor's serde does.

use serde_json::{json, Value};

use crate::cli::VmParams;
use crate::options::Options;

const DISK_KEYS: &[&str] = &[
    "path",
    "readonly",
    "direct",
    "iommu",
    "num_queues",
    "queue_size",
    "vhost_user",
    "socket",
    "id",
    "pci_segment",
    "serial",
    "queue_affinity",
    "backing_files",
    "sparse",
    "image_type",
    "rate_limit_group",
];
const NET_KEYS: &[&str] = &[
    "tap",
    "ip",
    "mask",
    "mac",
    "host_mac",
    "mtu",
    "iommu",
    "num_queues",
    "queue_size",
    "id",
    "vhost_user",
    "socket",
    "vhost_mode",
    "fd",
    "pci_segment",
    "offload_tso",
    "offload_ufo",
    "offload_csum",
];

pub fn from_params(p: &VmParams) -> Result<Value, String> {
    let cpus = Options::parse(&p.cpus, &["boot", "max", "kvm_hyperv", "topology"])
        .map_err(|e| format!("Error parsing --cpus: {e}"))?;
    let boot = cpus.number("boot")?.unwrap_or(1);
    let memory = Options::parse(
        &p.memory,
        &["size", "hugepages", "shared", "prefault", "thp"],
    )
    .map_err(|e| format!("Error parsing --memory: {e}"))?;
    let disks = p
        .disks
        .iter()
        .map(|d| disk(d).map_err(|e| format!("Error parsing --disk: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let nets = p
        .nets
        .iter()
        .map(|n| net(n).map_err(|e| format!("Error parsing --net: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let rng = Options::parse(&p.rng, &["src", "iommu"])
        .map_err(|e| format!("Error parsing --rng: {e}"))?;
    let balloon = p
        .balloon
        .as_deref()
        .map(balloon)
        .transpose()
        .map_err(|e| format!("Error parsing --balloon: {e}"))?;
    Ok(json!({
        "cpus": {
            "boot_vcpus": boot,
            "max_vcpus": cpus.number("max")?.unwrap_or(boot),
            "topology": null,
            "kvm_hyperv": cpus.toggle("kvm_hyperv")?.unwrap_or(false),
            "max_phys_bits": 46,
            "affinity": null,
            "features": {},
        },
        "memory": {
            "size": memory.number("size")?.unwrap_or(512 << 20),
            "mergeable": false,
            "hotplug_method": "Acpi",
            "hotplug_size": null,
            "hotplugged_size": null,
            "shared": memory.toggle("shared")?.unwrap_or(false),
            "hugepages": memory.toggle("hugepages")?.unwrap_or(false),
            "hugepage_size": null,
            "prefault": memory.toggle("prefault")?.unwrap_or(false),
            "zones": null,
            "thp": memory.toggle("thp")?.unwrap_or(true),
        },
        "payload": {
            "firmware": p.firmware,
            "kernel": p.kernel,
            "cmdline": p.cmdline,
            "initramfs": p.initramfs,
        },
        "rate_limit_groups": null,
        "disks": if disks.is_empty() { Value::Null } else { Value::Array(disks) },
        "net": if nets.is_empty() { Value::Null } else { Value::Array(nets) },
        "rng": { "src": rng.get("src").unwrap_or("/dev/urandom"), "iommu": false },
        "balloon": balloon,
        "fs": null,
        "pmem": null,
        "serial": console_config(&p.serial).map_err(|e| format!("Error parsing --serial: {e}"))?,
        "console": console_config(&p.console).map_err(|e| format!("Error parsing --console: {e}"))?,
        "devices": null,
        "user_devices": null,
        "vdpa": null,
        "vsock": null,
        "pvpanic": false,
        "iommu": false,
        "numa": null,
        "watchdog": p.watchdog,
        "pci_segments": null,
        "platform": null,
        "tpm": null,
        "preserved_fds": null,
        "landlock_enable": false,
        "landlock_rules": null,
    }))
}

fn disk(arg: &str) -> Result<Value, String> {
    let o = Options::parse(arg, DISK_KEYS)?;
    let path = o.get("path").ok_or("missing path")?;
    let image_type = match o.get("image_type").map(str::to_ascii_lowercase).as_deref() {
        None => "Unknown",
        Some("raw") => "Raw",
        Some("qcow2") => "Qcow2",
        Some("vhd") => "FixedVhd",
        Some("vhdx") => "Vhdx",
        Some(other) => return Err(format!("invalid image_type: {other}")),
    };
    Ok(json!({
        "path": path,
        "readonly": o.toggle("readonly")?.unwrap_or(false),
        "direct": o.toggle("direct")?.unwrap_or(false),
        "iommu": o.toggle("iommu")?.unwrap_or(false),
        "num_queues": o.number("num_queues")?.unwrap_or(1),
        "queue_size": o.number("queue_size")?.unwrap_or(128),
        "vhost_user": false,
        "vhost_socket": null,
        "rate_limit_group": o.get("rate_limit_group"),
        "rate_limiter_config": null,
        "id": o.get("id"),
        "disable_io_uring": false,
        "disable_aio": false,
        "pci_segment": o.number("pci_segment")?.unwrap_or(0),
        "serial": o.get("serial"),
        "queue_affinity": o.get("queue_affinity").map(queue_affinity).transpose()?,
        "backing_files": o.toggle("backing_files")?.unwrap_or(false),
        "sparse": o.toggle("sparse")?.unwrap_or(true),
        "image_type": image_type,
    }))
}

/// `[0@[0],1@[1,2]]` → `[{"queue_index":0,"host_cpus":[0]},…]`.
fn queue_affinity(v: &str) -> Result<Value, String> {
    let bad = || format!("invalid queue_affinity: {v}");
    let inner = v
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .ok_or_else(bad)?;
    let mut out = Vec::new();
    for entry in inner.split("],").filter(|e| !e.is_empty()) {
        let (q, cpus) = entry.split_once("@[").ok_or_else(bad)?;
        let cpus: Vec<u64> = cpus
            .trim_end_matches(']')
            .split(',')
            .map(|c| c.parse().map_err(|_| bad()))
            .collect::<Result<_, _>>()?;
        out.push(json!({ "queue_index": q.parse::<u64>().map_err(|_| bad())?, "host_cpus": cpus }));
    }
    Ok(Value::Array(out))
}

pub fn net(arg: &str) -> Result<Value, String> {
    let o = Options::parse(arg, NET_KEYS)?;
    let mac = match o.get("mac") {
        Some(m) => crate::mac::parse(m).ok_or_else(|| format!("invalid mac: {m}"))?,
        None => crate::mac::random(),
    };
    Ok(json!({
        "tap": o.get("tap"),
        "ip": o.get("ip"),
        "mask": o.get("mask"),
        "mac": crate::mac::format(&mac),
        "host_mac": o.get("host_mac"),
        "mtu": o.number("mtu")?,
        "iommu": o.toggle("iommu")?.unwrap_or(false),
        "num_queues": o.number("num_queues")?.unwrap_or(2),
        "queue_size": o.number("queue_size")?.unwrap_or(256),
        "vhost_user": false,
        "vhost_socket": null,
        "vhost_mode": "Client",
        "id": o.get("id"),
        "fds": null,
        "rate_limiter_config": null,
        "pci_segment": o.number("pci_segment")?.unwrap_or(0),
        "offload_tso": o.toggle("offload_tso")?.unwrap_or(true),
        "offload_ufo": o.toggle("offload_ufo")?.unwrap_or(true),
        "offload_csum": o.toggle("offload_csum")?.unwrap_or(true),
    }))
}

fn balloon(arg: &str) -> Result<Value, String> {
    let o = Options::parse(arg, &["size", "deflate_on_oom", "free_page_reporting"])?;
    Ok(json!({
        "id": null,
        "size": o.number("size")?.unwrap_or(0),
        "deflate_on_oom": o.toggle("deflate_on_oom")?.unwrap_or(false),
        "free_page_reporting": o.toggle("free_page_reporting")?.unwrap_or(false),
        "pci_segment": 0,
    }))
}

/// `off`, `null`, `pty`, `tty`, `file=…`, `socket=…` → `{"file","mode","iommu","socket"}`.
fn console_config(arg: &str) -> Result<Value, String> {
    let (mode, file, socket) = match arg {
        "off" => ("Off", None, None),
        "null" => ("Null", None, None),
        "pty" => ("Pty", None, None),
        "tty" => ("Tty", None, None),
        other => match other.split_once('=') {
            Some(("file", f)) => ("File", Some(f), None),
            Some(("socket", s)) => ("Socket", None, Some(s)),
            _ => return Err(format!("invalid console mode: {other}")),
        },
    };
    Ok(json!({ "file": file, "mode": mode, "iommu": false, "socket": socket }))
}

/// Gives every disk and NIC without one an id, in cloud-hypervisor's order and with its
/// shared counter: disks first (`_disk0`, `_disk1`), then NICs (`_net2`, …).
pub fn assign_ids(config: &mut Value, counter: &mut u64) {
    for key in ["disks", "net"] {
        let prefix = if key == "disks" { "_disk" } else { "_net" };
        let taken = ids(config);
        if let Some(Value::Array(items)) = config.get_mut(key) {
            for item in items {
                if item.get("id").is_none_or(Value::is_null) {
                    item["id"] = Value::String(next_id(prefix, counter, &taken));
                }
            }
        }
    }
}

pub fn next_id(prefix: &str, counter: &mut u64, taken: &[String]) -> String {
    loop {
        let name = format!("{prefix}{counter}");
        *counter += 1;
        if !taken.contains(&name) {
            return name;
        }
    }
}

/// Every device id the config names.
pub fn ids(config: &Value) -> Vec<String> {
    ["disks", "net"]
        .iter()
        .filter_map(|k| config.get(*k).and_then(Value::as_array))
        .flatten()
        .filter_map(|d| d.get("id").and_then(Value::as_str).map(str::to_string))
        .collect()
}

pub fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    path.iter().try_fold(v, |v, k| v.get(*k))?.as_str()
}
