//! VM lifecycle verbs: run, clone, inspect, list, rm, start, stop (CLI-6.4–CLI-6.9).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use crate::cli::{CloneArgs, RunArgs, VmCmd};
use crate::config::Env;
use crate::disk;
use crate::error::{fail, Context, Error, Result};
use crate::faults::{self, Effects, GARBAGE};
use crate::guest;
use crate::ids;
use crate::lock::{self, Lock};
use crate::model::{Disk, Nic, SnapshotConfig, StoredVm, VmConfig, CH, FC};
use crate::names;
use crate::output::{self, log};
use crate::store::Store;
use crate::timefmt::now_ns;
use crate::vmnet;
use crate::{exact_args, min_args};

pub fn dispatch(env: &Env, cmd: VmCmd) -> Result<()> {
    match cmd {
        VmCmd::Run(a) => run(env, a, true),
        VmCmd::Clone(a) => clone(env, a),
        VmCmd::Inspect { args } => inspect(env, &args),
        VmCmd::List { format, args } => list(env, &format, &args),
        VmCmd::Rm {
            output,
            force,
            args,
        } => rm(env, &args, force, output.as_deref()),
        VmCmd::Start { output, args } => start(env, &args, output.as_deref()),
        VmCmd::Stop { output, args, .. } => stop(env, &args, output.as_deref()),
        VmCmd::Status {
            event,
            format,
            args,
            interval,
        } => crate::events::status(env, event, format.as_deref(), &args, interval),
        VmCmd::ReconcileStaleCreate { output, args } => {
            crate::vm_ops::reconcile_stale_create(env, &args, output.as_deref())
        }
        VmCmd::Exec {
            interactive,
            env: vars,
            args,
        } => crate::vm_ops::exec(env, interactive, &vars, &args),
        VmCmd::Logs { tail, follow, args } => crate::vm_ops::logs(env, tail, follow, &args),
        VmCmd::Net { nics, output, args } => {
            crate::vm_ops::net(env, nics, output.as_deref(), &args)
        }
    }
}

/// `stopped (stale)` when the stored state says running but the guest is gone (S behaviour).
pub fn reconciled_state(vm: &StoredVm) -> String {
    reconciled_state_with(vm, guest::is_alive)
}

pub fn reconciled_state_with(vm: &StoredVm, alive: impl FnOnce(i32, &str) -> bool) -> String {
    if vm.state == "running" && !alive(vm.sim.pid, &vm.id) {
        "stopped (stale)".into()
    } else {
        vm.state.clone()
    }
}

fn wants_json(output: Option<&str>) -> bool {
    output == Some("json")
}

fn print_vm_or_garbage(fx: &Effects, vm: &crate::model::VmOut) -> Result<()> {
    if fx.garbage {
        return output::emit(GARBAGE);
    }
    output::print_pretty(vm)
}

fn new_nics(id: &str, count: i64, cpu: i64, fc: bool, queue_size: i64, bridge: &str) -> Vec<Nic> {
    (0..count.max(0))
        .map(|i| nic(id, i, cpu, fc, queue_size, bridge))
        .collect()
}

pub fn nic(id: &str, index: i64, cpu: i64, fc: bool, queue_size: i64, bridge: &str) -> Nic {
    let tap_prefix = if bridge.is_empty() { "tap" } else { "bt" };
    Nic {
        tap: format!("{tap_prefix}{}-{index}", &id[..8]),
        mac: ids::new_mac(),
        num_queues: if fc { 2 } else { 2 * cpu.max(1) },
        queue_size: if queue_size > 0 { queue_size } else { 512 },
        backend: if bridge.is_empty() {
            "cni".into()
        } else {
            "bridge".into()
        },
        bridge_dev: bridge.to_string(),
        netns_path: String::new(),
        network: None,
    }
}

/// Run/log dirs as cocoon lays them out, and the writable disk: copied from the snapshot for
/// a clone, created fresh when missing otherwise.
fn make_dirs(env: &Env, vm: &StoredVm, disk_src: Option<&Path>) -> Result<()> {
    fs::create_dir_all(&vm.sim.run_dir)?;
    fs::create_dir_all(&vm.sim.log_dir)?;
    disk::write_cidata(vm)?;
    match disk_src {
        Some(src) => disk::restore(src, vm),
        None => disk::ensure(env, vm),
    }
}

/// cocoon's storage list: an OCI VM boots its image layers read-only over a raw COW file; a
/// cloud-image VM has only its qcow2 overlay (the base image is the overlay's backing file)
/// and, unless it is Windows, the cloud-init `cidata.img`.
fn disks(env: &Env, run_dir: &str, cfg: &VmConfig) -> Vec<Disk> {
    let cow = |serial: &str| Disk {
        path: format!("{run_dir}/{}", disk::file_name(&cfg.image_type)),
        ro: false,
        serial: serial.into(),
        role: "cow".into(),
    };
    if cfg.image_type == "cloudimg" {
        let mut v = vec![cow("")];
        if !cfg.windows {
            v.push(Disk {
                path: format!("{run_dir}/{}", disk::CIDATA),
                ro: true,
                serial: String::new(),
                role: "cidata".into(),
            });
        }
        return v;
    }
    let mut v = Vec::new();
    if !cfg.image_digest.is_empty() {
        let hex = cfg.image_digest.trim_start_matches("sha256:");
        v.push(Disk {
            path: format!("{}/images/{hex}.img", env.root.display()),
            ro: true,
            serial: "cocoon-layer0".into(),
            role: "layer".into(),
        });
    }
    v.push(cow("cocoon-cow"));
    v
}

fn blank_vm(env: &Env, id: &str, hypervisor: &str, config: VmConfig, nics: Vec<Nic>) -> StoredVm {
    let hyper_dir = if hypervisor == FC {
        "firecracker"
    } else {
        "cloudhypervisor"
    };
    let run_dir = format!("{}/{hyper_dir}/{id}", env.run_dir.display());
    let log_dir = format!("{}/{hyper_dir}/{id}", env.log_dir.display());
    let now = now_ns();
    StoredVm {
        id: id.to_string(),
        hypervisor: hypervisor.to_string(),
        state: "creating".into(),
        storage_configs: disks(env, &run_dir, &config),
        config,
        network_configs: nics,
        first_booted: false,
        snapshot_ids: BTreeMap::new(),
        created_ns: now,
        updated_ns: now,
        started_ns: None,
        stopped_ns: None,
        transition_generation: 0,
        last_transition_reason: String::new(),
        last_transition_at: None,
        sim: crate::model::SimInfo {
            run_dir,
            log_dir,
            ports: env.guest_ports.clone(),
            ..Default::default()
        },
    }
}

pub fn create_lock_path(env: &Env, id: &str) -> std::path::PathBuf {
    env.vm_state_dir(id).join("create.lock")
}

/// Inserts the `creating` placeholder while holding the per-VM create lock, which tells
/// `reconcile-stale-create` that an owner is alive.
fn reserve(env: &Env, store: &Store, vm: &mut StoredVm, verb: &str) -> Result<Lock> {
    if !store.claim_id(&vm.id)? {
        return fail(format!("{verb}: VM ID {} already in use", vm.id));
    }
    let owner = lock::exclusive(&create_lock_path(env, &vm.id))?;
    vm.transition("creating", "create", now_ns());
    let res = store.insert_new_vm(vm);
    if let Err(e) = res {
        let _ = fs::remove_dir_all(env.vm_state_dir(&vm.id));
        return Err(e.wrap(verb));
    }
    Ok(owner)
}

fn rollback(env: &Env, store: &Store, vm: &StoredVm) {
    let _ = store.remove_vm(&vm.id);
    vmnet::detach(env, vm);
    let _ = fs::remove_dir_all(&vm.sim.run_dir);
    let _ = fs::remove_dir_all(&vm.sim.log_dir);
    let _ = fs::remove_dir_all(env.vm_state_dir(&vm.id));
}

fn save_vm(store: &Store, vm: &StoredVm) -> Result<()> {
    store.put_vm(vm)
}

/// Network, cgroup, guest: the part of create shared by run and clone. On failure the record
/// is marked `error` (cocoon's MarkError) and keeps its name.
fn bring_up(
    env: &Env,
    store: &Store,
    vm: &mut StoredVm,
    fx: &Effects,
    verb: &str,
    disk_src: Option<&Path>,
) -> Result<()> {
    if let Err(e) = make_dirs(env, vm, disk_src) {
        rollback(env, store, vm);
        return Err(e.wrap(verb));
    }
    fx.sleep();
    if let Err(e) = vmnet::attach(env, vm) {
        rollback(env, store, vm);
        return Err(e.wrap("configure network"));
    }
    vmnet::attach_cgroup(env, vm);
    save_vm(store, vm)?;
    match guest::spawn(env, vm) {
        Ok(pid) => {
            vm.sim.pid = pid;
            Ok(())
        }
        Err(e) => {
            vm.transition("error", "error", now_ns());
            save_vm(store, vm)?;
            Err(e.wrap(verb))
        }
    }
}

/// cocoon-macos boots its guests through `vm run` too, but answers to its own host's limits,
/// not cocoon's cap of vCPUs at the host's core count.
pub fn run_for_macos(env: &Env, a: RunArgs) -> Result<()> {
    run(env, a, false)
}

fn run(env: &Env, a: RunArgs, cap_at_host_cores: bool) -> Result<()> {
    exact_args(&a.args, 1)?;
    let image = a.args[0].clone();
    let fx = faults::on_verb(env, "vm run")?;
    let cpu = a.vm.cpu.unwrap_or(2);
    let mem_s = a.vm.memory.clone().unwrap_or_else(|| "1G".into());
    let memory = names::ram_in_bytes(&mem_s).ctx(format!("invalid --memory {mem_s:?}"))?;
    let sto_s = a.vm.storage.clone().unwrap_or_else(|| "10G".into());
    let storage = names::ram_in_bytes(&sto_s).ctx(format!("invalid --storage {sto_s:?}"))?;
    let name =
        a.vm.name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| names::default_vm_name(&image));
    names::validate_vm(&name, cpu, memory, storage)?;
    if a.fc && a.windows {
        return fail("--fc and --windows are mutually exclusive: Firecracker does not support Windows guests");
    }
    let network = a.vm.network.clone().unwrap_or_default();
    let bridge = a.vm.bridge.clone().unwrap_or_default();
    if !bridge.is_empty() && !network.is_empty() {
        return fail("--bridge and --network are mutually exclusive");
    }
    let store = Store::new(&env.root);
    let img = store.read(|db| Ok(db.images.get(&image).cloned()))?;
    let Some(img) = img else {
        let each = format!("image {image:?} not found for VM {name}");
        return fail(format!(
            "image {image:?} not resolved: oci: {each}; cloudimg: {each}"
        ));
    };
    if a.windows && img.kind == "oci" {
        return fail("--windows requires cloudimg (UEFI boot), got OCI direct boot image");
    }
    if a.fc && img.kind != "oci" {
        return fail("--fc requires OCI images (direct kernel boot): Firecracker does not support UEFI/cloudimg boot");
    }
    let id = ids::new_id();
    let config = VmConfig {
        cpu,
        memory,
        storage,
        queue_size: a.vm.queue_size.unwrap_or(0),
        disk_queue_size: a.vm.disk_queue_size.unwrap_or(0),
        image: image.clone(),
        image_digest: img.id.clone(),
        image_type: img.kind.clone(),
        network,
        no_direct_io: a.no_direct_io,
        windows: a.windows,
        name,
    };
    let hypervisor = if a.fc { FC } else { CH };
    let nics = new_nics(
        &id,
        a.vm.nics.unwrap_or(1),
        cpu,
        a.fc,
        config.queue_size,
        &bridge,
    );
    let mut vm = blank_vm(env, &id, hypervisor, config, nics);
    vm.sim.sac = crate::sac::boot(env, &vm, &[], &[], false);
    if cap_at_host_cores {
        names::check_host_cpu(cpu).ctx("create VM")?;
    }
    let _owner = reserve(env, &store, &mut vm, "create VM")?;
    vm.transition("created", "create", now_ns());
    bring_up(env, &store, &mut vm, &fx, &format!("start VM {id}"), None)?;
    vm.first_booted = true;
    vm.transition("running", "boot", now_ns());
    save_vm(&store, &vm)?;
    if !wants_json(a.vm.output.as_deref()) {
        log(
            "cmd.vm.run",
            format!("VM created: {id} (name: {})", vm.config.name),
        );
        log("cmd.vm.run", format!("started: {id}"));
        return Ok(());
    }
    print_vm_or_garbage(&fx, &vm.to_out(&reconciled_state(&vm)))
}

fn read_from_dir(dir: &str) -> Result<(SnapshotConfig, Vec<String>)> {
    let path = Path::new(dir).join("snapshot.json");
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return fail("open snapshot dir: invalid snapshot archive: snapshot.json not found")
        }
        Err(e) => return Err(Error::from(e).wrap("read snapshot.json")),
    };
    let env: crate::model::SnapshotEnvelope =
        serde_json::from_slice(&bytes).ctx("parse snapshot.json")?;
    if env.version != 1 {
        return fail(format!(
            "unsupported snapshot archive version {}",
            env.version
        ));
    }
    let macs = crate::snapshot::source_macs_in(Path::new(dir));
    Ok((env.config, macs))
}

fn clone(env: &Env, a: CloneArgs) -> Result<()> {
    let store = Store::new(&env.root);
    let (snap, source_macs, src_dir) = match (&a.from_dir, a.args.len()) {
        (Some(_), n) if n > 0 => {
            return fail("--from-dir and positional SNAPSHOT are mutually exclusive")
        }
        (Some(dir), _) => {
            let (cfg, macs) = read_from_dir(dir)?;
            (cfg, macs, Path::new(dir).to_path_buf())
        }
        (None, _) => {
            exact_args(&a.args, 1)?;
            let r = a.args[0].clone();
            let (cfg, macs) = store
                .read(|db| {
                    crate::snapshot::lookup(db, &r)
                        .map(|s| (s.config.clone(), s.source_macs.clone()))
                })
                .map_err(|e| e.wrap(format!("inspect snapshot {r}")))?;
            let dir = env.snapshot_dir(&cfg.id);
            (cfg, macs, dir)
        }
    };
    let disk_src = disk::in_snapshot(&src_dir, &snap.image_type);
    if let Err(e) = fs::metadata(&disk_src) {
        return Err(Error::from(e).wrap(format!("clone VM: snapshot disk {}", disk_src.display())));
    }
    let fx = faults::on_verb(env, "vm clone")?;
    let fc = snap.hypervisor == FC;
    if fc {
        if let Some(c) = a.vm.cpu.filter(|c| *c > 0 && *c != snap.cpu) {
            return fail(format!(
                "--cpu {c} not supported: Firecracker cannot change CPU after snapshot/load (snapshot has {})",
                snap.cpu
            ));
        }
        if a.vm.memory.as_deref().is_some_and(|m| !m.is_empty()) {
            return fail(
                "--memory not supported: Firecracker cannot change memory after snapshot/load",
            );
        }
        if let Some(n) = a.vm.nics.filter(|n| *n > 0 && *n != snap.nics) {
            return fail(format!(
                "--nics {n} not supported: Firecracker cannot change NIC count after snapshot/load (snapshot has {})",
                snap.nics
            ));
        }
    }
    let cpu = match a.vm.cpu.filter(|c| *c > 0) {
        Some(c) if c < snap.cpu => {
            return fail(format!("--cpu {c} below snapshot minimum {}", snap.cpu))
        }
        Some(c) => c,
        None => snap.cpu,
    };
    let memory = match a.vm.memory.as_deref().filter(|m| !m.is_empty()) {
        Some(m) => {
            let v = names::ram_in_bytes(m).ctx(format!("invalid --memory {m:?}"))?;
            if v < snap.memory {
                return fail(format!(
                    "--memory {} below snapshot minimum {}",
                    names::human_size(v),
                    names::human_size(snap.memory)
                ));
            }
            v
        }
        None => snap.memory,
    };
    let storage = match a.vm.storage.as_deref().filter(|m| !m.is_empty()) {
        Some(m) => {
            let v = names::ram_in_bytes(m).ctx(format!("invalid --storage {m:?}"))?;
            if v < snap.storage {
                return fail(format!(
                    "--storage {} below snapshot minimum {}",
                    names::human_size(v),
                    names::human_size(snap.storage)
                ));
            }
            v
        }
        None => snap.storage,
    };
    if let Some(m) = a.restore_mode.as_deref() {
        if !matches!(m, "copy" | "ondemand" | "mmap") {
            return fail(format!(
                "invalid --restore-mode {m:?}: must be copy, ondemand or mmap"
            ));
        }
    }
    let id = ids::new_id();
    let name =
        a.vm.name
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| format!("cocoon-clone-{}", &id[..8]));
    names::validate_vm(&name, cpu, memory, storage)?;
    let nics_n = match a.vm.nics.filter(|n| *n > 0) {
        Some(n) if n < snap.nics => {
            return fail(format!("--nics {n} below snapshot minimum {}", snap.nics))
        }
        Some(n) => n,
        None => snap.nics,
    };
    if a.pull && !snap.image.is_empty() && !snap.image_type.is_empty() {
        crate::images::ensure(&store, &snap.image, &snap.image_type, &snap.image_digest)?;
    }
    let config = VmConfig {
        cpu,
        memory,
        storage,
        queue_size: a
            .vm
            .queue_size
            .filter(|q| *q > 0)
            .unwrap_or(snap.queue_size),
        disk_queue_size: a
            .vm
            .disk_queue_size
            .filter(|q| *q > 0)
            .unwrap_or(snap.disk_queue_size),
        image: snap.image.clone(),
        image_digest: snap.image_digest.clone(),
        image_type: snap.image_type.clone(),
        network: a
            .vm
            .network
            .clone()
            .filter(|n| !n.is_empty())
            .unwrap_or(snap.network.clone()),
        no_direct_io: a.no_direct_io || snap.no_direct_io,
        windows: snap.windows,
        name,
    };
    let bridge = a.vm.bridge.clone().unwrap_or_default();
    let hypervisor = if fc { FC } else { CH };
    let nics = new_nics(&id, nics_n, cpu, fc, config.queue_size, &bridge);
    let mut vm = blank_vm(env, &id, hypervisor, config, nics);
    if fc {
        vm.sim.guest_mac = source_macs.first().cloned().unwrap_or_default();
    }
    crate::fixup::mark(env, &mut vm);
    let source_ips = crate::snapshot::source_ips_in(&src_dir);
    vm.sim.sac = crate::sac::boot(env, &vm, &source_ips, &source_macs, true);
    names::check_host_cpu(cpu).ctx("clone VM")?;
    let _owner = reserve(env, &store, &mut vm, "clone VM")?;
    bring_up(
        env,
        &store,
        &mut vm,
        &fx,
        "clone VM: launch",
        Some(&disk_src),
    )?;
    vm.first_booted = true;
    vm.transition("running", "clone", now_ns());
    save_vm(&store, &vm)?;
    if !wants_json(a.vm.output.as_deref()) {
        log(
            "cmd.vm.clone",
            format!("VM cloned: {id} (name: {})", vm.config.name),
        );
        return Ok(());
    }
    // cocoon prints the clone record as built, before any PID file is read and before the
    // stored copy is marked first-booted (CLI-6.5).
    let mut out = vm.to_out("running");
    out.pid = 0;
    out.first_booted = false;
    out.socket_path.clear();
    out.vsock_socket.clear();
    print_vm_or_garbage(&fx, &out)
}

fn inspect(env: &Env, args: &[String]) -> Result<()> {
    exact_args(args, 1)?;
    let fx = faults::on_verb(env, "vm inspect")?;
    fx.sleep();
    let store = Store::new(&env.root);
    let vm = store.lookup_vm(&args[0]).map_err(|e| e.wrap("inspect"))?;
    print_vm_or_garbage(&fx, &vm.to_out(&reconciled_state(&vm)))
}

fn list(env: &Env, format: &str, args: &[String]) -> Result<()> {
    if let Some(a) = args.first() {
        return fail(format!("unknown command {a:?} for \"cocoon vm list\""));
    }
    let fx = faults::on_verb(env, "vm list")?;
    fx.sleep();
    let store = Store::new(&env.root);
    let mut vms: Vec<StoredVm> = store.vms().map_err(|e| e.wrap("list"))?;
    if fx.garbage {
        return output::emit(GARBAGE);
    }
    if vms.is_empty() {
        return output::emit("No VMs found.\n");
    }
    vms.sort_by_key(|v| v.created_ns);
    if format == "json" {
        let out: Vec<_> = vms.iter().map(|v| v.to_out(&v.state)).collect();
        return output::print_pretty(&out);
    }
    let mut s = String::from("ID                          NAME  STATE  CPU  MEMORY  IP  IMAGE\n");
    for v in &vms {
        s.push_str(&format!(
            "{}  {}  {}  {}  {}  {}  {}\n",
            v.id,
            v.config.name,
            reconciled_state(v),
            v.config.cpu,
            v.config.memory,
            if v.sim.ip.is_empty() { "-" } else { &v.sim.ip },
            v.config.image
        ));
    }
    output::emit(&s)
}

/// All refs resolve before anything happens, as cocoon's RouteRefs does.
fn resolve_all(store: &Store, refs: &[String]) -> Result<Vec<String>> {
    let mut ids = Vec::new();
    for r in refs {
        let id = store.vm_id(r)?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    Ok(ids)
}

fn succeeded(output: Option<&str>, ids: &[String]) -> Result<()> {
    if wants_json(output) {
        let mut m = BTreeMap::new();
        m.insert("succeeded", ids.to_vec());
        return output::print_pretty(&m);
    }
    Ok(())
}

/// Kills the guest, removes dirs, record and host plumbing, holding the VM's lock until the
/// record is gone. The lease stays.
pub fn destroy(env: &Env, store: &Store, vm: &StoredVm) -> Result<()> {
    let held = store.lock_vm(&vm.id)?;
    // What the lock's holder left behind is what goes (its PID, its plumbing).
    let vm = &store.vm(&vm.id)?.unwrap_or_else(|| vm.clone());
    guest::kill(vm.sim.pid, &vm.id, true);
    let _ = fs::remove_dir_all(&vm.sim.run_dir);
    let _ = fs::remove_dir_all(&vm.sim.log_dir);
    if let Some(held) = &held {
        store.remove_vm_held(held, &vm.id)?;
    }
    let _ = fs::remove_dir_all(env.vm_state_dir(&vm.id));
    drop(held);
    vmnet::detach(env, vm);
    Ok(())
}

fn rm(env: &Env, args: &[String], force: bool, output: Option<&str>) -> Result<()> {
    min_args(args, 1)?;
    let fx = faults::on_verb(env, "vm rm")?;
    fx.sleep();
    let store = Store::new(&env.root);
    let ids = resolve_all(&store, args)?;
    let mut deleted = Vec::new();
    let mut last_err = None;
    for id in ids {
        let Some(vm) = store.vm(&id)? else {
            last_err = Some(Error::Msg("VM not found".into()));
            continue;
        };
        if guest::is_alive(vm.sim.pid, &vm.id) && !force {
            last_err = Some(Error::Msg(
                "stop before delete: running (force required)".into(),
            ));
            continue;
        }
        destroy(env, &store, &vm)?;
        log("cmd.vm.rm", format!("deleted VM: {id}"));
        deleted.push(id);
    }
    if let Some(e) = last_err {
        return Err(e.wrap("rm"));
    }
    succeeded(output, &deleted)
}

/// Relaunches the guest of a non-running VM, under the VM's lock. A running one is left
/// alone.
pub fn start_one(env: &Env, store: &Store, id: &str) -> Result<bool> {
    let not_found = || fail("VM not found");
    let Some(held) = store.lock_vm(id)? else {
        return not_found();
    };
    let Some(mut vm) = store.vm(id)? else {
        return not_found();
    };
    if vm.state == "running" && guest::is_alive(vm.sim.pid, &vm.id) {
        return Ok(false);
    }
    if vm.state == "creating" {
        return fail(format!("vm {id} is creating, cannot start"));
    }
    fs::create_dir_all(env.vm_state_dir(id))?;
    make_dirs(env, &vm, None)?;
    vmnet::recover(env, &mut vm)?;
    vmnet::attach_cgroup(env, &mut vm);
    vm.sim.pid = guest::spawn(env, &vm)?;
    let reason = if vm.first_booted { "restart" } else { "boot" };
    vm.first_booted = true;
    vm.transition("running", reason, now_ns());
    store.put_vm_held(&held, &vm)?;
    Ok(true)
}

fn start(env: &Env, args: &[String], output: Option<&str>) -> Result<()> {
    min_args(args, 1)?;
    let fx = faults::on_verb(env, "vm start")?;
    fx.sleep();
    let store = Store::new(&env.root);
    let ids = resolve_all(&store, args)?;
    let mut done = Vec::new();
    let mut last_err = None;
    for id in ids {
        match start_one(env, &store, &id) {
            Ok(_) => {
                log("cmd.start", format!("started: {id}"));
                done.push(id)
            }
            Err(e) => last_err = Some(e.wrap(&id)),
        }
    }
    if let Some(e) = last_err {
        return Err(e.wrap("start"));
    }
    succeeded(output, &done)
}

fn stop(env: &Env, args: &[String], output: Option<&str>) -> Result<()> {
    min_args(args, 1)?;
    let fx = faults::on_verb(env, "vm stop")?;
    fx.sleep();
    let store = Store::new(&env.root);
    let ids = resolve_all(&store, args)?;
    let mut done = Vec::new();
    for id in ids {
        let Some(held) = store.lock_vm(&id)? else {
            continue;
        };
        let Some(mut vm) = store.vm(&id)? else {
            continue;
        };
        guest::kill(vm.sim.pid, &vm.id, false);
        vm.transition("stopped", "stop-user", now_ns());
        store.put_vm_held(&held, &vm)?;
        log("cmd.stop", format!("stopped: {id}"));
        done.push(id);
    }
    succeeded(output, &done)
}
