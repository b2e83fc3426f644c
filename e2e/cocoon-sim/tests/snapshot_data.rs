//! Snapshot bytes against CLI-6.5, CLI-6.15, CLI-6.18, CLI-6.19 and CLI-9: the disk is a real
//! sparse file that carries the guest's files, and export/import stream it with PAX sparse
//! records in bounded memory.

mod common;

use common::*;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;

const MIB: u64 = 1 << 20;

fn sim_with_disk(disk: &str, data: &str) -> Sim {
    Sim::with_env(&[
        ("COCOON_SIM_EXEC", "host"),
        ("COCOON_SIM_DISK_BYTES", disk),
        ("COCOON_SIM_DISK_DATA_BYTES", data),
    ])
}

fn snapshot_dir(sim: &Sim, name: &str) -> PathBuf {
    let s = sim.run(&["snapshot", "inspect", name]).ok().json();
    sim.root.join("snapshots").join(s["id"].as_str().unwrap())
}

fn allocated(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

fn same_bytes(a: &Path, b: &Path) -> bool {
    let (mut fa, mut fb) = (File::open(a).unwrap(), File::open(b).unwrap());
    if fa.metadata().unwrap().len() != fb.metadata().unwrap().len() {
        return false;
    }
    let (mut ba, mut bb) = (vec![0u8; MIB as usize], vec![0u8; MIB as usize]);
    loop {
        let n = fa.read(&mut ba).unwrap();
        if n == 0 {
            return true;
        }
        fb.read_exact(&mut bb[..n]).unwrap();
        if ba[..n] != bb[..n] {
            return false;
        }
    }
}

fn file_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    v.sort();
    v
}

/// The VM's writable disk, as its record lists it.
fn cow_path(vm: &serde_json::Value) -> PathBuf {
    let disks = vm["storage_configs"].as_array().unwrap();
    let cow = disks.iter().find(|d| d["role"] == "cow").unwrap();
    PathBuf::from(cow["path"].as_str().unwrap())
}

fn guest_cat(sim: &Sim, vm: &str, file: &str) -> Run {
    sim.run(&["vm", "exec", vm, "--", "cat", file])
}

struct Reaped {
    code: i32,
    max_rss_kib: i64,
    stderr: String,
}

/// Waits for a child with wait4(2), whose rusage carries the child's peak RSS.
fn reap(mut child: std::process::Child) -> Reaped {
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        e.read_to_string(&mut stderr).unwrap();
    }
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4(2) to overwrite.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: waits for our own child; both out-pointers are live locals.
    let pid = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut usage) };
    assert_eq!(pid, child.id() as i32, "wait4 failed");
    Reaped {
        code: if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            -1
        },
        max_rss_kib: usage.ru_maxrss,
        stderr,
    }
}

/// `cocoon <a> | cocoon <b>`, both reaped with their peak RSS.
fn pipe(sim: &Sim, a: &[&str], b: &[&str]) -> (Reaped, Reaped) {
    let mut left = sim
        .cmd(a)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let right = sim
        .cmd(b)
        .stdin(Stdio::from(left.stdout.take().unwrap()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let r = reap(right);
    (reap(left), r)
}

#[test]
fn disk_and_guest_files_stream_through_export_import_and_clone() {
    let sim = sim_with_disk("64M", "64M");
    let src = sim.run_vm("src", &[]);
    let src_disk = cow_path(&src);
    assert_eq!(std::fs::metadata(&src_disk).unwrap().len(), 64 * MIB);
    assert!(src_disk.parent().unwrap().join("guestfs").is_dir());
    sim.run(&["vm", "exec", "src", "--", "sh", "-c", "echo hello > marker"])
        .ok();
    assert_eq!(guest_cat(&sim, "src", "marker").ok().stdout, "hello\n");
    sim.run(&["snapshot", "save", "--name", "s1", "src"]).ok();
    sim.run(&["vm", "exec", "src", "--", "sh", "-c", "echo late > late"])
        .ok();

    let d1 = snapshot_dir(&sim, "s1");
    let disk = d1.join("cow.raw");
    assert_eq!(std::fs::metadata(&disk).unwrap().len(), 64 * MIB);
    let used = allocated(&disk);
    assert!(used > 60 * MIB, "the data is really there: {used}");
    assert!(
        used < 64 * MIB - MIB / 2,
        "the disk keeps its holes: {used}"
    );

    let baseline = reap(
        sim.cmd(&["snapshot", "inspect", "s1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (exp, imp) = pipe(
        &sim,
        &["snapshot", "export", "s1", "-o", "-"],
        &["snapshot", "import", "--name", "s2"],
    );
    assert_eq!(exp.code, 0);
    assert_eq!(imp.code, 0, "import: {}", imp.stderr);
    for (verb, r) in [("export", &exp), ("import", &imp)] {
        assert!(
            r.max_rss_kib < baseline.max_rss_kib + 8 * 1024,
            "{verb} of a 64 MiB disk peaked at {} KiB (baseline {} KiB)",
            r.max_rss_kib,
            baseline.max_rss_kib
        );
    }

    let d2 = snapshot_dir(&sim, "s2");
    assert_ne!(d1, d2);
    assert_eq!(file_names(&d1), file_names(&d2));
    for f in file_names(&d1) {
        assert!(same_bytes(&d1.join(&f), &d2.join(&f)), "{f} differs");
    }
    assert!(allocated(&d2.join("cow.raw")) <= used + 64 * 1024);

    for (clone, snap) in [("c2", "s2"), ("c1", "s1")] {
        let vm = sim
            .run(&["vm", "clone", "--output", "json", "--name", clone, snap])
            .ok()
            .json();
        let clone_disk = cow_path(&vm);
        assert!(
            same_bytes(&clone_disk, &disk),
            "{clone} starts from the snapshot disk"
        );
        assert!(allocated(&clone_disk) <= used + 64 * 1024);
        assert_eq!(guest_cat(&sim, clone, "marker").ok().stdout, "hello\n");
        let r = sim.run(&["vm", "exec", clone, "--", "test", "-e", "late"]);
        assert_eq!(
            r.code, 1,
            "a file written after the save stays out of {clone}"
        );
    }
}

/// What a relay does with an export: files laid out again from their PAX sparse records.
fn unpack_sparse(tar_bytes: &[u8], dir: &Path) -> Vec<String> {
    std::fs::create_dir_all(dir).unwrap();
    let mut sparse = Vec::new();
    let mut ar = tar::Archive::new(tar_bytes);
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let name = e.path().unwrap().to_str().unwrap().to_string();
        let (mut map, mut size) = (None, None);
        if let Some(exts) = e.pax_extensions().unwrap() {
            for x in exts {
                let x = x.unwrap();
                match x.key().unwrap() {
                    "COCOON.sparse.map" => map = Some(x.value().unwrap().to_string()),
                    "COCOON.sparse.size" => size = Some(x.value().unwrap().parse::<u64>().unwrap()),
                    _ => {}
                }
            }
        }
        let mut body = Vec::new();
        e.read_to_end(&mut body).unwrap();
        let f = File::create(dir.join(&name)).unwrap();
        match (map, size) {
            (Some(m), Some(size)) => {
                let segs: Vec<serde_json::Value> = serde_json::from_str(&m).unwrap();
                let mut at = 0usize;
                for s in segs {
                    let (o, l) = (s["o"].as_u64().unwrap(), s["l"].as_u64().unwrap() as usize);
                    f.write_all_at(&body[at..at + l], o).unwrap();
                    at += l;
                }
                assert_eq!(at, body.len(), "{name}: body is exactly the data segments");
                f.set_len(size).unwrap();
                sparse.push(name);
            }
            (None, None) => f.write_all_at(&body, 0).unwrap(),
            _ => panic!("{name}: sparse map and size come together"),
        }
    }
    sparse
}

#[test]
fn clone_from_dir_restores_disk_and_guest_files() {
    let sim = sim_with_disk("8M", "2M");
    sim.run_vm("src", &[]);
    sim.run(&[
        "vm",
        "exec",
        "src",
        "--",
        "sh",
        "-c",
        "mkdir -p etc && echo on > etc/flag",
    ])
    .ok();
    sim.run(&["snapshot", "save", "--name", "s", "src"]).ok();
    let out = sim
        .cmd(&["snapshot", "export", "s", "-o", "-"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let dir = sim.root.join("fromdir");
    let sparse = unpack_sparse(&out.stdout, &dir);
    assert_eq!(sparse, ["cow.raw"], "only the disk has holes");
    let snap_disk = snapshot_dir(&sim, "s").join("cow.raw");
    assert!(same_bytes(&dir.join("cow.raw"), &snap_disk));
    sim.run(&[
        "vm",
        "clone",
        "--output",
        "json",
        "--name",
        "fd",
        "--from-dir",
        dir.to_str().unwrap(),
    ])
    .ok();
    assert_eq!(guest_cat(&sim, "fd", "etc/flag").ok().stdout, "on\n");
    std::fs::remove_file(dir.join("cow.raw")).unwrap();
    sim.run(&[
        "vm",
        "clone",
        "--output",
        "json",
        "--name",
        "fd2",
        "--from-dir",
        dir.to_str().unwrap(),
    ])
    .err("cow.raw: no such file or directory");
    assert!(
        sim.run(&["vm", "inspect", "fd2"]).code != 0,
        "nothing reserved"
    );
}

#[test]
fn truncated_import_fails_and_leaves_no_snapshot() {
    let sim = sim_with_disk("8M", "4M");
    sim.run(&["sim", "seed-snapshot", "--name", "src"]).ok();
    let full = sim
        .cmd(&["snapshot", "export", "src", "-o", "-"])
        .output()
        .unwrap()
        .stdout;
    let n = full.len();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &full).unwrap();
    let gz = gz.finish().unwrap();
    let cuts: [(&str, &[u8]); 6] = [
        ("inside a header", &full[..100]),
        ("inside the envelope", &full[..560]),
        ("inside the disk body", &full[..n / 2]),
        ("before the end-of-archive marker", &full[..n - 1024]),
        ("inside the end-of-archive marker", &full[..n - 300]),
        ("inside a gzip stream", &gz[..gz.len() / 2]),
    ];
    for (what, bytes) in cuts {
        let r = sim.run_stdin(&["snapshot", "import", "--name", "cut"], bytes);
        assert_eq!(r.code, 1, "cut {what}: {}", r.stderr);
        let last = r.stderr.lines().last().unwrap_or_default();
        assert!(
            last.starts_with("Error: import: extract archive: ") && last.contains("unexpected EOF"),
            "cut {what}: {last:?}"
        );
        sim.run(&["snapshot", "inspect", "cut"])
            .err("snapshot not found");
    }
    let left: Vec<String> = file_names(&sim.root.join("snapshots"));
    assert_eq!(left.len(), 1, "only the source remains: {left:?}");
    sim.run_stdin(&["snapshot", "import", "--name", "whole"], &full)
        .ok();
    sim.run_stdin(&["snapshot", "import", "--name", "whole-gz"], &gz)
        .ok();
}
