//! Snapshot verbs (CLI-6.15–CLI-6.19) and the archive envelope (CLI-9). The disk is the VM's
//! real sparse disk file, guest filesystem included; the memory and device-state files are
//! small stand-ins named like cocoon's; `cocoon.json` carries the source NIC MACs for
//! Firecracker clones.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::Path;

use crate::archive;
use crate::cli::SnapCmd;
use crate::config::Env;
use crate::disk;
use crate::error::{fail, Context, Error, Result};
use crate::faults;
use crate::guest;
use crate::ids;
use crate::model::{
    Empty, SnapshotConfig, SnapshotEnvelope, SnapshotOut, StoredSnapshot, StoredVm, FC,
};
use crate::names;
use crate::output::{self, log};
use crate::sparse;
use crate::store::{self, Db, Resolve, Store};
use crate::timefmt::{now_ns, rfc3339_nano};
use crate::{exact_args, min_args};

pub fn dispatch(env: &Env, cmd: SnapCmd) -> Result<()> {
    match cmd {
        SnapCmd::Save {
            name,
            description,
            args,
        } => save(
            env,
            name.unwrap_or_default(),
            description.unwrap_or_default(),
            &args,
        ),
        SnapCmd::List { format, vm } => list(env, &format, vm.as_deref()),
        SnapCmd::Inspect { args } => inspect(env, &args),
        SnapCmd::Rm { args } => rm(env, &args),
        SnapCmd::Export { output, gzip, args } => export(env, output.as_deref(), gzip, &args),
        SnapCmd::Import {
            name,
            description,
            args,
        } => import(
            env,
            name.unwrap_or_default(),
            description.unwrap_or_default(),
            &args,
        ),
    }
}

fn resolve_id(db: &Db, reference: &str) -> Result<String> {
    match store::resolve(&db.snapshots, |s| s.config.name.as_str(), reference) {
        Ok(id) => Ok(id.to_string()),
        Err(Resolve::NotFound) => fail("snapshot not found"),
        Err(Resolve::Ambiguous) => fail(Resolve::ambiguous_text(reference)),
    }
}

/// Pending (half-written) snapshots are reported as not found, like cocoon's DataDir.
pub fn lookup<'a>(db: &'a Db, reference: &str) -> Result<&'a StoredSnapshot> {
    let id = resolve_id(db, reference)?;
    match db.snapshots.get(&id) {
        Some(s) if !s.pending => Ok(s),
        _ => fail("snapshot not found"),
    }
}

fn out(s: &StoredSnapshot) -> SnapshotOut {
    SnapshotOut {
        config: s.config.clone(),
        created_at: rfc3339_nano(s.created_ns),
    }
}

#[derive(Serialize, Deserialize, Default)]
struct CocoonJson {
    #[serde(default)]
    source_vm: String,
    #[serde(default)]
    macs: Vec<String>,
    /// The source's guest addresses, what a clone's Windows SAC lists until one is set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    ips: Vec<String>,
}

pub fn source_ips_in(dir: &Path) -> Vec<String> {
    fs::read(dir.join("cocoon.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<CocoonJson>(&b).ok())
        .map(|c| c.ips)
        .unwrap_or_default()
}

pub fn source_macs_in(dir: &Path) -> Vec<String> {
    fs::read(dir.join("cocoon.json"))
        .ok()
        .and_then(|b| serde_json::from_slice::<CocoonJson>(&b).ok())
        .map(|c| c.macs)
        .unwrap_or_default()
}

/// The snapshot's files besides its disk.
fn write_state(
    dir: &Path,
    hypervisor: &str,
    source_vm: &str,
    macs: &[String],
    ips: &[String],
) -> Result<()> {
    fs::create_dir_all(dir)?;
    let files: &[&str] = if hypervisor == FC {
        &["vmstate", "mem"]
    } else {
        &["config.json", "state.json", "memory-ranges"]
    };
    for f in files {
        fs::write(dir.join(f), format!("cocoon-sim {f} of {source_vm}\n"))?;
    }
    let meta = CocoonJson {
        source_vm: source_vm.to_string(),
        macs: macs.to_vec(),
        ips: ips.to_vec(),
    };
    fs::write(dir.join("cocoon.json"), serde_json::to_vec_pretty(&meta)?)?;
    Ok(())
}

fn config_from_vm(vm: &StoredVm, id: &str, name: &str, description: &str) -> SnapshotConfig {
    let c = &vm.config;
    let mut blobs = BTreeMap::new();
    if !c.image_digest.is_empty() {
        blobs.insert(
            c.image_digest.trim_start_matches("sha256:").to_string(),
            Empty {},
        );
    }
    SnapshotConfig {
        cpu: c.cpu,
        memory: c.memory,
        storage: c.storage,
        queue_size: c.queue_size,
        disk_queue_size: c.disk_queue_size,
        image: c.image.clone(),
        image_digest: c.image_digest.clone(),
        image_type: c.image_type.clone(),
        network: c.network.clone(),
        no_direct_io: c.no_direct_io,
        windows: c.windows,
        id: id.to_string(),
        name: name.to_string(),
        description: description.to_string(),
        image_blob_ids: blobs,
        hypervisor: vm.hypervisor.clone(),
        nics: vm.network_configs.len() as i64,
    }
}

fn check_name(name: &str) -> Result<()> {
    if !name.is_empty() && !names::valid_snapshot_name(name) {
        return fail(format!(
            "snapshot name {name:?} is invalid: must match ^[a-zA-Z0-9][a-zA-Z0-9._:/-]{{0,62}}$"
        ));
    }
    Ok(())
}

/// Two-phase like cocoon's localfile store: a pending record claims the name first, so a
/// save killed mid-way leaves `already in use by <ID>` behind.
pub fn insert_pending(
    store: &Store,
    cfg: &SnapshotConfig,
    macs: &[String],
    prefix: &str,
) -> Result<()> {
    store
        .update(|db| {
            if !cfg.name.is_empty() {
                if let Some(holder) = db.snapshots.values().find(|s| s.config.name == cfg.name) {
                    return fail(format!(
                        "snapshot name {:?} already in use by {}",
                        cfg.name, holder.config.id
                    ));
                }
            }
            db.snapshots.insert(
                cfg.id.clone(),
                StoredSnapshot {
                    config: cfg.clone(),
                    created_ns: now_ns(),
                    pending: true,
                    source_macs: macs.to_vec(),
                },
            );
            Ok(())
        })
        .map_err(|e| if prefix.is_empty() { e } else { e.wrap(prefix) })
}

fn finalize(store: &Store, id: &str, vm_id: Option<&str>) -> Result<()> {
    if let Some(v) = vm_id {
        store.update_vm(v, |vm| {
            vm.snapshot_ids.insert(id.to_string(), Empty {});
            Ok(())
        })?;
    }
    store.update(|db| {
        let Some(s) = db.snapshots.get_mut(id) else {
            return fail(format!("snapshot {id:?} disappeared from index"));
        };
        s.pending = false;
        Ok(())
    })
}

fn save(env: &Env, name: String, description: String, args: &[String]) -> Result<()> {
    exact_args(args, 1)?;
    let reference = &args[0];
    check_name(&name)?;
    let fx = faults::on_verb(env, "snapshot save")?;
    let store = Store::new(&env.root);
    let vm = store
        .lookup_vm(reference)
        .map_err(|e| e.wrap(format!("find VM {reference}")))?;
    if !name.is_empty() && store.read(|db| Ok(lookup(db, &name).is_ok()))? {
        return fail(format!("snapshot name {name:?} already exists"));
    }
    if !guest::is_alive(vm.sim.pid, &vm.id) {
        return fail(format!(
            "snapshot VM {reference}: snapshot VM {}: VM not running",
            vm.id
        ));
    }
    log(
        "cmd.snapshot.save",
        format!("snapshotting VM {reference} ..."),
    );
    let id = ids::new_id();
    let cfg = config_from_vm(&vm, &id, &name, &description);
    let mut macs: Vec<String> = vm.network_configs.iter().map(|n| n.mac.clone()).collect();
    if let (Some(first), false) = (macs.first_mut(), vm.sim.guest_mac.is_empty()) {
        *first = vm.sim.guest_mac.clone();
    }
    insert_pending(&store, &cfg, &macs, "save snapshot")?;
    fx.sleep();
    let dir = env.snapshot_dir(&id);
    let ips = if env.sac && !vm.sim.ip.is_empty() {
        vec![vm.sim.ip.clone()]
    } else {
        Vec::new()
    };
    let captured = write_state(&dir, &vm.hypervisor, &vm.id, &macs, &ips).and_then(|()| {
        let disk = disk::flush_guestfs(&vm)?;
        let name = disk.file_name().unwrap_or_default();
        sparse::copy(&disk, &dir.join(name)).ctx(format!("copy disk {}", disk.display()))?;
        // cocoon keeps the VM's cloud-init seed with the snapshot, as cloud-hypervisor lists it.
        if let Some(seed) = vm.storage_configs.iter().find(|d| d.role == "cidata") {
            fs::copy(&seed.path, dir.join(disk::CIDATA)).ctx(format!("copy {}", seed.path))?;
        }
        Ok(())
    });
    if let Err(e) = captured {
        let _ = fs::remove_dir_all(&dir);
        let _ = store.update(|db| {
            db.snapshots.remove(&id);
            Ok(())
        });
        return Err(e.wrap("save snapshot"));
    }
    finalize(&store, &id, Some(&vm.id)).map_err(|e| e.wrap("save snapshot"))?;
    log("cmd.snapshot.save", format!("snapshot saved: {id}"));
    Ok(())
}

fn inspect(env: &Env, args: &[String]) -> Result<()> {
    exact_args(args, 1)?;
    let fx = faults::on_verb(env, "snapshot inspect")?;
    fx.sleep();
    let s = Store::new(&env.root)
        .read(|db| lookup(db, &args[0]).cloned())
        .map_err(|e| e.wrap("inspect"))?;
    if fx.garbage {
        return output::emit(faults::GARBAGE);
    }
    output::print_pretty(&out(&s))
}

fn list(env: &Env, format: &str, vm: Option<&str>) -> Result<()> {
    let store = Store::new(&env.root);
    let owned: Option<Vec<String>> = match vm {
        Some(r) => Some(store.lookup_vm(r)?.snapshot_ids.keys().cloned().collect()),
        None => None,
    };
    let mut snaps: Vec<StoredSnapshot> = store.read(|db| {
        Ok(db
            .snapshots
            .values()
            .filter(|s| !s.pending)
            .filter(|s| owned.as_ref().is_none_or(|o| o.contains(&s.config.id)))
            .cloned()
            .collect())
    })?;
    if snaps.is_empty() {
        return output::emit("No snapshots found.\n");
    }
    snaps.sort_by_key(|s| s.created_ns);
    if format == "json" {
        let v: Vec<SnapshotOut> = snaps.iter().map(out).collect();
        return output::print_pretty(&v);
    }
    let mut t = String::from("ID  NAME  CPU  MEMORY  DESCRIPTION  CREATED\n");
    for s in &snaps {
        let c = &s.config;
        t.push_str(&format!(
            "{}  {}  {}  {}  {}  {}\n",
            c.id,
            c.name,
            c.cpu,
            c.memory,
            c.description,
            rfc3339_nano(s.created_ns)
        ));
    }
    output::emit(&t)
}

fn rm(env: &Env, args: &[String]) -> Result<()> {
    min_args(args, 1)?;
    let fx = faults::on_verb(env, "snapshot rm").map_err(|e| e.wrap("rm"))?;
    fx.sleep();
    let store = Store::new(&env.root);
    let ids = store
        .read(|db| {
            let mut ids = Vec::new();
            for r in args {
                let id = resolve_id(db, r).map_err(|e| e.wrap(format!("resolve {r:?}")))?;
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
            Ok(ids)
        })
        .map_err(|e| e.wrap("rm"))?;
    for id in ids {
        let _ = fs::remove_dir_all(env.snapshot_dir(&id));
        store.update(|db| {
            db.snapshots.remove(&id);
            Ok(())
        })?;
        log("cmd.snapshot.rm", format!("deleted: {id}"));
    }
    Ok(())
}

fn export(env: &Env, output_path: Option<&str>, gzip: bool, args: &[String]) -> Result<()> {
    exact_args(args, 1)?;
    let fx = faults::on_verb(env, "snapshot export").map_err(|e| e.wrap("export"))?;
    fx.sleep();
    let snap = Store::new(&env.root)
        .read(|db| lookup(db, &args[0]).cloned())
        .map_err(|e| e.wrap("export"))?;
    let envelope = SnapshotEnvelope {
        config: snap.config.clone(),
        version: 1,
    };
    let json = output::pretty(&envelope)?;
    let dir = env.snapshot_dir(&snap.config.id);
    let files = archive::data_files(&dir).map_err(|e| e.wrap("export"))?;
    let path = match output_path {
        Some(p) if !p.is_empty() => p.to_string(),
        _ => {
            let base = if snap.config.name.is_empty() {
                &snap.config.id
            } else {
                &snap.config.name
            };
            format!("{base}{}", if gzip { ".tar.gz" } else { ".tar" })
        }
    };
    let sink: Box<dyn Write> = if path == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(fs::File::create(&path).ctx("create output file")?)
    };
    let mut sink = std::io::BufWriter::with_capacity(crate::sparse::CHUNK, sink);
    if fx.garbage {
        sink.write_all(faults::GARBAGE.as_bytes())?;
        sink.flush()?;
        return Ok(());
    }
    let mtime = (now_ns() / 1_000_000_000) as u64;
    let res = if gzip {
        let gz = flate2::write::GzEncoder::new(sink, flate2::Compression::fast());
        archive::write(gz, json.as_bytes(), &dir, &files, mtime)
            .and_then(|gz| gz.finish())
            .and_then(|mut s| s.flush())
    } else {
        archive::write(sink, json.as_bytes(), &dir, &files, mtime).and_then(|mut s| s.flush())
    };
    res.map_err(|e| Error::from(e).wrap("write archive"))
}

fn parse_envelope(meta: &[u8]) -> Result<SnapshotEnvelope> {
    let envelope: SnapshotEnvelope = serde_json::from_slice(meta).ctx("parse snapshot.json")?;
    if envelope.version != 1 {
        return fail(format!(
            "unsupported snapshot archive version {}",
            envelope.version
        ));
    }
    Ok(envelope)
}

/// Streams the archive into a staging dir next to the store; only a complete, valid archive
/// is renamed into place and gets a record, so a failed import leaves nothing behind.
fn import(env: &Env, name: String, description: String, args: &[String]) -> Result<()> {
    if args.len() > 1 {
        return fail(format!("accepts at most 1 arg(s), received {}", args.len()));
    }
    let fx = faults::on_verb(env, "snapshot import").map_err(|e| e.wrap("import"))?;
    let id = ids::new_id();
    let dir = env.snapshot_dir(&id);
    let staging = dir.with_extension("partial");
    let received = (|| {
        let src = archive::open(archive::source(args.first())?)?;
        fs::create_dir_all(&staging)?;
        let meta = archive::read(src, &staging, |m| parse_envelope(m).map(|_| ()))?;
        parse_envelope(&meta)
    })();
    let envelope = match received {
        Ok(e) => e,
        Err(e) => {
            let _ = fs::remove_dir_all(&staging);
            return Err(e.wrap("import"));
        }
    };
    let mut cfg = envelope.config;
    cfg.id = id;
    if !name.is_empty() {
        cfg.name = name;
    }
    if !description.is_empty() {
        cfg.description = description;
    }
    if let Err(e) = check_name(&cfg.name) {
        let _ = fs::remove_dir_all(&staging);
        return Err(e.wrap("import"));
    }
    fx.sleep();
    if let Err(e) = fs::rename(&staging, &dir) {
        let _ = fs::remove_dir_all(&staging);
        return Err(Error::from(e).wrap("import: commit"));
    }
    let macs = source_macs_in(&dir);
    let store = Store::new(&env.root);
    if let Err(e) = insert_pending(&store, &cfg, &macs, "import") {
        let _ = fs::remove_dir_all(&dir);
        return Err(e);
    }
    finalize(&store, &cfg.id, None)?;
    log(
        "cmd.snapshot.import",
        format!("snapshot imported: {}", cfg.id),
    );
    Ok(())
}

/// `sim seed-snapshot`: a ready clone source without a VM, printed as `snapshot inspect` would.
pub fn seed(env: &Env, a: crate::cli::SeedArgs) -> Result<()> {
    check_name(&a.name)?;
    if a.hypervisor != FC && a.hypervisor != crate::model::CH {
        return fail(format!(
            "--hypervisor {:?}: want cloud-hypervisor or firecracker",
            a.hypervisor
        ));
    }
    let image_type = a.image_type.clone().unwrap_or_else(|| match &a.image {
        Some(i) if names::is_url(i) => "cloudimg".into(),
        Some(_) => "oci".into(),
        None => String::new(),
    });
    let digest = a
        .image_digest
        .clone()
        .or_else(|| {
            a.image
                .as_ref()
                .map(|i| format!("sha256:{}", ids::fake_digest(i)))
        })
        .unwrap_or_default();
    let mut blobs = BTreeMap::new();
    if !digest.is_empty() {
        blobs.insert(digest.trim_start_matches("sha256:").to_string(), Empty {});
    }
    let id = ids::new_id();
    let cfg = SnapshotConfig {
        cpu: a.cpu,
        memory: names::ram_in_bytes(&a.memory)?,
        storage: names::ram_in_bytes(&a.storage)?,
        image: a.image.clone().unwrap_or_default(),
        image_digest: digest,
        image_type,
        network: a.network.clone().unwrap_or_default(),
        windows: a.windows,
        id: id.clone(),
        name: a.name.clone(),
        description: a.description.clone().unwrap_or_default(),
        image_blob_ids: blobs,
        hypervisor: a.hypervisor.clone(),
        nics: a.nics,
        ..Default::default()
    };
    let macs: Vec<String> = (0..a.nics.max(0))
        .map(|i| match (&a.source_mac, i) {
            (Some(m), 0) => ids::normalize_mac(m).unwrap_or_else(ids::new_mac),
            _ => ids::new_mac(),
        })
        .collect();
    let store = Store::new(&env.root);
    insert_pending(&store, &cfg, &macs, "seed snapshot")?;
    let dir = env.snapshot_dir(&id);
    write_state(&dir, &a.hypervisor, "seed", &macs, &[])?;
    disk::create(
        &disk::in_snapshot(&dir, &cfg.image_type),
        env.disk_bytes,
        env.disk_data_bytes,
        &id,
        None,
    )?;
    finalize(&store, &id, None)?;
    let s = store.read(|db| lookup(db, &id).cloned())?;
    output::print_pretty(&out(&s))
}
