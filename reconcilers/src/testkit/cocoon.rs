//! A fake `cocoon`: VMs, snapshots and images in maps, answering each `CocoonCmd` the way
//! the cocoon CLI contract (CLI-1–CLI-7) says the real binary does — including its error texts, which go
//! through the same `CocoonError::classify` the shell uses. Faults are armed per verb.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::cocoon::{Binary, CloneSource, CocoonCmd};
use crate::event::StaleOutcome;
use crate::event::{CocoonOk, SnapshotInfo, VmEventKind};
use crate::vm::{CocoonError, CocoonErrorKind, Nic, StaticNet, VmRecord};

use super::builders::mac_for;

/// What the next call of a verb does instead of its normal work.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Exit 1 with this text (classified like real stderr).
    Fail(String),
    /// Exit 0 with undecodable stdout.
    Garbage,
}

#[derive(Clone, Debug, Default)]
pub struct FakeCocoon {
    /// By id.
    pub vms: BTreeMap<String, VmRecord>,
    /// By name.
    pub snapshots: BTreeMap<String, SnapshotInfo>,
    /// Images stored locally.
    pub images: BTreeSet<String>,
    /// Images whose pull fails (the registry does not have them).
    pub unpullable: BTreeSet<String>,
    /// Armed faults by verb (`"vm run"`, `"snapshot inspect"`, …), first armed first used.
    pub faults: BTreeMap<String, VecDeque<Fault>>,
    /// Stream events (`vm status --event`) not yet delivered.
    pub stream: VecDeque<(VmEventKind, VmRecord)>,
    /// Every argv run, in order.
    pub calls: Vec<String>,
    /// The NICs a VM created under a name gets (CNI's plan for it): `None` a DHCP NIC, else
    /// its static addressing. Unplanned VMs get one DHCP NIC.
    pub nets: BTreeMap<String, Vec<Option<StaticNet>>>,
    /// VM names whose clones hold no lease until a fix-up command ran in them (C13).
    pub copied_guests: BTreeSet<String>,
    /// Clones whose guest has not been fixed up yet, by id.
    pub unfixed: BTreeSet<String>,
    /// cocoon-macos's guests, by name (its own index: cocoon's list never shows them).
    pub macos: BTreeMap<String, VmRecord>,
    /// QEMU processes started so far, for distinct guest pids.
    macos_launches: i64,
    next_id: u64,
}

/// `"vm run"`, `"snapshot rm"`, …: the verb of a command, as faults are keyed.
/// cocoon-macos's verbs are keyed `"macos vm run"`, `"macos vm start"`, ….
pub fn verb(cmd: &CocoonCmd) -> String {
    let v = cmd.argv().into_iter().take(2).collect::<Vec<_>>().join(" ");
    match cmd.binary() {
        Binary::Cocoon => v,
        Binary::CocoonMacos => format!("macos {v}"),
    }
}

impl FakeCocoon {
    pub fn add_vm(&mut self, vm: VmRecord) {
        self.vms.insert(vm.id.clone(), vm);
    }

    pub fn add_snapshot(&mut self, name: &str, hypervisor: &str, image: &str) {
        let id = format!("S-{name}");
        self.snapshots.insert(
            name.into(),
            SnapshotInfo {
                id,
                name: name.into(),
                hypervisor: hypervisor.into(),
                image: image.into(),
                description: String::new(),
            },
        );
    }

    /// Sets the description (the owner record, T5) of the snapshot `name`.
    pub fn describe(&mut self, name: &str, description: &str) {
        if let Some(snap) = self.snapshots.get_mut(name) {
            snap.description = description.into();
        }
    }

    pub fn fail_next(&mut self, verb: &str, text: &str) {
        self.arm(verb, Fault::Fail(text.into()));
    }

    pub fn garbage_next(&mut self, verb: &str) {
        self.arm(verb, Fault::Garbage);
    }

    fn arm(&mut self, verb: &str, f: Fault) {
        self.faults.entry(verb.into()).or_default().push_back(f);
    }

    /// The VMM died: the record stays, not running (CLI-5).
    pub fn crash(&mut self, id: &str) {
        if let Some(vm) = self.vms.get_mut(id) {
            vm.state = "stopped".into();
            vm.pid = 0;
            let rec = vm.clone();
            self.stream.push_back((VmEventKind::Modified, rec));
        }
    }

    /// The VM disappeared behind vk's back.
    pub fn vanish(&mut self, id: &str) {
        if let Some(vm) = self.vms.remove(id) {
            self.stream.push_back((VmEventKind::Deleted, vm));
        }
    }

    fn find(&self, r: &str) -> Option<&VmRecord> {
        self.vms
            .get(r)
            .or_else(|| self.vms.values().find(|v| v.name == r))
    }

    pub fn exec(&mut self, cmd: &CocoonCmd) -> Result<CocoonOk, CocoonError> {
        self.calls.push(cmd.argv().join(" "));
        let v = verb(cmd);
        if let Some(f) = self.faults.get_mut(&v).and_then(VecDeque::pop_front) {
            return Err(match f {
                Fault::Fail(text) => CocoonError::classify(&text),
                Fault::Garbage => CocoonError::new(
                    CocoonErrorKind::BadOutput,
                    format!("{v}: decode output: expected value at line 1 column 1"),
                ),
            });
        }
        let fail = |t: String| Err(CocoonError::classify(&t));
        match cmd {
            CocoonCmd::MacosImagePull { .. }
            | CocoonCmd::MacosRun { .. }
            | CocoonCmd::MacosInspect { .. }
            | CocoonCmd::MacosList
            | CocoonCmd::MacosStart { .. }
            | CocoonCmd::MacosRm { .. } => self.macos_exec(cmd),
            CocoonCmd::ImagePull { image, .. } => {
                if self.unpullable.contains(image) {
                    return fail(format!("Error: pull {image}: manifest unknown"));
                }
                self.images.insert(image.clone());
                Ok(CocoonOk::Done)
            }
            CocoonCmd::VmRun {
                name, image, fc, ..
            } => {
                let hv = if *fc {
                    "firecracker"
                } else {
                    "cloud-hypervisor"
                };
                self.create(name, hv, image, 4242)
            }
            CocoonCmd::VmClone { name, source, .. } => {
                let (hv, image) = match source {
                    CloneSource::Snapshot(s) => match self.snapshots.get(s) {
                        Some(snap) => (snap.hypervisor.clone(), snap.image.clone()),
                        None => return fail("Error: inspect: snapshot not found".into()),
                    },
                    CloneSource::FromDir(_) => ("cloud-hypervisor".into(), String::new()),
                };
                let hv = if hv.is_empty() {
                    "cloud-hypervisor".into()
                } else {
                    hv
                };
                // CLI-6.5: the clone record carries pid 0.
                let made = self.create(name, &hv, &image, 0);
                if let (Ok(CocoonOk::Vm { vm }), true) = (&made, self.copied_guests.contains(name))
                {
                    self.unfixed.insert(vm.id.clone());
                }
                made
            }
            CocoonCmd::VmInspect { vm } => match self.find(vm) {
                Some(rec) => Ok(CocoonOk::Vm { vm: rec.clone() }),
                None => fail(format!("Error: inspect: vm {vm}: VM not found")),
            },
            CocoonCmd::VmList => Ok(CocoonOk::Vms {
                vms: self.vms.values().cloned().collect(),
            }),
            CocoonCmd::VmRm { id } => match self.vms.remove(id) {
                Some(vm) => {
                    self.stream.push_back((VmEventKind::Deleted, vm));
                    Ok(CocoonOk::Done)
                }
                None => fail(format!("Error: vm {id}: VM not found")),
            },
            CocoonCmd::VmExec { id, argv } => match self.find(id) {
                Some(vm) if vm.is_running() => {
                    let fixup =
                        matches!(argv.first().map(String::as_str), Some("sh" | "powershell"));
                    if fixup {
                        let id = vm.id.clone();
                        self.unfixed.remove(&id);
                    }
                    Ok(CocoonOk::Done)
                }
                Some(_) => fail("Error: exec: VM not running".into()),
                None => fail(format!("Error: vm {id}: VM not found")),
            },
            // The record shows the first NIC only: none after a drop, a fresh MAC after an add.
            CocoonCmd::VmNet { id, nics } => {
                self.next_id += 1;
                let fresh = format!(
                    "02:00:00:00:{:02x}:{:02x}",
                    (self.next_id >> 8) & 0xff,
                    self.next_id & 0xff
                );
                match self.vms.get_mut(id) {
                    Some(vm) if vm.is_running() => {
                        match (*nics, vm.mac.is_some()) {
                            (0, _) => {
                                vm.mac = None;
                                vm.nics.clear();
                            }
                            (_, false) => {
                                vm.nics = vec![Nic {
                                    mac: fresh.clone(),
                                    network: None,
                                }];
                                vm.mac = Some(fresh);
                            }
                            (_, true) => {}
                        }
                        Ok(CocoonOk::Done)
                    }
                    Some(_) => fail("Error: vm net: VM not running".into()),
                    None => fail(format!("Error: vm {id}: VM not found")),
                }
            }
            CocoonCmd::VmStart { id } => {
                self.next_id += 1;
                let pid = 5000 + self.next_id as i64;
                match self.vms.get_mut(id) {
                    Some(vm) if vm.is_running() => Ok(CocoonOk::Done),
                    Some(vm) => {
                        vm.state = "running".into();
                        vm.pid = pid;
                        let rec = vm.clone();
                        self.stream.push_back((VmEventKind::Modified, rec));
                        Ok(CocoonOk::Done)
                    }
                    None => fail(format!("Error: vm {id}: VM not found")),
                }
            }
            CocoonCmd::SnapshotInspect { name } => match self.snapshots.get(name) {
                Some(s) => Ok(CocoonOk::Snapshot {
                    snapshot: s.clone(),
                }),
                None => fail("Error: inspect: snapshot not found".into()),
            },
            CocoonCmd::SnapshotRm { name } => {
                let by_id = self.snapshots.iter().find(|(_, s)| &s.id == name);
                let name = by_id
                    .map(|(n, _)| n.clone())
                    .unwrap_or_else(|| name.clone());
                self.rm_snapshot(&name)
            }
            CocoonCmd::SnapshotSave {
                name,
                vm,
                description,
            } => {
                if self.snapshots.contains_key(name) {
                    return fail(format!("Error: snapshot name {name:?} already exists"));
                }
                let Some(rec) = self.find(vm).cloned() else {
                    return fail(format!("Error: vm {vm}: VM not found"));
                };
                if !rec.is_running() {
                    return fail("Error: save snapshot: VM not running".into());
                }
                self.add_snapshot(name, &rec.hypervisor, &rec.image);
                self.describe(name, description);
                Ok(CocoonOk::Done)
            }
            CocoonCmd::ReconcileStaleCreate { id } => {
                let outcome = match self.vms.get(id) {
                    None => StaleOutcome::NotFound,
                    // A creating record whose creator still runs (it has a pid) is busy.
                    Some(v) if v.state == "creating" && v.pid != 0 => StaleOutcome::Busy,
                    Some(v) if v.state == "creating" => {
                        self.vms.remove(id);
                        StaleOutcome::Collected
                    }
                    Some(_) => StaleOutcome::NotCreating,
                };
                Ok(CocoonOk::StaleCreate { outcome })
            }
        }
    }

    fn rm_snapshot(&mut self, name: &str) -> Result<CocoonOk, CocoonError> {
        match self.snapshots.remove(name) {
            Some(_) => Ok(CocoonOk::Done),
            None => Err(CocoonError::classify(&format!(
                "Error: rm: resolve {name:?}: snapshot not found"
            ))),
        }
    }

    fn create(
        &mut self,
        name: &str,
        hv: &str,
        image: &str,
        pid: i64,
    ) -> Result<CocoonOk, CocoonError> {
        if let Some(v) = self.vms.values().find(|v| v.name == name) {
            return Err(CocoonError::classify(&format!(
                "Error: create VM: reserve VM record: vm name {name:?} already exists (id: {})",
                v.id
            )));
        }
        self.next_id += 1;
        let id = format!("V{:03}", self.next_id);
        let plan = self.nets.get(name).cloned().unwrap_or_else(|| vec![None]);
        let nics: Vec<Nic> = plan
            .into_iter()
            .enumerate()
            .map(|(i, network)| Nic {
                mac: match i {
                    0 => mac_for(&id),
                    _ => mac_for(&format!("{id}-{i}")),
                },
                network,
            })
            .collect();
        let static_ip = nics
            .first()
            .and_then(|n| n.network.as_ref())
            .map(|n| n.ip.clone());
        let rec = VmRecord {
            id: id.clone(),
            name: name.into(),
            state: "running".into(),
            pid: if pid == 0 {
                0
            } else {
                pid + self.next_id as i64
            },
            hypervisor: hv.into(),
            mac: nics.first().map(|n| n.mac.clone()),
            static_ip,
            image: image.into(),
            cloud_image: image.starts_with("http://") || image.starts_with("https://"),
            nics,
            ..VmRecord::default()
        };
        let mut stored = rec.clone();
        if stored.pid == 0 {
            stored.pid = 4242 + self.next_id as i64;
        }
        self.vms.insert(id, stored.clone());
        self.stream.push_back((VmEventKind::Added, stored));
        Ok(CocoonOk::Vm { vm: rec })
    }
}

impl FakeCocoon {
    /// A cocoon-macos guest, as `vm run` leaves it (pid > 0, its MAC derived from its name).
    pub fn add_macos(&mut self, name: &str, vnc: Option<u16>) -> &mut VmRecord {
        let pid = 5000 + self.macos_launches;
        self.macos_launches += 1;
        let vm = VmRecord {
            id: name.into(),
            name: name.into(),
            state: "running".into(),
            pid,
            mac: Some(mac_for(name)),
            vnc,
            ..VmRecord::default()
        };
        self.macos.insert(name.into(), vm);
        self.macos.get_mut(name).expect("just inserted")
    }

    /// The guest's QEMU died: the record stays, `stopped`, pid 0.
    pub fn macos_crash(&mut self, name: &str) {
        if let Some(vm) = self.macos.get_mut(name) {
            vm.state = "stopped".into();
            vm.pid = 0;
        }
    }

    fn macos_exec(&mut self, cmd: &CocoonCmd) -> Result<CocoonOk, CocoonError> {
        let missing = |name: &str| {
            Err(CocoonError::classify(&format!(
                "Error: vm {name}: VM not found"
            )))
        };
        match cmd {
            CocoonCmd::MacosImagePull { image } => {
                if self.unpullable.contains(image) {
                    return Err(CocoonError::classify(&format!(
                        "Error: pull {image}: manifest unknown"
                    )));
                }
                self.images.insert(image.clone());
                Ok(CocoonOk::Done)
            }
            CocoonCmd::MacosRun {
                name, image, vnc, ..
            } => {
                if self.macos.contains_key(name) {
                    return Err(CocoonError::classify(&format!(
                        "Error: create VM: reserve VM record: vm name {name:?} already exists (id: {name})"
                    )));
                }
                self.add_macos(name, *vnc).image = image.clone();
                Ok(CocoonOk::Done)
            }
            CocoonCmd::MacosInspect { name } => match self.macos.get(name) {
                Some(vm) => Ok(CocoonOk::Vm { vm: vm.clone() }),
                None => missing(name),
            },
            CocoonCmd::MacosList => Ok(CocoonOk::Vms {
                vms: self.macos.values().cloned().collect(),
            }),
            CocoonCmd::MacosStart { name, vnc } => {
                let next_pid = 5000 + self.macos_launches;
                let Some(vm) = self.macos.get_mut(name) else {
                    return missing(name);
                };
                if vm.pid == 0 {
                    vm.state = "running".into();
                    vm.pid = next_pid;
                    self.macos_launches += 1;
                }
                vm.vnc = *vnc;
                Ok(CocoonOk::Done)
            }
            CocoonCmd::MacosRm { name } => match self.macos.remove(name) {
                Some(_) => Ok(CocoonOk::Done),
                None => missing(name),
            },
            CocoonCmd::ImagePull { .. }
            | CocoonCmd::VmRun { .. }
            | CocoonCmd::VmClone { .. }
            | CocoonCmd::VmInspect { .. }
            | CocoonCmd::VmList
            | CocoonCmd::VmRm { .. }
            | CocoonCmd::VmStart { .. }
            | CocoonCmd::VmExec { .. }
            | CocoonCmd::VmNet { .. }
            | CocoonCmd::SnapshotInspect { .. }
            | CocoonCmd::SnapshotRm { .. }
            | CocoonCmd::SnapshotSave { .. }
            | CocoonCmd::ReconcileStaleCreate { .. } => Err(CocoonError::classify(
                "Error: unknown command for \"cocoon-macos\"",
            )),
        }
    }
}
