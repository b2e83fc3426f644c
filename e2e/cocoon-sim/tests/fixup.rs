//! COCOON_SIM_GUEST_FIXUP and the SAC console, through the real binary: a clone that owes a
//! post-clone fixup stays off the network until the right `vm exec` script has run, and a
//! Windows clone's static address answers once SAC has set it.

mod common;

use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

const FIXUP: &[(&str, &str)] = &[("COCOON_SIM_GUEST_FIXUP", "1")];

fn lease_ip(sim: &Sim, mac: &str) -> Option<String> {
    let rows: Option<Vec<Value>> = serde_json::from_str(&read(&sim.leases_path())).ok()?;
    rows?
        .iter()
        .find(|r| r["mac"].as_str() == Some(mac))
        .map(|r| r["ip"].as_str().unwrap_or_default().to_string())
}

fn clone(sim: &Sim, name: &str, snapshot: &str) -> Value {
    sim.run(&["vm", "clone", "--output", "json", "--name", name, snapshot])
        .ok()
        .json()
}

fn mac0(vm: &Value) -> String {
    vm["network_configs"][0]["mac"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The script the daemon sends a Linux clone, for the NICs of `vm`.
fn linux_fixup(vm: &Value, fc: bool) -> String {
    let name = vm["config"]["name"].as_str().unwrap();
    let mut s = format!("sync\necho {name} > /etc/hostname\n");
    let nics = vm["network_configs"].as_array().unwrap();
    if fc {
        for (i, n) in nics.iter().enumerate() {
            let mac = n["mac"].as_str().unwrap();
            s += &format!("ip link set eth{i} down\nip link set eth{i} address {mac}\nip link set eth{i} up\n");
        }
    }
    s += "rm -f /etc/systemd/network/10-*.network\n";
    for n in nics {
        let mac = n["mac"].as_str().unwrap();
        let body = match n.get("network") {
            Some(st) => format!(
                "Address={}/{}\nGateway={}",
                st["ip"].as_str().unwrap(),
                st["prefix"],
                st["gateway"].as_str().unwrap()
            ),
            None => "DHCP=ipv4\n[DHCPv4]\nClientIdentifier=mac".to_string(),
        };
        s += &format!(
            "printf '[Match]\\nMACAddress={mac}\\n[Network]\\n{body}\\n' > /etc/systemd/network/10-{}.network\n",
            mac.replace(':', "")
        );
    }
    s + "systemctl restart systemd-networkd"
}

fn exec(sim: &Sim, id: &str, argv: &[&str]) -> Run {
    let mut args = vec!["vm", "exec", id, "--"];
    args.extend_from_slice(argv);
    sim.run(&args)
}

#[test]
fn firecracker_clone_gets_its_lease_only_after_the_right_fixup() {
    let sim = Sim::with_env(FIXUP);
    let source_mac = "02:11:22:33:44:55";
    sim.run(&[
        "sim",
        "seed-snapshot",
        "--name",
        "fcsrc",
        "--hypervisor",
        "firecracker",
        "--image",
        IMAGE,
        "--network",
        "cocoon-dhcp",
        "--source-mac",
        source_mac,
    ])
    .ok();
    let vm = clone(&sim, "fc-clone", "fcsrc");
    let id = vm["id"].as_str().unwrap().to_string();
    let mac = mac0(&vm);
    assert_eq!(sim.info(&id)["fixup"]["kind"], "linux_fc");

    // A freshly run VM in the same root gets its lease; by then the clone would have had its own.
    let control = sim.run_vm("control", &["--network", "cocoon-dhcp"]);
    wait_for("the control VM's lease", || lease_ip(&sim, &mac0(&control)));
    assert_eq!(lease_ip(&sim, &mac), None, "no lease before the fixup");
    assert_eq!(
        lease_ip(&sim, source_mac),
        None,
        "the copied guest does not DHCP at all"
    );

    // Ordinary commands still run.
    assert_eq!(
        exec(&sim, &id, &["hostname"]).ok().stdout.trim(),
        "fc-clone"
    );
    assert_eq!(exec(&sim, &id, &["exit", "3"]).code, 3);

    // A partial script: hostname but no MAC fix, no networkd files.
    let partial = "echo fc-clone > /etc/hostname && systemctl restart systemd-networkd";
    let r = exec(&sim, &id, &["sh", "-c", partial]);
    assert_eq!(r.code, 1, "stderr: {}", r.stderr);
    assert!(r.stderr.contains("fixup rejected"), "{}", r.stderr);
    assert!(
        r.stderr
            .contains(&format!("ip link set eth0 address {mac}")),
        "{}",
        r.stderr
    );
    assert!(
        !r.stderr.contains("Error:"),
        "a guest exit is not a cocoon error: {}",
        r.stderr
    );
    assert_eq!(sim.info(&id)["fixup"]["done"], false);
    assert_eq!(sim.info(&id)["lease_mac"], source_mac);

    let good = linux_fixup(&vm, true);
    exec(&sim, &id, &["sh", "-c", &good]).ok();
    assert_eq!(sim.info(&id)["fixup"]["done"], true);
    let ip = wait_for("the clone's lease under its record MAC", || {
        lease_ip(&sim, &mac)
    });
    assert_eq!(ip, sim.info(&id)["ip"].as_str().unwrap());
    assert_eq!(lease_ip(&sim, source_mac), None);

    let log = read(&sim.root.join("vms").join(&id).join("fixup.log"));
    let verdicts: Vec<bool> = log
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["ok"]
                .as_bool()
                .unwrap()
        })
        .collect();
    assert_eq!(verdicts, vec![false, true]);
}

#[test]
fn static_clone_answers_only_after_the_fixup_and_failures_can_be_injected() {
    let sim = Sim::with_env(FIXUP);
    sim.run(&[
        "sim",
        "seed-snapshot",
        "--name",
        "stsrc",
        "--image",
        IMAGE,
        "--network",
        "cocoon-static",
    ])
    .ok();
    sim.run(&["sim", "fault", "fixup", "*", "--times", "2"])
        .ok();
    let vm = clone(&sim, "st-clone", "stsrc");
    let id = vm["id"].as_str().unwrap().to_string();
    let ip = vm["network_configs"][0]["network"]["ip"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(sim.info(&id)["fixup"]["kind"], "linux");
    let addr: SocketAddr = format!("{ip}:22").parse().unwrap();
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_err(),
        "the pod address must not answer before the fixup"
    );

    let good = linux_fixup(&vm, false);
    for attempt in 1..=2 {
        let r = exec(&sim, &id, &["sh", "-c", &good]);
        assert_eq!(r.code, 1, "injected failure {attempt}");
        assert!(r.stderr.contains("injected fixup failure"), "{}", r.stderr);
    }
    exec(&sim, &id, &["sh", "-c", &good]).ok();
    let banner = wait_for("SSH on the static address", || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        let mut b = [0u8; 8];
        s.read_exact(&mut b).ok()?;
        Some(b)
    });
    assert_eq!(&banner[..4], b"SSH-");
}

#[test]
fn setup_failures_are_cocoon_errors() {
    let sim = Sim::with_env(FIXUP);
    exec(&sim, "NOPE", &["true"]).err("exec: vm NOPE: VM not found");
    sim.run(&[
        "sim",
        "fault",
        "fail",
        "vm exec",
        "--message",
        "dial agent: refused, retry shortly",
    ])
    .ok();
    let vm = sim.run_vm("plain", &[]);
    exec(&sim, vm["id"].as_str().unwrap(), &["true"]).err("exec: dial agent: refused");
}

/// A SAC client the way the daemon talks to it: write, then read until the prompt.
struct Console {
    s: UnixStream,
}

impl Console {
    fn dial(path: &str) -> Console {
        let s = wait_for("the console socket", || UnixStream::connect(path).ok());
        s.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        Console { s }
    }

    fn send(&mut self, line: &str) -> String {
        self.s.write_all(format!("{line}\r\n").as_bytes()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&got).contains("SAC>") {
            assert!(Instant::now() < deadline, "no SAC> after {line:?}: {got:?}");
            if let Ok(n) = self.s.read(&mut buf) {
                assert!(n > 0, "console closed");
                got.extend_from_slice(&buf[..n]);
            }
        }
        String::from_utf8(got).unwrap()
    }
}

#[test]
fn windows_static_clone_is_set_through_sac() {
    let sim = Sim::with_env(FIXUP);
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
        "--source-mac",
        "02:00:00:00:0a:0b",
    ])
    .ok();
    let vm = clone(&sim, "win-clone", "winsrc");
    let id = vm["id"].as_str().unwrap().to_string();
    let net = &vm["network_configs"][0]["network"];
    let (ip, gw) = (
        net["ip"].as_str().unwrap(),
        net["gateway"].as_str().unwrap(),
    );
    let info = sim.info(&id);
    assert_eq!(info["fixup"]["kind"], "windows");
    let socket = info["sac_socket"].as_str().unwrap().to_string();
    assert!(
        socket.ends_with(&format!("/run/cloudhypervisor/{id}/console.sock")),
        "{socket}"
    );

    let mut con = Console::dial(&socket);
    assert!(con.send("").ends_with("SAC>"));
    let listing = con.send("i");
    assert!(
        listing.contains("Net: 7, Ip=169.254.10.11  Subnet=255.255.0.0"),
        "{listing}"
    );

    // The Linux script is the wrong fixup for Windows.
    let r = exec(&sim, &id, &["sh", "-c", "echo win-clone > /etc/hostname"]);
    assert_eq!(r.code, 1);
    assert!(r.stderr.contains("Windows guest"), "{}", r.stderr);
    let pnp = "Get-PnpDevice -Class Net -PresentOnly | ForEach-Object { Disable-PnpDevice -InstanceId $_.InstanceId -Confirm:$false; Enable-PnpDevice -InstanceId $_.InstanceId -Confirm:$false }";
    exec(&sim, &id, &["powershell", "-nop", "-c", pnp]).ok();

    let addr: SocketAddr = format!("{ip}:22").parse().unwrap();
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_millis(300)).is_err(),
        "a static Windows clone waits for SAC"
    );
    let set = con.send(&format!("i 7 {ip} 255.255.0.0 {gw}"));
    assert!(
        set.contains("SAC successfully set the IP Address."),
        "{set}"
    );
    assert!(con.send("i").contains(&format!(
        "Net: 7, Ip={ip}  Subnet=255.255.0.0  Gateway={gw}"
    )));
    wait_for("the static address to answer", || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()
    });
    assert_eq!(sim.info(&id)["sac"][0]["ip"], ip);

    // Windows keeps a SAC-set address across a reboot.
    sim.run(&["sim", "fault", "crash", &id]).ok();
    sim.run(&["vm", "start", &id]).ok();
    let mut con = Console::dial(&socket);
    assert!(con.send("i").contains(&format!("Net: 7, Ip={ip} ")));
    wait_for("the static address after a restart", || {
        TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()
    });
}

#[test]
fn sac_faults() {
    let sim = Sim::with_env(&[("COCOON_SIM_SAC", "1")]);
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
    ])
    .ok();
    sim.run(&["sim", "fault", "sac", "*", "--refuse-set"]).ok();
    let vm = clone(&sim, "w1", "winsrc");
    let id = vm["id"].as_str().unwrap().to_string();
    assert!(
        sim.info(&id).get("fixup").is_none(),
        "SAC alone owes no fixup"
    );
    let socket = sim.info(&id)["sac_socket"].as_str().unwrap().to_string();
    let mut con = Console::dial(&socket);
    let ip = vm["network_configs"][0]["network"]["ip"].as_str().unwrap();
    let r = con.send(&format!("i 7 {ip} 255.255.0.0 10.213.0.1"));
    assert!(r.contains("SAC failed to set the IP Address."), "{r}");
    assert!(!con.send("i").contains(&format!("Ip={ip} ")));

    sim.run(&["sim", "fault", "sac", "*", "--reset"]).ok();
    sim.run(&["sim", "fault", "sac", "*", "--no-socket"]).ok();
    let vm2 = clone(&sim, "w2", "winsrc");
    let info = sim.info(vm2["id"].as_str().unwrap());
    let log = std::path::PathBuf::from(info["log_file"].as_str().unwrap());
    wait_for("the guest to skip its console", || {
        read(&log).contains("SAC console off").then_some(())
    });
    assert!(UnixStream::connect(info["sac_socket"].as_str().unwrap()).is_err());
}
