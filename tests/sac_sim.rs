//! The SAC dialog against the cocoon simulator's Windows guests (`COCOON_SIM_SAC=1`): a real
//! guest process serving its console socket. Loopback networking, no cgroups, so it needs
//! neither root nor the testbed.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use vk_cocoon::effects::sac::{set_static_ips, SacNic, SacStage, SacTimeouts};

struct Sim {
    bin: PathBuf,
    dir: tempfile::TempDir,
}

impl Sim {
    /// A private root with one Windows clone source: two NICs, NIC 0 static.
    fn new() -> Sim {
        let sim = Sim {
            bin: e2e::sim::binary().expect("the cocoon simulator"),
            dir: tempfile::tempdir().unwrap(),
        };
        sim.run(&[
            "sim",
            "seed-snapshot",
            "--name",
            "winsrc",
            "--windows",
            "--image",
            "https://example.invalid/win.qcow2",
            "--network",
            "cocoon-static",
            "--nics",
            "2",
        ]);
        sim
    }

    fn run(&self, args: &[&str]) -> String {
        let root = self.dir.path();
        let out = Command::new(&self.bin)
            .args(args)
            .env_remove("COCOON_ROOT_DIR")
            .env("COCOON_SIM_ROOT", root.join("root"))
            .env("COCOON_SIM_IPAM_DIR", root.join("ipam"))
            .env("COCOON_SIM_NET", "loopback")
            .env("COCOON_SIM_CGROUP_PARENT", "none")
            .env("COCOON_SIM_SAC", "1")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "cocoon {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn json(&self, args: &[&str]) -> Value {
        serde_json::from_str(&self.run(args)).unwrap()
    }

    /// Clones the source; returns the console socket and NIC 0 as SAC should set it.
    fn clone_vm(&self, name: &str) -> (PathBuf, SacNic) {
        let vm = self.json(&["vm", "clone", "--output", "json", "--name", name, "winsrc"]);
        let net = &vm["network_configs"][0]["network"];
        let addr = |k: &str| net[k].as_str().unwrap().parse::<Ipv4Addr>().unwrap();
        assert_eq!(net["prefix"], 16);
        let nic = SacNic {
            position: 0,
            ip: addr("ip"),
            mask: Ipv4Addr::new(255, 255, 0, 0),
            gateway: addr("gateway"),
        };
        let info = self.json(&["sim", "info", name]);
        (info["sac_socket"].as_str().unwrap().into(), nic)
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| self.run(&["sim", "cleanup"]));
    }
}

/// Failures come quickly; the socket a fresh guest creates and each answer get room enough
/// for a loaded machine.
fn timeouts() -> SacTimeouts {
    SacTimeouts {
        dial_retry: Duration::from_millis(50),
        dial_budget: Duration::from_secs(10),
        prompt_budget: Duration::from_millis(500),
        enum_tries: 5,
        enum_interval: Duration::from_millis(50),
        verify_tries: 5,
        verify_interval: Duration::from_millis(50),
        command: Duration::from_secs(5),
    }
}

#[tokio::test]
async fn a_windows_clone_gets_its_static_address_through_sac() {
    let sim = Sim::new();
    let (socket, nic) = sim.clone_vm("w1");
    set_static_ips(&socket, 2, &[nic], &timeouts())
        .await
        .unwrap();
    let sac = &sim.json(&["sim", "info", "w1"])["sac"];
    assert_eq!(sac[0]["net"], 7);
    assert_eq!(sac[0]["ip"], nic.ip.to_string());
    assert_eq!(sac[0]["gateway"], nic.gateway.to_string());
}

#[tokio::test]
async fn the_simulators_sac_faults_end_at_their_stage() {
    let sim = Sim::new();

    sim.run(&["sim", "fault", "sac", "*", "--refuse-set"]);
    let (socket, nic) = sim.clone_vm("refuses");
    let f = set_static_ips(&socket, 2, &[nic], &timeouts())
        .await
        .unwrap_err();
    assert_eq!(f.stage, SacStage::Set, "{f}");
    assert_eq!(
        f.message,
        format!(
            "SAC refused `i 7 {} 255.255.0.0 {}`: SAC failed to set the IP Address.",
            nic.ip, nic.gateway
        )
    );

    sim.run(&["sim", "fault", "sac", "*", "--reset"]);
    sim.run(&["sim", "fault", "sac", "*", "--no-prompt"]);
    let (socket, nic) = sim.clone_vm("silent");
    let f = set_static_ips(&socket, 2, &[nic], &timeouts())
        .await
        .unwrap_err();
    assert_eq!(f.stage, SacStage::Enum, "{f}");
    assert!(f.message.ends_with("no SAC> prompt within 500ms"), "{f}");

    sim.run(&["sim", "fault", "sac", "*", "--reset"]);
    sim.run(&["sim", "fault", "sac", "*", "--no-socket"]);
    let (socket, nic) = sim.clone_vm("socketless");
    let quick_dial = SacTimeouts {
        dial_budget: Duration::from_millis(300),
        ..timeouts()
    };
    let f = set_static_ips(&socket, 2, &[nic], &quick_dial)
        .await
        .unwrap_err();
    assert_eq!(f.stage, SacStage::Dial, "{f}");
}
