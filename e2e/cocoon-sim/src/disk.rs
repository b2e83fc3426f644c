//! The VM's writable disk (`cow.raw` / `overlay.qcow2` in its run dir) and the guest's small
//! filesystem. The disk is a real sparse file of `COCOON_SIM_DISK_BYTES`: its first
//! `GUESTFS_REGION` bytes hold a tar image of the guest filesystem, then come
//! `COCOON_SIM_DISK_DATA_BYTES` of pseudo-random data (clamped to the disk), then holes.
//!
//! The guest filesystem lives as a plain directory (`<run dir>/guestfs`) while the VM runs, so
//! `vm exec` can write into it; `snapshot save` writes its image into the disk before the disk
//! is copied, and `vm clone` unpacks the image of the disk it was given. That way whatever a
//! guest wrote before a save travels with the snapshot bytes, through export and import too.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::config::Env;
use crate::error::{fail, Context, Result};
use crate::model::StoredVm;
use crate::sparse;

/// Room for the guest filesystem image at the start of the disk; a guest that writes more
/// than this fails `snapshot save` instead of silently losing files.
pub const GUESTFS_REGION: u64 = 1 << 20;

pub fn guestfs_dir(vm: &StoredVm) -> PathBuf {
    Path::new(&vm.sim.run_dir).join("guestfs")
}

/// The disk file of a VM, as its record lists it (role `cow`).
pub fn disk_path(vm: &StoredVm) -> Option<PathBuf> {
    vm.storage_configs
        .iter()
        .find(|d| d.role == "cow")
        .map(|d| PathBuf::from(&d.path))
}

/// The cloud-init seed disk of a cloud-image VM, in its run dir and in its snapshots.
pub const CIDATA: &str = "cidata.img";

/// A small stand-in for the NoCloud seed cocoon generates, when the record lists one.
pub fn write_cidata(vm: &StoredVm) -> Result<()> {
    if let Some(d) = vm.storage_configs.iter().find(|d| d.role == "cidata") {
        let seed = format!("cocoon-sim cidata of {}\n", vm.config.name);
        fs::write(&d.path, seed).ctx(format!("generate cidata {}", d.path))?;
    }
    Ok(())
}

/// The disk's file name for an image type: cloud images boot from a qcow2 overlay, OCI images
/// (and every Firecracker VM) from a raw COW file.
pub fn file_name(image_type: &str) -> &'static str {
    if image_type == "cloudimg" {
        "overlay.qcow2"
    } else {
        "cow.raw"
    }
}

/// The tar image of `dir` (empty when `None`), checked against the region it must fit in.
fn image_of(dir: Option<&Path>) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    if let Some(d) = dir.filter(|d| d.is_dir()) {
        b.append_dir_all(".", d).ctx("pack guest filesystem")?;
    }
    let img = b.into_inner().ctx("pack guest filesystem")?;
    if img.len() as u64 > GUESTFS_REGION {
        return fail(format!(
            "guest filesystem needs {} bytes, more than the {GUESTFS_REGION} reserved on the disk",
            img.len()
        ));
    }
    Ok(img)
}

/// Writes the image and returns the rest of the region to holes, so the disk only carries
/// what the guest filesystem holds now.
fn put_image(disk: &File, img: &[u8]) -> io::Result<()> {
    disk.write_all_at(img, 0)?;
    let tail = (img.len() as u64).next_multiple_of(4096);
    if tail < GUESTFS_REGION {
        // SAFETY: fallocate(2) on a descriptor we own; a filesystem that cannot punch holes
        // just keeps the stale tail, which the image's end-of-archive marker already hides.
        unsafe {
            libc::fallocate(
                disk.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                tail as libc::off_t,
                (GUESTFS_REGION - tail) as libc::off_t,
            );
        }
    }
    Ok(())
}

/// splitmix64: cheap, deterministic for a seed, and incompressible, so benchmarks that move
/// snapshot bytes move real data.
struct Noise(u64);

impl Noise {
    fn new(seed: &str) -> Noise {
        // FNV-1a of the seed text.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in seed.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
        }
        Noise(h)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^= z >> 31;
            chunk.copy_from_slice(&z.to_le_bytes()[..chunk.len()]);
        }
    }
}

/// A fresh disk: the image of `guestfs` (if any), `data` bytes of noise seeded by `seed`
/// after the region, `size` bytes in all.
pub fn create(path: &Path, size: u64, data: u64, seed: &str, guestfs: Option<&Path>) -> Result<()> {
    let img = image_of(guestfs)?;
    let f = File::create(path).ctx(format!("create disk {}", path.display()))?;
    put_image(&f, &img)?;
    let end = GUESTFS_REGION.saturating_add(data).min(size);
    let mut noise = Noise::new(seed);
    let mut buf = vec![0u8; sparse::CHUNK];
    let mut at = GUESTFS_REGION;
    while at < end {
        let n = ((end - at) as usize).min(buf.len());
        noise.fill(&mut buf[..n]);
        f.write_all_at(&buf[..n], at)?;
        at += n as u64;
    }
    f.set_len(size)?;
    Ok(())
}

/// The guest filesystem dir, and a fresh disk unless the VM already has one (`vm run`, or
/// `vm start` of a VM whose run dir was wiped).
pub fn ensure(env: &Env, vm: &StoredVm) -> Result<()> {
    let gfs = guestfs_dir(vm);
    fs::create_dir_all(&gfs)?;
    match disk_path(vm) {
        Some(p) if !p.exists() => {
            create(&p, env.disk_bytes, env.disk_data_bytes, &vm.id, Some(&gfs))
        }
        _ => Ok(()),
    }
}

/// What a pause before a snapshot amounts to here: the guest filesystem reaches the disk.
pub fn flush_guestfs(vm: &StoredVm) -> Result<PathBuf> {
    let Some(path) = disk_path(vm) else {
        return fail(format!("vm {}: no writable disk in its record", vm.id));
    };
    let img = image_of(Some(&guestfs_dir(vm)))?;
    let f = OpenOptions::new()
        .write(true)
        .open(&path)
        .ctx(format!("open disk {}", path.display()))?;
    put_image(&f, &img)?;
    Ok(path)
}

/// Fills a clone's run dir from a snapshot disk: the disk itself (holes kept) and the guest
/// filesystem unpacked from it.
pub fn restore(src: &Path, vm: &StoredVm) -> Result<()> {
    let Some(dst) = disk_path(vm) else {
        return fail(format!("vm {}: no writable disk in its record", vm.id));
    };
    sparse::copy(src, &dst).ctx(format!("restore disk {}", src.display()))?;
    let gfs = guestfs_dir(vm);
    let _ = fs::remove_dir_all(&gfs);
    fs::create_dir_all(&gfs)?;
    let mut first = [0u8; 512];
    let got = File::open(&dst)?.read(&mut first)?;
    let is_tar =
        got == first.len() && (&first[257..262] == b"ustar" || first.iter().all(|b| *b == 0));
    if !is_tar {
        // A real cocoon's snapshot (a real qcow2 or raw disk) holds no guest filesystem image
        // of the simulator's: its clone starts with an empty one.
        return Ok(());
    }
    let region = File::open(&dst)?.take(GUESTFS_REGION);
    let mut ar = tar::Archive::new(region);
    ar.set_preserve_permissions(true);
    ar.unpack(&gfs)
        .ctx(format!("restore guest filesystem from {}", src.display()))
}

/// The disk file a snapshot (or `--from-dir` directory) holds for this image type.
pub fn in_snapshot(dir: &Path, image_type: &str) -> PathBuf {
    dir.join(file_name(image_type))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn noise_is_deterministic_and_seeded() {
        let (mut a, mut b, mut c) = ([0u8; 64], [0u8; 64], [0u8; 64]);
        Noise::new("X").fill(&mut a);
        Noise::new("X").fill(&mut b);
        Noise::new("Y").fill(&mut c);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().filter(|x| **x == 0).count() < 8);
    }
}
