//! The simulator's indexes as JSON files under the root. Each VM record is its own file,
//! `<root>/vms/<ID>/vm.json`, replaced atomically and changed under that VM's lock (a flock on
//! its directory), so calls on distinct VMs never wait for each other and a reader never sees
//! a torn record. Names are claimed in `<root>/vm-names/<name>` (the file holds the ID) under
//! a short index lock, which is what keeps names unique. Snapshots and images share one small
//! index, read under a shared flock and rewritten under an exclusive one.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use crate::error::{fail, Error, Result};
use crate::lock;
use crate::model::{ImageRec, StoredSnapshot, StoredVm};

#[derive(Default)]
pub struct Db {
    pub snapshots: BTreeMap<String, StoredSnapshot>,
    pub images: BTreeMap<String, ImageRec>,
}

pub struct Store {
    root: PathBuf,
}

fn load<T: DeserializeOwned + Default>(path: &Path) -> Result<(T, Vec<u8>)> {
    match fs::read(path) {
        Ok(bytes) if bytes.iter().all(u8::is_ascii_whitespace) => Ok((T::default(), bytes)),
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(v) => Ok((v, bytes)),
            Err(e) => fail(format!("parse {}: {e}", path.display())),
        },
        Err(e) if e.kind() == ErrorKind::NotFound => Ok((T::default(), Vec::new())),
        Err(e) => Err(Error::from(e).wrap(format!("read {}", path.display()))),
    }
}

fn save<T: Serialize>(path: &Path, value: &T, before: &[u8]) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(value)?;
    if bytes != before {
        lock::write_atomic(path, &bytes)?;
    }
    Ok(())
}

/// A name or ID that can be a path component: a reference never escapes the store.
fn plain(reference: &str) -> bool {
    !reference.is_empty() && reference != "." && reference != ".." && !reference.contains('/')
}

/// The VM's own lock: a flock on its directory, so nothing is left behind when `vm rm`
/// removes the directory, and a VM that is gone cannot be locked back into existence.
pub struct VmLock {
    _dir: fs::File,
}

pub type FileKey = (u64, u64, i64, i64);

#[derive(Default)]
pub struct RecordCache(HashMap<String, (FileKey, StoredVm)>);

impl RecordCache {
    /// The identity of the record file last listed for `id`.
    pub fn key(&self, id: &str) -> Option<FileKey> {
        self.0.get(id).map(|(k, _)| *k)
    }
}

impl Store {
    pub fn new(root: &Path) -> Store {
        Store {
            root: root.to_path_buf(),
        }
    }

    fn lock_path(&self) -> PathBuf {
        self.root.join(".lock")
    }

    fn names_lock(&self) -> PathBuf {
        self.root.join(".names.lock")
    }

    fn names_dir(&self) -> PathBuf {
        self.root.join("vm-names")
    }

    pub fn vms_dir(&self) -> PathBuf {
        self.root.join("vms")
    }

    fn vm_file(&self, id: &str) -> PathBuf {
        self.vms_dir().join(id).join("vm.json")
    }

    fn paths(&self) -> [PathBuf; 2] {
        [
            self.root.join("snapshots.json"),
            self.root.join("images.json"),
        ]
    }

    fn load_all(&self) -> Result<(Db, [Vec<u8>; 2])> {
        let [s, i] = self.paths();
        let (snapshots, sb) = load(&s)?;
        let (images, ib) = load(&i)?;
        Ok((Db { snapshots, images }, [sb, ib]))
    }

    pub fn read<T>(&self, f: impl FnOnce(&Db) -> Result<T>) -> Result<T> {
        let _l = lock::shared(&self.lock_path())?;
        let (db, _) = self.load_all()?;
        f(&db)
    }

    /// Runs `f` under the exclusive lock; changes are written only when `f` succeeds.
    pub fn update<T>(&self, f: impl FnOnce(&mut Db) -> Result<T>) -> Result<T> {
        let _l = lock::exclusive(&self.lock_path())?;
        let (mut db, before) = self.load_all()?;
        let out = f(&mut db)?;
        let [s, i] = self.paths();
        save(&s, &db.snapshots, &before[0])?;
        save(&i, &db.images, &before[1])?;
        Ok(out)
    }

    /// Creates `<root>/vms/<ID>/` for a new VM; `false` when that ID is taken already.
    pub fn claim_id(&self, id: &str) -> Result<bool> {
        fs::create_dir_all(self.vms_dir())?;
        match fs::create_dir(self.vms_dir().join(id)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// `None` when the VM is gone (or was never there).
    pub fn lock_vm(&self, id: &str) -> Result<Option<VmLock>> {
        if !plain(id) {
            return Ok(None);
        }
        let dir = match fs::File::open(self.vms_dir().join(id)) {
            Ok(d) => d,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        loop {
            // SAFETY: flock on a descriptor we own.
            if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Some(VmLock { _dir: dir }));
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                return Err(e.into());
            }
        }
    }

    /// One record as last written; `None` when there is none (yet, or any more).
    pub fn vm(&self, id: &str) -> Result<Option<StoredVm>> {
        if !plain(id) {
            return Ok(None);
        }
        let path = self.vm_file(id);
        match fs::read(&path) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| Error::Msg(format!("parse {}: {e}", path.display()))),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::from(e).wrap(format!("read {}", path.display()))),
        }
    }

    fn ids(&self) -> Result<Vec<String>> {
        match fs::read_dir(self.vms_dir()) {
            Ok(rd) => Ok(rd
                .flatten()
                .filter_map(|e| e.file_name().to_str().map(String::from))
                .collect()),
            Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }

    /// Every record; a VM being created before its record is written, or removed meanwhile,
    /// is simply not there.
    pub fn vms(&self) -> Result<Vec<StoredVm>> {
        let mut out = Vec::new();
        for id in self.ids()? {
            if let Some(vm) = self.vm(&id)? {
                out.push(vm);
            }
        }
        Ok(out)
    }

    /// [`Store::vms`] for a caller that lists again and again (the event stream): a record
    /// whose file is the same as last time (same inode, size and mtime: every write is a new
    /// file renamed into place) is not read and parsed again.
    pub fn vms_cached(&self, cache: &mut RecordCache) -> Result<Vec<StoredVm>> {
        use std::os::unix::fs::MetadataExt;
        let mut fresh = HashMap::new();
        let mut out = Vec::new();
        for id in self.ids()? {
            let key = match fs::metadata(self.vm_file(&id)) {
                Ok(m) => (m.ino(), m.len(), m.mtime(), m.mtime_nsec()),
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(e.into()),
            };
            let vm = match cache.0.remove(&id) {
                Some((k, vm)) if k == key => vm,
                _ => match self.vm(&id)? {
                    Some(vm) => vm,
                    None => continue,
                },
            };
            out.push(vm.clone());
            fresh.insert(id, (key, vm));
        }
        cache.0 = fresh;
        Ok(out)
    }

    fn named(&self, name: &str) -> Option<String> {
        if !plain(name) {
            return None;
        }
        let id = fs::read_to_string(self.names_dir().join(name)).ok()?;
        self.vm_file(&id).exists().then_some(id)
    }

    /// cocoon's `utils.ResolveRef` over the VM records (see [`resolve`]).
    pub fn resolve_vm(&self, reference: &str) -> Result<std::result::Result<String, Resolve>> {
        if plain(reference) && self.vm_file(reference).exists() {
            return Ok(Ok(reference.to_string()));
        }
        if let Some(id) = self.named(reference) {
            return Ok(Ok(id));
        }
        if reference.len() >= 3 {
            let mut hits = self
                .ids()?
                .into_iter()
                .filter(|id| id.starts_with(reference) && self.vm_file(id).exists());
            if let Some(first) = hits.next() {
                if hits.next().is_some() {
                    return Ok(Err(Resolve::Ambiguous));
                }
                return Ok(Ok(first));
            }
        }
        Ok(Err(Resolve::NotFound))
    }

    /// How `resolveVMOwner` words a failed VM lookup; callers add their verb prefix.
    pub fn lookup_vm(&self, reference: &str) -> Result<StoredVm> {
        let not_found = || fail(format!("vm {reference}: VM not found"));
        match self.resolve_vm(reference)? {
            Ok(id) => match self.vm(&id)? {
                Some(vm) => Ok(vm),
                None => not_found(),
            },
            Err(Resolve::NotFound) => not_found(),
            Err(Resolve::Ambiguous) => fail(format!(
                "inspect {reference} in cloud-hypervisor: {}",
                Resolve::ambiguous_text(reference)
            )),
        }
    }

    pub fn vm_id(&self, reference: &str) -> Result<String> {
        self.lookup_vm(reference).map(|v| v.id)
    }

    /// Claims the VM's name and writes its first record, both under the index lock: a name
    /// names at most one record, and a claimed name always has its record.
    pub fn insert_new_vm(&self, vm: &StoredVm) -> Result<()> {
        let _l = lock::exclusive(&self.names_lock())?;
        let name = &vm.config.name;
        if let Some(dup) = self.named(name) {
            return fail(format!(
                "reserve VM record: vm name {name:?} already exists (id: {dup})"
            ));
        }
        if !plain(name) {
            return fail(format!("vm name {name:?} is invalid"));
        }
        fs::create_dir_all(self.names_dir())?;
        self.write_vm(vm)?;
        lock::write_atomic(&self.names_dir().join(name), vm.id.as_bytes())?;
        Ok(())
    }

    fn write_vm(&self, vm: &StoredVm) -> Result<()> {
        lock::write_atomic(&self.vm_file(&vm.id), &serde_json::to_vec_pretty(vm)?)?;
        Ok(())
    }

    /// Replaces the VM's record with `vm`, under the VM's lock; a VM removed meanwhile stays
    /// removed.
    pub fn put_vm(&self, vm: &StoredVm) -> Result<()> {
        let Some(held) = self.lock_vm(&vm.id)? else {
            return fail(format!("vm {}: VM not found", vm.id));
        };
        self.put_vm_held(&held, vm)
    }

    /// [`Store::put_vm`] for a caller that holds the VM's lock already.
    pub fn put_vm_held(&self, _held: &VmLock, vm: &StoredVm) -> Result<()> {
        if !self.vm_file(&vm.id).exists() {
            return fail(format!("vm {}: VM not found", vm.id));
        }
        self.write_vm(vm)
    }

    /// Read-modify-write of one record under the VM's lock; `None` when the VM is gone.
    pub fn update_vm<T>(
        &self,
        id: &str,
        f: impl FnOnce(&mut StoredVm) -> Result<T>,
    ) -> Result<Option<T>> {
        let Some(_l) = self.lock_vm(id)? else {
            return Ok(None);
        };
        let Some(mut vm) = self.vm(id)? else {
            return Ok(None);
        };
        let out = f(&mut vm)?;
        self.write_vm(&vm)?;
        Ok(Some(out))
    }

    /// Drops the record and its name claim; the caller removes the VM's directory after.
    pub fn remove_vm(&self, id: &str) -> Result<()> {
        match self.lock_vm(id)? {
            Some(held) => self.remove_vm_held(&held, id),
            None => Ok(()),
        }
    }

    /// [`Store::remove_vm`] for a caller that holds the VM's lock already.
    pub fn remove_vm_held(&self, _held: &VmLock, id: &str) -> Result<()> {
        let Some(vm) = self.vm(id)? else {
            return Ok(());
        };
        let _n = lock::exclusive(&self.names_lock())?;
        match fs::remove_file(self.vm_file(id)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e.into()),
        }
        let claim = self.names_dir().join(&vm.config.name);
        if plain(&vm.config.name) && fs::read_to_string(&claim).is_ok_and(|c| c == id) {
            let _ = fs::remove_file(claim);
        }
        Ok(())
    }
}

/// cocoon's `utils.ResolveRef`: exact ID, then exact name, then a unique ID prefix of >= 3.
pub fn resolve<'a, T>(
    items: &'a BTreeMap<String, T>,
    name_of: impl Fn(&T) -> &str,
    reference: &str,
) -> std::result::Result<&'a str, Resolve> {
    if let Some((id, _)) = items.get_key_value(reference) {
        return Ok(id);
    }
    if let Some((id, _)) = items.iter().find(|(_, v)| name_of(v) == reference) {
        return Ok(id);
    }
    if reference.len() >= 3 {
        let mut hits = items.keys().filter(|id| id.starts_with(reference));
        if let Some(first) = hits.next() {
            if hits.next().is_some() {
                return Err(Resolve::Ambiguous);
            }
            return Ok(first);
        }
    }
    Err(Resolve::NotFound)
}

#[derive(Debug, PartialEq, Eq)]
pub enum Resolve {
    NotFound,
    Ambiguous,
}

impl Resolve {
    pub fn ambiguous_text(reference: &str) -> String {
        format!("ambiguous ref {reference:?}: multiple matches")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_order() {
        let mut m: BTreeMap<String, String> = BTreeMap::new();
        m.insert("ABCDEF".into(), "web".into());
        m.insert("ABCXYZ".into(), "ABCDEF2".into());
        m.insert("QQQ111".into(), "ABC".into());
        fn name(v: &String) -> &str {
            v
        }
        assert_eq!(resolve(&m, name, "ABCDEF"), Ok("ABCDEF"));
        assert_eq!(resolve(&m, name, "web"), Ok("ABCDEF"));
        assert_eq!(resolve(&m, name, "ABC"), Ok("QQQ111"));
        assert_eq!(resolve(&m, name, "ABCX"), Ok("ABCXYZ"));
        assert_eq!(resolve(&m, name, "AB"), Err(Resolve::NotFound));
        assert_eq!(resolve(&m, name, "ABCD"), Ok("ABCDEF"));
        m.insert("ABCDEE".into(), "x".into());
        assert_eq!(resolve(&m, name, "ABCD"), Err(Resolve::Ambiguous));
    }
}
