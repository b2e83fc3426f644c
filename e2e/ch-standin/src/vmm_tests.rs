use std::sync::Arc;

use super::*;
use crate::console::Console;
use crate::guest::shared::GuestShared;
use crate::{RestoreRequest, SnapshotRequest};

fn vmm() -> Vmm {
    Vmm::new(
        GuestShared::new().unwrap(),
        Arc::new(Console::default()),
        false,
    )
}

fn config(dir: &std::path::Path, cmdline: &str) -> Value {
    let kernel = dir.join("vmlinuz");
    std::fs::write(&kernel, b"k").unwrap();
    let params = crate::cli::VmParams {
        cpus: "boot=1".into(),
        memory: "size=1G".into(),
        kernel: Some(kernel.display().to_string()),
        cmdline: Some(cmdline.into()),
        rng: "src=/dev/urandom".into(),
        serial: "off".into(),
        console: "off".into(),
        ..Default::default()
    };
    crate::config::from_params(&params).unwrap()
}

/// The value and the boot address live in guest memory: a snapshot carries them, a restore
/// brings them back even when the new command line says otherwise.
#[test]
fn snapshot_restore_round_trip_of_value_and_address() {
    let dir = tempfile::tempdir().unwrap();
    let mut a = vmm();
    a.create(config(
        dir.path(),
        "ip=10.215.0.7::10.215.0.1:255.255.255.0:a:eth0:off",
    ))
    .unwrap();
    a.boot().unwrap();
    a.guest
        .update(|v| v.memory.as_mut().unwrap().value = "kept across restore".into());
    a.pause().unwrap();
    let snap = dir.path().join("snap");
    std::fs::create_dir(&snap).unwrap();
    let url = format!("file://{}", snap.display());
    a.snapshot(SnapshotRequest {
        destination_url: url.clone(),
    })
    .unwrap();

    // cocoon patches config.json (here: the cmdline a clone would carry) before restoring.
    let cfg_path = snap.join("config.json");
    let mut cfg: Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    cfg["payload"]["cmdline"] = "ip=10.215.0.99::10.215.0.1:255.255.255.0:b:eth0:off".into();
    std::fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();

    let mut b = vmm();
    b.restore(RestoreRequest {
        source_url: url,
        prefault: false,
        memory_restore_mode: None,
        resume: false,
    })
    .unwrap();
    assert_eq!(b.state(), Some(VmState::Paused));
    assert!(!b.guest.lock().running);
    let mem = b.guest.lock().memory.clone().unwrap();
    assert_eq!(mem.value, "kept across restore");
    assert_eq!(mem.address.unwrap().address.to_string(), "10.215.0.7");
    assert_eq!(b.device_counter, a.device_counter);
    assert!(matches!(b.resume(), Ok(After::Continue)));
    assert!(b.guest.lock().running);
}

#[test]
fn state_errors_match_cloud_hypervisor() {
    let dir = tempfile::tempdir().unwrap();
    let mut v = vmm();
    assert_eq!(v.info().unwrap_err().status, 404);
    assert_eq!(v.boot().unwrap_err().status, 404, "no config");
    assert_eq!(v.pause().unwrap_err().status, 500, "no VM");
    v.create(config(dir.path(), "")).unwrap();
    assert_eq!(v.create(config(dir.path(), "")).unwrap_err().status, 500);
    v.boot().unwrap();
    assert_eq!(v.boot().unwrap_err().status, 500);
    assert_eq!(
        v.restore(RestoreRequest {
            source_url: "file:///x".into(),
            prefault: false,
            memory_restore_mode: None,
            resume: false
        })
        .unwrap_err()
        .status,
        500
    );
    assert_eq!(v.remove_device("_net0").unwrap_err().status, 404);
    v.delete().unwrap();
    assert_eq!(v.info().unwrap_err().status, 404);
}
