//! Decoding a pod into the VM it asks for (ANN-1, ANN-2). A bad value is a typed
//! error naming the key, so the pod can be failed with a message a person can act on.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::keys;
use crate::names;
use crate::pod::PodView;
use crate::quantity;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Run,
    Clone,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Os {
    Linux,
    Windows,
    Android,
    Macos,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Backend {
    #[serde(rename = "cloud-hypervisor")]
    CloudHypervisor,
    #[serde(rename = "firecracker")]
    Firecracker,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::CloudHypervisor => "cloud-hypervisor",
            Backend::Firecracker => "firecracker",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SnapshotPolicy {
    Always,
    MainOnly,
    Never,
}

/// Host cgroup CPU policy (ANN-2.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuPolicy {
    pub weight: u32,
    pub quota_us: Option<u64>,
    pub period_us: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmSpec {
    pub vm_name: String,
    pub managed: bool,
    pub mode: Mode,
    pub image: String,
    pub os: Os,
    pub backend: Backend,
    pub storage_bytes: Option<i128>,
    pub network: Option<String>,
    pub snapshot_policy: SnapshotPolicy,
    pub force_pull: bool,
    pub no_direct_io: bool,
    pub fork_from: Option<String>,
    pub clone_from_dir: Option<String>,
    pub probe_port: Option<u16>,
    pub hibernate: bool,
    pub restore_from_hibernate: bool,
    pub keep_snapshot_on_delete: bool,
    pub cpu_class: Option<String>,
    /// vCPUs for `vm run`: the limit rounded up, else the request.
    pub vcpus: Option<i128>,
    /// Guest memory for `vm run` in bytes: the request, else the limit.
    pub memory_bytes: Option<i128>,
    pub cpu: CpuPolicy,
    /// Unmanaged pods: the pre-written runtime annotations.
    pub static_id: Option<String>,
    pub static_ip: Option<String>,
}

/// A pod's role in its CocoonSet (ANN-2.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Main,
    SubAgent,
    Toolbox,
}

impl VmSpec {
    /// U3, U7: a cloud-hypervisor Windows guest hibernates without its NIC (the snapshot
    /// holds none), and its wake hot-adds a fresh one.
    pub fn drops_nic(&self) -> bool {
        self.os == Os::Windows && self.backend == Backend::CloudHypervisor
    }

    /// ANN-2.4: slot N of `vk-<namespace>-<cocoonset>-<N>` under a CocoonSet owner; slot 0 is
    /// the main agent, any other slot a sub-agent, anything else a toolbox.
    pub fn role(&self, pod: &PodView) -> Role {
        let set = pod
            .owners
            .iter()
            .find(|o| o.kind == "CocoonSet")
            .map(|o| o.name.as_str())
            .unwrap_or_default();
        let prefix = format!("vk-{}-{set}-", pod.namespace);
        let slot = self
            .vm_name
            .strip_prefix(&prefix)
            .filter(|_| !set.is_empty());
        match slot {
            Some(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                match n.trim_start_matches('0').is_empty() {
                    true => Role::Main,
                    false => Role::SubAgent,
                }
            }
            Some(_) | None => Role::Toolbox,
        }
    }

    /// D4 / ANN-2.5: whether DeletePod saves and pushes this VM to `<vm>:latest`.
    pub fn snapshot_on_delete(&self, pod: &PodView) -> bool {
        // macOS guests are never pushed; unmanaged VMs are not vk's to save.
        if !self.managed || self.os == Os::Macos {
            return false;
        }
        match self.snapshot_policy {
            SnapshotPolicy::Never => false,
            SnapshotPolicy::MainOnly => self.role(pod) == Role::Main,
            SnapshotPolicy::Always => true,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecError {
    /// The annotation key or pod field at fault.
    pub key: String,
    pub message: String,
    /// The key is absent (rather than present with a bad value).
    #[serde(default)]
    pub missing: bool,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

fn missing(key: &str, message: impl Into<String>) -> SpecError {
    SpecError {
        missing: true,
        ..err(key, message)
    }
}

fn err(key: &str, message: impl Into<String>) -> SpecError {
    SpecError {
        missing: false,
        key: key.to_string(),
        message: message.into(),
    }
}

fn text<'a>(pod: &'a PodView, key: &str) -> Option<&'a str> {
    pod.annotation(key).map(str::trim).filter(|v| !v.is_empty())
}

pub fn decode(pod: &PodView) -> Result<VmSpec, SpecError> {
    let vm_name = text(pod, keys::VM_NAME)
        .ok_or_else(|| missing(keys::VM_NAME, "missing: the pod must name its VM"))?;
    if !names::valid_vm_name(vm_name) {
        return Err(err(
            keys::VM_NAME,
            format!("{vm_name:?} is not a valid VM name (^[a-zA-Z0-9][a-zA-Z0-9._-]{{0,62}}$)"),
        ));
    }
    let managed = pod.flag(keys::MANAGED);
    let mode = match text(pod, keys::MODE) {
        Some(m) if m.eq_ignore_ascii_case("run") => Mode::Run,
        _ => Mode::Clone,
    };
    let (os, backend) = os_and_backend(pod)?;
    let image = text(pod, keys::IMAGE).unwrap_or_default().to_string();
    if managed && !image.is_empty() && !names::valid_image_ref(&image) {
        return Err(err(
            keys::IMAGE,
            format!("{image:?} is not a valid image reference"),
        ));
    }
    let storage_bytes = match text(pod, keys::STORAGE) {
        None => None,
        Some(q) => Some(
            quantity::parse_ceil_units(q)
                .filter(|v| *v > 0)
                .ok_or_else(|| err(keys::STORAGE, format!("{q:?} is not a positive quantity")))?,
        ),
    };
    let network = match text(pod, keys::NETWORK) {
        None => None,
        Some(n) if names::valid_network(n) => Some(n.to_string()),
        Some(n) => {
            return Err(err(
                keys::NETWORK,
                format!("{n:?} is not a valid network name"),
            ))
        }
    };
    let snapshot_policy = match text(pod, keys::SNAPSHOT_POLICY) {
        Some("never") => SnapshotPolicy::Never,
        Some("main-only") => SnapshotPolicy::MainOnly,
        _ => SnapshotPolicy::Always,
    };
    let (fork_from, clone_from_dir) = sources(pod, managed, mode)?;
    let probe_port = match text(pod, keys::PROBE_PORT) {
        None => None,
        Some(p) => Some(p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
            err(
                keys::PROBE_PORT,
                format!("{p:?} is not a port number (1-65535)"),
            )
        })?),
    };
    if managed
        && image.is_empty()
        && clone_from_dir.is_none()
        && fork_from.is_none()
        && os != Os::Macos
    {
        return Err(missing(
            keys::IMAGE,
            "missing: a managed VM needs an image to run or clone",
        ));
    }
    let (vcpus, memory_bytes, cpu) = resources(pod)?;
    let (static_id, static_ip) = match managed {
        true => (None, None),
        false => unmanaged_vm(pod)?,
    };
    Ok(VmSpec {
        vm_name: vm_name.to_string(),
        managed,
        mode,
        image,
        os,
        backend,
        storage_bytes,
        network,
        snapshot_policy,
        force_pull: pod.flag(keys::FORCE_PULL),
        no_direct_io: pod.flag(keys::NO_DIRECT_IO),
        fork_from,
        clone_from_dir,
        probe_port,
        hibernate: pod.flag(keys::HIBERNATE),
        restore_from_hibernate: pod.flag(keys::RESTORE_FROM_HIBERNATE),
        keep_snapshot_on_delete: pod.flag(keys::KEEP_SNAPSHOT_ON_DELETE),
        cpu_class: pod.node_selector.get(keys::CPU_CLASS_SELECTOR).cloned(),
        vcpus,
        memory_bytes,
        cpu,
        static_id,
        static_ip,
    })
}

/// The guest OS and the hypervisor.
fn os_and_backend(pod: &PodView) -> Result<(Os, Backend), SpecError> {
    let os = match text(pod, keys::OS).map(str::to_ascii_lowercase).as_deref() {
        None | Some("linux") => Os::Linux,
        Some("windows") => Os::Windows,
        Some("android") => Os::Android,
        Some("macos") => Os::Macos,
        Some(other) => {
            return Err(err(
                keys::OS,
                format!("{other:?} is not one of linux, windows, android, macos"),
            ))
        }
    };
    let backend = match text(pod, keys::BACKEND) {
        None | Some("cloud-hypervisor") => Backend::CloudHypervisor,
        Some("firecracker") => Backend::Firecracker,
        Some(other) => {
            return Err(err(
                keys::BACKEND,
                format!("{other:?} is not cloud-hypervisor or firecracker"),
            ))
        }
    };
    Ok((os, backend))
}

/// `fork-from` and `clone-from-dir`, which exclude each other and `mode=run` (C3).
fn sources(
    pod: &PodView,
    managed: bool,
    mode: Mode,
) -> Result<(Option<String>, Option<String>), SpecError> {
    let fork_from = match text(pod, keys::FORK_FROM) {
        None => None,
        Some(f) if names::valid_vm_name(f) => Some(f.to_string()),
        Some(f) => {
            return Err(err(
                keys::FORK_FROM,
                format!("{f:?} is not a valid VM name"),
            ))
        }
    };
    let clone_from_dir = match text(pod, keys::CLONE_FROM_DIR) {
        None => None,
        Some(d) => Some(canonical_dir(d).ok_or_else(|| {
            err(
                keys::CLONE_FROM_DIR,
                format!("{d:?} is not an absolute, canonical path"),
            )
        })?),
    };
    if managed && clone_from_dir.is_some() {
        if mode == Mode::Run {
            return Err(err(
                keys::CLONE_FROM_DIR,
                "cannot be combined with mode=run",
            ));
        }
        if fork_from.is_some() {
            return Err(err(
                keys::CLONE_FROM_DIR,
                format!("cannot be combined with {}", keys::FORK_FROM),
            ));
        }
    }
    Ok((fork_from, clone_from_dir))
}

/// C5: the VM an unmanaged pod brings, by its `id` and `ip` annotations.
fn unmanaged_vm(pod: &PodView) -> Result<(Option<String>, Option<String>), SpecError> {
    let id = text(pod, keys::VM_ID).ok_or_else(|| {
        missing(
            keys::VM_ID,
            "missing: an unmanaged pod must carry its VM id",
        )
    })?;
    let ip = text(pod, keys::VM_IP).ok_or_else(|| {
        missing(
            keys::VM_IP,
            "missing: an unmanaged pod must carry its VM ip",
        )
    })?;
    if ip.parse::<core::net::Ipv4Addr>().is_err() {
        return Err(err(keys::VM_IP, format!("{ip:?} is not an IPv4 address")));
    }
    if !crate::names::valid_vm_id(id) {
        return Err(err(
            keys::VM_ID,
            format!("{id:?} is not a VM id (letters, digits, '.', '_', '-'; 63 at most)"),
        ));
    }
    Ok((Some(id.to_string()), Some(ip.to_string())))
}

/// Absolute and unchanged by path cleaning (no `.`/`..`/`//`/trailing `/`).
fn canonical_dir(d: &str) -> Option<String> {
    if !d.starts_with('/') || d.bytes().any(|c| c.is_ascii_control()) {
        return None;
    }
    if d == "/" {
        return Some(d.to_string());
    }
    let ok = d[1..]
        .split('/')
        .all(|seg| !seg.is_empty() && seg != "." && seg != "..");
    ok.then(|| d.to_string())
}

type Res = (Option<i128>, Option<i128>, CpuPolicy);

fn resources(pod: &PodView) -> Result<Res, SpecError> {
    let Some(c) = pod.containers.first() else {
        return Ok((
            None,
            None,
            CpuPolicy {
                weight: 1,
                quota_us: None,
                period_us: None,
            },
        ));
    };
    let q = |map: &std::collections::BTreeMap<String, String>,
             name: &str,
             field: &str|
     -> Result<Option<i128>, SpecError> {
        match map.get(name) {
            None => Ok(None),
            Some(v) => quantity::parse_milli(v)
                .filter(|m| *m >= 0)
                .map(Some)
                .ok_or_else(|| {
                    err(
                        &format!("spec.containers[0].resources.{field}.{name}"),
                        format!("{v:?} is not a quantity"),
                    )
                }),
        }
    };
    let cpu_req = q(&c.resources.requests, "cpu", "requests")?;
    let cpu_lim = q(&c.resources.limits, "cpu", "limits")?;
    let mem_req = q(&c.resources.requests, "memory", "requests")?;
    let mem_lim = q(&c.resources.limits, "memory", "limits")?;
    let vcpus = cpu_lim
        .or(cpu_req)
        .map(|m| (m + 999) / 1000)
        .filter(|v| *v > 0);
    let memory_bytes = mem_req
        .or(mem_lim)
        .map(|m| (m + 999) / 1000)
        .filter(|v| *v > 0);
    Ok((vcpus, memory_bytes, cpu_policy(cpu_req, cpu_lim)))
}

/// kubelet's cgroup-v2 mapping: shares = clamp(m·1024/1000, 2, 262144);
/// weight = 1 + (shares−2)·9999/262142; quota only with a limit.
pub fn cpu_policy(request_milli: Option<i128>, limit_milli: Option<i128>) -> CpuPolicy {
    let weight = match request_milli.or(limit_milli) {
        None => 1,
        Some(m) => {
            let shares = (m.saturating_mul(1024) / 1000).clamp(2, 262_144);
            (1 + (shares - 2) * 9999 / 262_142) as u32
        }
    };
    // quota = m × period (100 000 µs) / 1000. A limit of more than ~1.8·10^14 CPUs (the
    // pod's own text) needs more than u64 µs: saturate instead of letting `as u64` wrap it
    // into a small quota that would throttle the VM.
    let (quota_us, period_us) = match limit_milli {
        Some(m) => {
            let quota = m.saturating_mul(100).max(1000);
            (
                Some(u64::try_from(quota).unwrap_or(u64::MAX)),
                Some(100_000),
            )
        }
        None => (None, None),
    };
    CpuPolicy {
        weight: weight.max(1),
        quota_us,
        period_us,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::{Container, Resources};
    use crate::quantity::MAX_MILLI;

    fn run_pod(annotations: &[(&str, &str)], requests: &[(&str, &str)]) -> PodView {
        let mut pod = PodView {
            namespace: "default".into(),
            name: "a".into(),
            containers: vec![Container {
                name: "agent".into(),
                resources: Resources {
                    requests: requests
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    ..Resources::default()
                },
                ..Container::default()
            }],
            ..PodView::default()
        };
        for (k, v) in [
            (keys::VM_NAME, "vk-a"),
            (keys::MANAGED, "true"),
            (keys::MODE, "run"),
            (keys::IMAGE, "ubuntu:24.04"),
        ]
        .iter()
        .chain(annotations)
        {
            pod.annotations.insert(k.to_string(), v.to_string());
        }
        pod
    }

    /// A size past i64 would be journaled in a `vm run` that replay cannot read back
    /// (`output::cocoon::opt_i128`): the pod is refused with the key at fault instead.
    #[test]
    fn a_size_too_large_for_the_journal_is_refused() {
        let e = decode(&run_pod(&[], &[("memory", "1444444444444444444Gi")])).unwrap_err();
        assert_eq!(e.key, "spec.containers[0].resources.requests.memory");
        let e = decode(&run_pod(&[(keys::STORAGE, "100Ei")], &[])).unwrap_err();
        assert_eq!(e.key, keys::STORAGE);
        let ok = decode(&run_pod(&[(keys::STORAGE, "7Ei")], &[("memory", "4Gi")])).unwrap();
        assert_eq!(ok.storage_bytes, Some(7 << 60));
    }

    /// A 36-digit CPU request parsed (its thousandths fit i128) and then overflowed
    /// `m * 1024` in `cpu_policy`: a panic in debug builds, a wrapped weight in release.
    #[test]
    fn a_36_digit_cpu_request_is_a_spec_error_not_an_overflow() {
        let digits = "123456789012345678901234567890123456";
        let e = decode(&run_pod(&[], &[("cpu", digits)])).unwrap_err();
        assert_eq!(e.key, "spec.containers[0].resources.requests.cpu");
    }

    /// The quota of a limit beyond u64 µs saturates instead of wrapping to a small one.
    #[test]
    fn a_huge_cpu_limit_saturates_the_quota() {
        let p = cpu_policy(None, Some(MAX_MILLI));
        assert_eq!((p.quota_us, p.weight), (Some(u64::MAX), 10_000));
        let p = cpu_policy(Some(i128::MAX), Some(i128::MAX));
        assert_eq!((p.quota_us, p.weight), (Some(u64::MAX), 10_000));
        let p = cpu_policy(Some(500), Some(1500));
        assert_eq!((p.quota_us, p.period_us), (Some(150_000), Some(100_000)));
    }
}
