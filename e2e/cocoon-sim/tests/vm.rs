//! VM verbs against CLI-4.1, CLI-4.2 and CLI-6.4–CLI-6.14, and the error classes of CLI-3.

mod common;

use common::*;
use serde_json::Value;

#[test]
fn run_prints_running_record_with_pid_in_go_shape() {
    let sim = Sim::new();
    let r = {
        sim.pull(IMAGE);
        sim.run(&[
            "vm",
            "run",
            "--output",
            "json",
            "--name",
            "vk-default-demo-0",
            "--cpu",
            "2",
            "--memory",
            "4294967296",
            "--storage",
            "21474836480",
            IMAGE,
        ])
        .ok()
    };
    assert!(
        r.stdout.ends_with("}\n"),
        "one pretty document ending in a newline"
    );
    assert!(r.stdout.contains("\n  \"id\": "), "2-space indent");
    let vm = r.json();
    assert!(is_id(vm["id"].as_str().unwrap()));
    assert_eq!(vm["hypervisor"], "cloud-hypervisor");
    assert_eq!(vm["state"], "running");
    assert!(vm["pid"].as_i64().unwrap() > 0);
    assert_eq!(vm["config"]["name"], "vk-default-demo-0");
    assert_eq!(vm["config"]["cpu"], 2);
    assert_eq!(vm["config"]["memory"], 4294967296i64);
    assert_eq!(vm["config"]["storage"], 21474836480i64);
    assert_eq!(vm["config"]["image_type"], "oci");
    assert!(vm["config"]["image_digest"]
        .as_str()
        .unwrap()
        .starts_with("sha256:"));
    assert!(
        vm["config"].get("network").is_none(),
        "empty network omitted"
    );
    assert!(vm["config"].get("windows").is_none(), "false bools omitted");
    let pos = |k: &str| {
        r.stdout
            .find(&format!("\"{k}\": "))
            .unwrap_or_else(|| panic!("{k} missing"))
    };
    assert!(
        pos("image_type") < pos("name"),
        "Go embeds Config before name"
    );
    let order = [
        "id",
        "hypervisor",
        "state",
        "config",
        "pid",
        "socket_path",
        "network_configs",
        "first_booted",
        "created_at",
    ];
    assert!(
        order.windows(2).all(|w| pos(w[0]) < pos(w[1])),
        "Go struct field order"
    );
    assert!(vm["socket_path"].as_str().unwrap().ends_with("/api.sock"));
    let nic = &vm["network_configs"][0];
    let id = vm["id"].as_str().unwrap();
    assert_eq!(nic["tap"], format!("tap{}-0", &id[..8]));
    let mac = nic["mac"].as_str().unwrap();
    assert!(mac.starts_with("02:") && mac.len() == 17 && mac == mac.to_lowercase());
    assert_eq!(nic["num_queues"], 4);
    assert_eq!(nic["queue_size"], 512);
    assert!(
        nic.get("network").is_none(),
        "DHCP NIC has no network block"
    );
    assert_eq!(vm["first_booted"], true);
    assert!(vm["created_at"].as_str().unwrap().contains('T'));
    assert!(vm.get("stopped_at").is_none());
}

#[test]
fn default_name_comes_from_the_image() {
    let sim = Sim::new();
    sim.pull(IMAGE);
    let vm = sim
        .run(&["vm", "run", "--output", "json", IMAGE])
        .ok()
        .json();
    assert_eq!(
        vm["config"]["name"],
        "cocoon-cocoonstack-cocoon-ubuntu-24.04"
    );
}

#[test]
fn run_rejects_taken_name_and_unpulled_image_and_bad_sizes() {
    let sim = Sim::new();
    let vm = sim.run_vm("taken", &[]);
    let id = vm["id"].as_str().unwrap();
    sim.run(&["vm", "run", "--output", "json", "--name", "taken", IMAGE])
        .err(&format!(
            "reserve VM record: vm name \"taken\" already exists (id: {id})"
        ));
    sim.run(&[
        "vm",
        "run",
        "--output",
        "json",
        "--name",
        "x",
        "docker.io/never/pulled:1",
    ])
    .err("not resolved");
    sim.run(&[
        "vm", "run", "--output", "json", "--name", "y", "--memory", "256M", IMAGE,
    ])
    .err("--memory must be at least 512M");
    sim.run(&[
        "vm", "run", "--output", "json", "--name", "y", "--cpu", "0", IMAGE,
    ])
    .err("--cpu must be at least 1, got 0");
    sim.run(&["vm", "run", "--output", "json", "--fc", "--windows", IMAGE])
        .err("--fc and --windows are mutually exclusive");
    sim.run(&["vm", "run", "--output", "json", "--name", "bad name", IMAGE])
        .err("is invalid");
}

#[test]
fn firecracker_run_and_windows_needs_cloud_image() {
    let sim = Sim::new();
    let vm = sim.run_vm("fc1", &["--fc"]);
    assert_eq!(vm["hypervisor"], "firecracker");
    assert_eq!(vm["network_configs"][0]["num_queues"], 2);
    sim.run(&[
        "vm",
        "run",
        "--output",
        "json",
        "--windows",
        "--name",
        "w",
        IMAGE,
    ])
    .err("--windows requires cloudimg");
    let url = "https://cloud-images.ubuntu.com/noble/current/noble-server-cloudimg-amd64.img";
    sim.pull(url);
    let w = sim
        .run(&[
            "vm",
            "run",
            "--output",
            "json",
            "--windows",
            "--name",
            "win",
            url,
        ])
        .ok()
        .json();
    assert_eq!(w["config"]["image_type"], "cloudimg");
    assert_eq!(w["config"]["windows"], true);
    sim.run(&["vm", "run", "--output", "json", "--fc", "--name", "f2", url])
        .err("--fc requires OCI images");
}

/// A cloud image at an `http://` URL on loopback is really fetched: the pull waits for the
/// server, and its status decides.
#[test]
fn a_loopback_url_is_fetched_and_its_status_decides() {
    use std::io::{BufRead, BufReader, Write};
    let sim = Sim::new();
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let serve = std::thread::spawn(move || {
        let mut asked = Vec::new();
        for answer in ["200 OK\r\n\r\nQFI\u{fb}", "404 Not Found\r\n\r\n"] {
            let (mut conn, _) = server.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&conn).read_line(&mut line).unwrap();
            asked.push(line.trim_end().to_string());
            conn.write_all(format!("HTTP/1.0 {answer}").as_bytes())
                .unwrap();
        }
        asked
    });
    let url = format!("http://127.0.0.1:{port}/cloud.img");
    sim.run(&["image", "pull", &url]).ok();
    let gone = format!("http://127.0.0.1:{port}/gone.img");
    sim.run(&["image", "pull", &gone]).err(&format!(
        "pull {gone}: http get {gone}: status 404 404 Not Found"
    ));
    let asked = serve.join().unwrap();
    assert_eq!(asked, ["GET /cloud.img HTTP/1.0", "GET /gone.img HTTP/1.0"]);
    let list = sim.run(&["image", "list", "--format", "json"]).ok().json();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["name"].as_str())
        .collect();
    assert_eq!(names, [url.as_str()]);
}

#[test]
fn inspect_resolves_id_name_and_prefix_and_reports_missing() {
    let sim = Sim::new();
    let vm = sim.run_vm("web", &[]);
    let id = vm["id"].as_str().unwrap();
    assert_eq!(sim.inspect(id)["id"], id);
    assert_eq!(sim.inspect("web")["id"], id);
    assert_eq!(sim.inspect(&id[..3])["id"], id);
    sim.run(&["vm", "inspect", "ghost"])
        .err("inspect: vm ghost: VM not found");
    sim.run(&["vm", "inspect", &id[..2]]).err("VM not found");
    sim.run(&["vm", "inspect", "-o", "json", id])
        .err("unknown shorthand flag: 'o' in -o");
    sim.run(&["vm", "inspect"])
        .err("accepts 1 arg(s), received 0");
}

#[test]
fn list_is_plain_text_when_empty_and_sorted_raw_records_otherwise() {
    let sim = Sim::new();
    let r = sim.run(&["vm", "list", "-o", "json"]).ok();
    assert_eq!(r.stdout, "No VMs found.\n");
    let a = sim.run_vm("a", &[]);
    let b = sim.run_vm("b", &[]);
    sim.run(&["sim", "fault", "crash", "a"]).ok();
    let list = sim.run(&["vm", "list", "-o", "json"]).ok().json();
    let arr = list.as_array().unwrap();
    assert_eq!(arr.len(), 2);
    assert_eq!(arr[0]["id"], a["id"]);
    assert_eq!(arr[1]["id"], b["id"]);
    assert_eq!(
        arr[0]["state"], "running",
        "list shows the raw stored state"
    );
    assert_eq!(
        sim.inspect("a")["state"],
        "stopped (stale)",
        "inspect reconciles"
    );
}

#[test]
fn stop_start_and_rm_force() {
    let sim = Sim::new();
    let vm = sim.run_vm("life", &[]);
    let pid = vm["pid"].as_i64().unwrap();
    sim.run(&["vm", "stop", "life"]).ok();
    let stopped = sim.inspect("life");
    assert_eq!(stopped["state"], "stopped");
    assert_eq!(stopped["pid"], 0);
    assert!(stopped.get("socket_path").is_none());
    assert!(stopped.get("stopped_at").is_some());
    sim.run(&["vm", "start", "life"]).ok();
    let again = sim.inspect("life");
    assert_eq!(again["state"], "running");
    assert!(again["pid"].as_i64().unwrap() > 0 && again["pid"].as_i64() != Some(pid));
    let r = sim.run(&["vm", "start", "life", "-o", "json"]).ok().json();
    assert_eq!(
        r["succeeded"][0], vm["id"],
        "start of a running VM is a no-op success"
    );
    assert_eq!(sim.inspect("life")["pid"], again["pid"]);
    sim.run(&["vm", "rm", "life"])
        .err("running (force required)");
    let r = sim.run(&["vm", "rm", "--force", "life"]).ok();
    assert_eq!(r.stdout, "");
    sim.run(&["vm", "inspect", "life"]).err("VM not found");
    sim.run(&["vm", "rm", "--force", "life"])
        .err("vm life: VM not found");
    sim.run(&["vm", "start", "life"])
        .err("vm life: VM not found");
    sim.run(&["vm", "stop", "life"])
        .err("vm life: VM not found");
    sim.run(&["vm", "rm", "--force"])
        .err("requires at least 1 arg(s)");
}

#[test]
fn clone_from_snapshot_prints_pid_zero_then_inspect_has_pid() {
    let sim = Sim::new();
    let snap = sim
        .run(&[
            "sim",
            "seed-snapshot",
            "--name",
            "ghcr.io/acme/agent:v2",
            "--image",
            IMAGE,
        ])
        .ok()
        .json();
    assert_eq!(snap["hypervisor"], "cloud-hypervisor");
    let r = sim
        .run(&[
            "vm",
            "clone",
            "--output",
            "json",
            "--name",
            "agent-0",
            "--pull",
            "--restore-mode",
            "ondemand",
            "--nics",
            "1",
            "ghcr.io/acme/agent:v2",
        ])
        .ok();
    let vm = r.json();
    assert_eq!(vm["state"], "running");
    assert_eq!(vm["pid"], 0);
    assert!(vm.get("socket_path").is_none());
    assert_eq!(vm["config"]["image"], IMAGE);
    assert_eq!(vm["config"]["cpu"], 2);
    assert!(sim.inspect("agent-0")["pid"].as_i64().unwrap() > 0);
    sim.run(&[
        "vm",
        "clone",
        "--output",
        "json",
        "--name",
        "agent-0",
        "ghcr.io/acme/agent:v2",
    ])
    .err("reserve VM record: vm name \"agent-0\" already exists (id: ");
    sim.run(&["vm", "clone", "--output", "json", "nope"])
        .err("snapshot not found");
    sim.run(&[
        "vm",
        "clone",
        "--output",
        "json",
        "--from-dir",
        "/tmp",
        "ghcr.io/acme/agent:v2",
    ])
    .err("--from-dir and positional SNAPSHOT are mutually exclusive");
    sim.run(&[
        "vm",
        "clone",
        "--output",
        "json",
        "--cpu",
        "1",
        "ghcr.io/acme/agent:v2",
    ])
    .err("--cpu 1 below snapshot minimum 2");
    let d = sim
        .run(&["vm", "clone", "--output", "json", "ghcr.io/acme/agent:v2"])
        .ok()
        .json();
    let id = d["id"].as_str().unwrap();
    assert_eq!(d["config"]["name"], format!("cocoon-clone-{}", &id[..8]));
}

#[test]
fn firecracker_clone_refuses_resource_overrides() {
    let sim = Sim::new();
    sim.run(&[
        "sim",
        "seed-snapshot",
        "--name",
        "fcsnap",
        "--hypervisor",
        "firecracker",
    ])
    .ok();
    sim.run(&["vm", "clone", "--output", "json", "--cpu", "4", "fcsnap"])
        .err("--cpu 4 not supported: Firecracker cannot change CPU after snapshot/load (snapshot has 2)");
    sim.run(&[
        "vm", "clone", "--output", "json", "--memory", "2G", "fcsnap",
    ])
    .err("--memory not supported: Firecracker cannot change memory after snapshot/load");
    let vm = sim
        .run(&["vm", "clone", "--output", "json", "--name", "f", "fcsnap"])
        .ok()
        .json();
    assert_eq!(vm["hypervisor"], "firecracker");
}

#[test]
fn clone_from_dir_reads_the_envelope() {
    let sim = Sim::new();
    sim.run(&["sim", "seed-snapshot", "--name", "src"]).ok();
    let out = sim
        .cmd(&["snapshot", "export", "src", "-o", "-"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let dir = sim.root.join("fromdir");
    std::fs::create_dir_all(&dir).unwrap();
    tar::Archive::new(&out.stdout[..]).unpack(&dir).unwrap();
    let d = dir.to_str().unwrap();
    let vm = sim
        .run(&[
            "vm",
            "clone",
            "--output",
            "json",
            "--name",
            "fd",
            "--pull",
            "--from-dir",
            d,
        ])
        .ok()
        .json();
    assert_eq!(vm["state"], "running");
    std::fs::remove_file(dir.join("snapshot.json")).unwrap();
    sim.run(&[
        "vm",
        "clone",
        "--output",
        "json",
        "--name",
        "fd2",
        "--from-dir",
        d,
    ])
    .err("snapshot.json not found");
}

#[test]
fn static_network_convention_fills_network_block() {
    let sim = Sim::new();
    let vm = sim.run_vm("st", &["--network", "cocoon-static"]);
    let net = &vm["network_configs"][0]["network"];
    let ip = net["ip"].as_str().unwrap();
    assert_eq!(net["prefix"], 16);
    assert!(net["gateway"].as_str().unwrap().ends_with(".0.1"));
    assert_eq!(sim.info("st")["ip"], ip);
    assert_eq!(vm["config"]["network"], "cocoon-static");
    let none = sim.run_vm("nonic", &["--nics", "0"]);
    assert!(
        none.get("network_configs").is_none(),
        "no NICs: key omitted"
    );
}

#[test]
fn reconcile_stale_create_outcomes() {
    let sim = Sim::new();
    sim.pull(IMAGE);
    let r = sim
        .run(&["vm", "reconcile-stale-create", "ghost", "-o", "json"])
        .ok()
        .json();
    assert_eq!(r, serde_json::json!({"outcome": "not-found"}));
    let vm = sim.run_vm("done", &[]);
    let r = sim
        .run(&["vm", "reconcile-stale-create", "done", "-o", "json"])
        .ok()
        .json();
    assert_eq!(r["outcome"], "not-creating");
    assert_eq!(r["id"], vm["id"]);
    sim.run(&["sim", "fault", "delay", "vm run", "60000"]).ok();
    let mut child = sim.spawn(&["vm", "run", "--output", "json", "--name", "half", IMAGE]);
    let id = wait_for("creating placeholder", || {
        let l = sim.run(&["vm", "list", "-o", "json"]);
        let v: Value = serde_json::from_str(&l.stdout).ok()?;
        v.as_array()?
            .iter()
            .find(|x| x["config"]["name"] == "half" && x["state"] == "creating")
            .map(|x| x["id"].as_str().unwrap().to_string())
    });
    let r = sim
        .run(&["vm", "reconcile-stale-create", &id, "-o", "json"])
        .ok()
        .json();
    assert_eq!(r["outcome"], "busy");
    child.kill().unwrap();
    child.wait().unwrap();
    sim.run(&["sim", "fault", "clear"]).ok();
    let r = sim
        .run(&["vm", "reconcile-stale-create", &id, "-o", "json"])
        .ok()
        .json();
    assert_eq!(r["outcome"], "collected");
    sim.run_vm("half", &[]);
}

#[test]
fn exec_relays_output_and_exit_code() {
    let sim = Sim::new();
    sim.run_vm("ex", &[]);
    let r = sim
        .run(&["vm", "exec", "ex", "--", "echo", "hello", "guest"])
        .ok();
    assert_eq!(r.stdout, "hello guest\n");
    let r = sim.run(&["vm", "exec", "-e", "A=1", "ex", "--", "exit", "7"]);
    assert_eq!(r.code, 7);
    assert!(
        !r.stderr.contains("Error:"),
        "guest exit codes carry no Error line"
    );
    let r = sim.run_stdin(&["vm", "exec", "-i", "ex", "--", "cat"], b"piped");
    assert_eq!(r.stdout, "piped");
    sim.run(&[
        "sim",
        "fault",
        "exec",
        "ex",
        "--exit-code",
        "3",
        "--stdout",
        "scripted",
    ])
    .ok();
    let r = sim.run(&["vm", "exec", "ex", "--", "anything"]);
    assert_eq!((r.code, r.stdout.as_str()), (3, "scripted"));
    let log = read(
        &sim.root
            .join("vms")
            .join(sim.info("ex")["id"].as_str().unwrap())
            .join("exec.log"),
    );
    assert!(log.contains("\"argv\":[\"echo\",\"hello\",\"guest\"]"));
    sim.run(&["vm", "exec", "ghost", "--", "true"])
        .err("exec: vm ghost: VM not found");
    sim.run(&["sim", "fault", "crash", "ex"]).ok();
    sim.run(&["vm", "exec", "ex", "--", "true"])
        .err("exec: VM not running");
}

#[test]
fn logs_print_the_hypervisor_log_and_tail() {
    let sim = Sim::new();
    sim.run_vm("lg", &[]);
    let full = wait_for("guest log lines", || {
        let r = sim.run(&["vm", "logs", "lg"]).ok();
        (r.stdout.lines().count() >= 2).then_some(r.stdout)
    });
    assert!(full.contains("booting lg"));
    let tail = sim.run(&["vm", "logs", "--tail", "1", "lg"]).ok();
    assert_eq!(tail.stdout.lines().count(), 1);
    sim.run(&["vm", "logs", "ghost"]).err("VM not found");
}

#[test]
fn net_resizes_nics() {
    let sim = Sim::new();
    let vm = sim.run_vm("nr", &[]);
    let r = sim
        .run(&["vm", "net", "--nics", "2", "nr", "-o", "json"])
        .ok()
        .json();
    assert_eq!(
        (r["before"].as_i64(), r["after"].as_i64()),
        (Some(1), Some(2))
    );
    assert_eq!(r["added"][0]["index"], 1);
    assert!(r.get("removed").is_none());
    assert_eq!(
        sim.inspect("nr")["network_configs"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    sim.run(&["vm", "net", "--nics", "0", "nr"]).ok();
    assert!(sim.inspect("nr").get("network_configs").is_none());
    sim.run(&["vm", "net", "--nics", "1", "nr"]).ok();
    let mac = sim.inspect("nr")["network_configs"][0]["mac"].clone();
    assert_ne!(
        mac, vm["network_configs"][0]["mac"],
        "re-added NIC 0 gets a new MAC"
    );
    let fc = sim.run_vm("nrf", &["--fc"]);
    sim.run(&["vm", "net", "--nics", "2", fc["id"].as_str().unwrap()])
        .err("does not support");
}

#[test]
fn usage_errors_read_like_cobra() {
    let sim = Sim::new();
    sim.run(&["vm", "reconcile-stale-creat", "x"])
        .err("unknown command \"reconcile-stale-creat\" for \"cocoon vm\"");
    sim.run(&["vm", "list", "--bogus"])
        .err("unknown flag: --bogus");
    sim.run(&["vm", "run", "--cpu", "two", IMAGE])
        .err("invalid argument \"two\" for \"--cpu\" flag");
    let r = Sim::new();
    let out = std::process::Command::new(BIN)
        .args(["vm", "list", "-o", "json"])
        .env_remove("COCOON_SIM_ROOT")
        .env_remove("COCOON_ROOT_DIR")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "no state dir is an error, never /var/lib/cocoon"
    );
    let with_flag = std::process::Command::new(BIN)
        .args([
            "--root-dir",
            r.root.to_str().unwrap(),
            "vm",
            "list",
            "-o",
            "json",
        ])
        .env_remove("COCOON_SIM_ROOT")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&with_flag.stdout),
        "No VMs found.\n"
    );
}

#[test]
fn concurrent_invocations_keep_names_unique() {
    let sim = Sim::new();
    sim.pull(IMAGE);
    let children: Vec<_> = (0..6)
        .map(|i| {
            let name = if i < 3 {
                "same".to_string()
            } else {
                format!("vm-{i}")
            };
            sim.spawn(&["vm", "run", "--output", "json", "--name", &name, IMAGE])
        })
        .collect();
    let codes: Vec<i32> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap().status.code().unwrap())
        .collect();
    assert_eq!(
        codes[..3].iter().filter(|c| **c == 0).count(),
        1,
        "exactly one `same` wins: {codes:?}"
    );
    assert!(codes[3..].iter().all(|c| *c == 0), "{codes:?}");
    let list = sim.run(&["vm", "list", "-o", "json"]).ok().json();
    assert_eq!(list.as_array().unwrap().len(), 4);
}
