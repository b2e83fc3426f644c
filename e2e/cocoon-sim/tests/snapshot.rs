//! Snapshot and image verbs against CLI-4.3, CLI-4.4, CLI-6.1–CLI-6.3, CLI-6.15–CLI-6.19, CLI-9.

mod common;

use common::*;
use std::io::Read;

#[test]
fn save_inspect_rm_and_name_taken() {
    let sim = Sim::new();
    let vm = sim.run_vm("src-vm", &[]);
    let r = sim
        .run(&["snapshot", "save", "--name", "fork-src-vm", "src-vm"])
        .ok();
    assert_eq!(r.stdout, "", "save prints nothing on stdout");
    let r = sim.run(&["snapshot", "inspect", "fork-src-vm"]).ok();
    assert!(r.stdout.ends_with("}\n"));
    let s = r.json();
    let pos = |k: &str| r.stdout.find(&format!("\"{k}\": ")).unwrap();
    assert!(
        pos("cpu") < pos("id") && pos("id") < pos("name") && pos("hypervisor") < pos("created_at")
    );
    let sid = s["id"].as_str().unwrap();
    assert!(is_id(sid));
    assert_eq!(s["name"], "fork-src-vm");
    assert_eq!(s["hypervisor"], "cloud-hypervisor");
    assert_eq!(s["image"], IMAGE);
    assert_eq!(s["image_type"], "oci");
    assert_eq!(s["nics"], 1);
    let digest = s["image_digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("sha256:")
        .to_string();
    assert!(s["image_blob_ids"].get(&digest).is_some());
    assert!(s.get("description").is_none());
    assert!(sim.inspect("src-vm")["snapshot_ids"].get(sid).is_some());
    sim.run(&["snapshot", "save", "--name", "fork-src-vm", "src-vm"])
        .err("snapshot name \"fork-src-vm\" already exists");
    sim.run(&["snapshot", "inspect", "nope"])
        .err("inspect: snapshot not found");
    sim.run(&["snapshot", "rm", "nope"])
        .err("rm: resolve \"nope\": snapshot not found");
    sim.run(&["snapshot", "rm", sid]).ok();
    sim.run(&["snapshot", "inspect", "fork-src-vm"])
        .err("snapshot not found");
    sim.run(&["snapshot", "save", "--name", "x", "ghost"])
        .err("vm ghost: VM not found");
    sim.run(&["sim", "fault", "crash", "src-vm"]).ok();
    sim.run(&["snapshot", "save", "--name", "y", "src-vm"])
        .err("VM not running");
    let _ = vm;
}

#[test]
fn killed_save_leaves_pending_record_holding_the_name() {
    let sim = Sim::new();
    sim.run_vm("hib", &[]);
    sim.run(&["sim", "fault", "delay", "snapshot save", "60000"])
        .ok();
    let mut child = sim.spawn(&["snapshot", "save", "--name", "hib", "hib"]);
    let holder = wait_for("pending snapshot record", || {
        let idx: serde_json::Value =
            serde_json::from_str(&read(&sim.root.join("snapshots.json"))).ok()?;
        idx.as_object()?.keys().next().cloned()
    });
    child.kill().unwrap();
    child.wait().unwrap();
    sim.run(&["sim", "fault", "clear"]).ok();
    sim.run(&["snapshot", "inspect", "hib"])
        .err("snapshot not found");
    sim.run(&["snapshot", "save", "--name", "hib", "hib"])
        .err(&format!(
            "save snapshot: snapshot name \"hib\" already in use by {holder}"
        ));
    sim.run(&["snapshot", "rm", &holder]).ok();
    sim.run(&["snapshot", "save", "--name", "hib", "hib"]).ok();
}

#[test]
fn export_import_round_trip_and_archive_errors() {
    let sim = Sim::new();
    sim.run(&[
        "sim",
        "seed-snapshot",
        "--name",
        "ghcr.io/acme/agent:v2",
        "--image",
        IMAGE,
    ])
    .ok();
    let out = sim
        .cmd(&["snapshot", "export", "ghcr.io/acme/agent:v2", "-o", "-"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let tar_bytes = out.stdout;
    let mut ar = tar::Archive::new(&tar_bytes[..]);
    let mut entries = ar.entries().unwrap();
    let mut first = entries.next().unwrap().unwrap();
    assert_eq!(first.path().unwrap().to_str().unwrap(), "snapshot.json");
    let mut meta = String::new();
    first.read_to_string(&mut meta).unwrap();
    let env: serde_json::Value = serde_json::from_str(&meta).unwrap();
    assert_eq!(env["version"], 1);
    assert_eq!(env["config"]["name"], "ghcr.io/acme/agent:v2");
    assert!(env["config"].get("created_at").is_none());
    assert!(entries.count() >= 2, "payload files follow");

    sim.run_stdin(
        &[
            "snapshot",
            "import",
            "--name",
            "wake-import",
            "--description",
            "d",
        ],
        &tar_bytes,
    )
    .ok();
    let s = sim.run(&["snapshot", "inspect", "wake-import"]).ok().json();
    assert_eq!(s["description"], "d");
    assert_eq!(s["image"], IMAGE);
    assert_ne!(s["id"], env["config"]["id"], "import assigns a new ID");
    let r = sim.run_stdin(&["snapshot", "import", "--name", "wake-import"], &tar_bytes);
    r.err(&format!(
        "import: snapshot name \"wake-import\" already in use by {}",
        s["id"].as_str().unwrap()
    ));

    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar_bytes).unwrap();
    sim.run_stdin(
        &["snapshot", "import", "--name", "gz"],
        &gz.finish().unwrap(),
    )
    .ok();

    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_ustar();
    h.set_size(3);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "mem", &b"abc"[..]).unwrap();
    let no_meta = b.into_inner().unwrap();
    sim.run_stdin(&["snapshot", "import", "--name", "bad"], &no_meta)
        .err("invalid snapshot archive: snapshot.json not found");
    let mut b = tar::Builder::new(Vec::new());
    let body = br#"{"config": {"name": "v2"}, "version": 2}"#;
    let mut h = tar::Header::new_ustar();
    h.set_size(body.len() as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "snapshot.json", &body[..]).unwrap();
    sim.run_stdin(
        &["snapshot", "import", "--name", "v2"],
        &b.into_inner().unwrap(),
    )
    .err("unsupported snapshot archive version 2");
    let r = sim
        .cmd(&["snapshot", "export", "nope", "-o", "-"])
        .output()
        .unwrap();
    assert_eq!(r.status.code(), Some(1));
    assert!(r.stdout.is_empty(), "unknown ref fails before any byte");
}

#[test]
fn images_pull_inspect_import() {
    let sim = Sim::new();
    sim.run(&["image", "inspect", IMAGE])
        .err(&format!("image \"{IMAGE}\": not found in any backend"));
    let r = sim.run(&["image", "pull", IMAGE]).ok();
    assert_eq!(r.stdout, "");
    let img = sim.run(&["image", "inspect", IMAGE]).ok().json();
    assert_eq!(img["name"], IMAGE);
    assert_eq!(img["type"], "oci");
    assert!(img["id"].as_str().unwrap().starts_with("sha256:"));
    assert!(img["size"].as_i64().unwrap() > 0);
    assert!(img["created_at"].is_string());
    sim.run(&["image", "pull", "ghcr.io/acme/missing:1"])
        .err("MANIFEST_UNKNOWN");
    let mut qcow = b"QFI\xfb".to_vec();
    qcow.extend_from_slice(&[0u8; 512]);
    sim.run_stdin(&["image", "import", "win11"], &qcow).ok();
    assert_eq!(
        sim.run(&["image", "inspect", "win11"]).ok().json()["type"],
        "cloudimg"
    );
    sim.run_stdin(&["image", "import", "junk"], b"not an image")
        .err("unrecognized image format");
    let w = sim
        .run(&[
            "vm",
            "run",
            "--output",
            "json",
            "--windows",
            "--name",
            "w",
            "win11",
        ])
        .ok()
        .json();
    assert_eq!(w["config"]["windows"], true);
}
