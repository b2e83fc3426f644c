//! The real cocoon's network path: a guest OCI image pushed to the testbed registry and pulled
//! by `cocoon image pull` (layers converted by the built mkfs.erofs), a VM on the run's CNI
//! network (bridge plugin, host-local addresses) that the host pings and talks TCP to, a
//! snapshot of it while it runs, a clone that answers with the value the snapshot holds, and
//! removal that leaves no netns, TAP, veth, mount or address allocation behind.

use std::time::{Duration, Instant};

use e2e::guest_image::GuestProgram;
use e2e::guest_wire::{alive, banner, ping, value_port};
use e2e::real_cocoon::{netns_name, tap_name, RealCocoon};
use e2e::{Testbed, TestbedOptions};
use serde_json::Value;

const BANNER: &str = "SSH-2.0-vk-real-network";

/// What the test needs that a host may lack; `None` when all is there.
fn missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("root (cocoon creates network namespaces and TAPs)".into());
    }
    for b in ["cocoon-real", "mkfs.erofs", "registry"] {
        if let Err(e) = e2e::bins::built(b) {
            return Some(e.to_string());
        }
    }
    for p in ["bridge", "host-local"] {
        let path = std::path::Path::new(e2e::cni::DEBIAN_PLUGIN_DIR).join(p);
        if !path.exists() {
            return Some(format!(
                "{} (containernetworking-plugins; e2e/scripts/ci-setup.sh)",
                path.display()
            ));
        }
    }
    None
}

fn until<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn primary_ip(vm: &Value) -> String {
    vm["network_configs"][0]["network"]["ip"]
        .as_str()
        .unwrap_or_else(|| panic!("no static address on NIC 0: {vm}"))
        .to_string()
}

/// Nothing of VM `id` is left on the host: process, netns (and its mount), TAP, a port on the
/// bridge, an address allocation.
fn assert_gone(real: &RealCocoon, id: &str, pid: i64) {
    assert!(!alive(pid), "the stand-in of {id} still runs");
    let ns = netns_name(id);
    assert!(
        !e2e::sim::netns_list().contains(&ns),
        "netns {ns} is left after vm rm"
    );
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains(&ns), "a mount of {ns} is left: {mounts}");
    assert!(!e2e::cni::link_exists(&tap_name(id, 0)));
    let ports = std::fs::read_dir(format!("/sys/class/net/{}/brif", real.network.name))
        .map(|rd| rd.count())
        .unwrap_or(0);
    assert_eq!(ports, 0, "a veth is left on {}", real.network.name);
    assert_eq!(real.network.allocations(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_run_reach_snapshot_clone_and_remove_on_the_cni_network() {
    if let Some(reason) = missing() {
        e2e::skip::required(reason);
    }
    let started = Instant::now();
    let tb = Testbed::start(TestbedOptions::default().with_registry().with_real_cocoon())
        .await
        .unwrap();
    let real = tb.real_cocoon.as_ref().unwrap();
    let registry = tb.registry.as_ref().unwrap();
    let program = GuestProgram {
        banner: BANNER.into(),
        ..Default::default()
    };
    let image = e2e::guest_image::push(registry, "vk/guest", "v1", &program)
        .await
        .unwrap();
    real.run(&["image", "pull", &image]).unwrap();
    let listed = real.run(&["image", "list"]).unwrap();
    assert!(listed.contains("vk/guest"), "{listed}");

    let vm = real
        .json(&[
            "vm",
            "run",
            "-o",
            "json",
            "--name",
            "vk-net-1",
            "--cpu",
            "1",
            "--memory",
            "512M",
            "--storage",
            "10G",
            "--nics",
            "1",
            &image,
        ])
        .unwrap();
    assert_eq!(vm["state"], "running", "{vm}");
    let id = vm["id"].as_str().unwrap().to_string();
    let pid = vm["pid"].as_i64().unwrap();
    let inspected = real.json(&["vm", "inspect", &id]).unwrap();
    let ip = primary_ip(&inspected);
    assert_eq!(inspected["config"]["network"], e2e::cni::NETWORK);
    assert_eq!(
        inspected["network_configs"][0]["network"]["gateway"],
        real.network.gateway.as_str()
    );
    assert_eq!(real.network.allocations(), vec![ip.clone()]);

    until("the guest answers ping", Duration::from_secs(20), || {
        ping(&ip).then_some(())
    });
    assert_eq!(banner(&ip).unwrap(), format!("{BANNER}\r\n"));
    assert_eq!(value_port(&ip, "SET kept-in-memory").unwrap(), "OK");
    assert_eq!(value_port(&ip, "GET").unwrap(), "kept-in-memory");

    real.run(&["snapshot", "save", "--name", "net-snap", &id])
        .unwrap();
    // The snapshot pauses and resumes the guest; it serves again afterwards.
    assert_eq!(value_port(&ip, "GET").unwrap(), "kept-in-memory");
    real.run(&["vm", "rm", "--force", &id]).unwrap();
    assert_gone(real, &id, pid);

    let clone = real
        .json(&[
            "vm",
            "clone",
            "-o",
            "json",
            "--name",
            "vk-net-c1",
            "net-snap",
        ])
        .unwrap();
    assert_eq!(clone["state"], "running", "{clone}");
    let clone_id = clone["id"].as_str().unwrap().to_string();
    let clone_vm = real.json(&["vm", "inspect", &clone_id]).unwrap();
    let clone_pid = clone_vm["pid"].as_i64().unwrap();
    let clone_ip = primary_ip(&clone_vm);
    // cocoon hands the clone a fresh CNI address and MAC, but a restored guest keeps the
    // address it configured at boot (it is in its memory; only a guest agent could change
    // it): the clone answers on the snapshot's address, with the snapshot's value.
    assert_ne!(clone_ip, ip, "host-local gives the clone a new address");
    assert_eq!(real.network.allocations(), vec![clone_ip.clone()]);
    until("the clone answers GET", Duration::from_secs(20), || {
        value_port(&ip, "GET").ok()
    })
    .eq("kept-in-memory")
    .then_some(())
    .expect("the clone's guest holds the value written before the snapshot");
    assert!(
        !ping(&clone_ip),
        "nothing answers on the address cocoon recorded for the clone"
    );
    real.run(&["vm", "rm", "--force", &clone_id]).unwrap();
    assert_gone(real, &clone_id, clone_pid);
    assert_eq!(
        real.run(&["vm", "list", "-o", "json"]).unwrap(),
        "No VMs found.\n"
    );

    let bridge = real.network.name.clone();
    drop(tb);
    assert!(
        !e2e::cni::link_exists(&bridge),
        "the teardown removes {bridge}"
    );
    eprintln!("real cocoon network test: {:?}", started.elapsed());
}
