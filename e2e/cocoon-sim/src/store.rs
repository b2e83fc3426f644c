//! The simulator's indexes (VMs, snapshots, images) as JSON files under the root, read under a
//! shared flock and rewritten under an exclusive one. `vms.json` changes exactly when a VM
//! record changes, so the event stream can watch it like cocoon watches its index.

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{fail, Error, Result};
use crate::lock;
use crate::model::{ImageRec, StoredSnapshot, StoredVm};

#[derive(Default)]
pub struct Db {
    pub vms: BTreeMap<String, StoredVm>,
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
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((T::default(), Vec::new())),
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

impl Store {
    pub fn new(root: &Path) -> Store {
        Store {
            root: root.to_path_buf(),
        }
    }

    pub fn vms_index(&self) -> PathBuf {
        self.root.join("vms.json")
    }

    fn lock_path(&self) -> PathBuf {
        self.root.join(".lock")
    }

    fn paths(&self) -> [PathBuf; 3] {
        [
            self.vms_index(),
            self.root.join("snapshots.json"),
            self.root.join("images.json"),
        ]
    }

    fn load_all(&self) -> Result<(Db, [Vec<u8>; 3])> {
        let [v, s, i] = self.paths();
        let (vms, vb) = load(&v)?;
        let (snapshots, sb) = load(&s)?;
        let (images, ib) = load(&i)?;
        Ok((
            Db {
                vms,
                snapshots,
                images,
            },
            [vb, sb, ib],
        ))
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
        let [v, s, i] = self.paths();
        save(&v, &db.vms, &before[0])?;
        save(&s, &db.snapshots, &before[1])?;
        save(&i, &db.images, &before[2])?;
        Ok(out)
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

/// How `resolveVMOwner` words a failed VM lookup; callers add their verb prefix.
pub fn vm_lookup<'a>(db: &'a Db, reference: &str) -> Result<&'a StoredVm> {
    match resolve(&db.vms, |v| v.config.name.as_str(), reference) {
        Ok(id) => Ok(&db.vms[id]),
        Err(Resolve::NotFound) => fail(format!("vm {reference}: VM not found")),
        Err(Resolve::Ambiguous) => fail(format!(
            "inspect {reference} in cloud-hypervisor: {}",
            Resolve::ambiguous_text(reference)
        )),
    }
}

pub fn vm_id(db: &Db, reference: &str) -> Result<String> {
    vm_lookup(db, reference).map(|v| v.id.clone())
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
