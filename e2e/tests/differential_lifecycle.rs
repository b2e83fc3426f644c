//! Every tier-S verb the daemon calls, on a root that holds an image, VMs and snapshots: the
//! simulator in tier S and the real cocoon CLI (on the cloud-hypervisor stand-in) must answer
//! the same argv with the same exit code, final `Error:` line and JSON shape. The VMs have no
//! NIC (`--nics 0`), so neither side needs CNI.

mod differential_common;

use differential_common::{Differences, Pair};

/// `snapshot export -o -`'s archive: its member names in order.
fn members(archive: &[u8]) -> Vec<String> {
    let mut tar = tar::Archive::new(archive);
    tar.entries()
        .expect("a tar stream")
        .map(|e| {
            let e = e.expect("a tar entry");
            e.path().expect("a member name").display().to_string()
        })
        .collect()
}

#[test]
fn image_vm_and_snapshot_verbs_answer_alike() {
    let Some(pair) = Pair::new() else {
        return;
    };
    let mut d = Differences::default();
    let disk = pair.import_guest_image("guest");
    d.line(&pair, "image inspect guest");
    d.line(&pair, "image inspect nope");
    // Pulling a cloud image by URL: both sides fetch (or, the simulator, record) it; a path
    // the server does not know is the server's 404.
    let base = differential_common::web::serve(&disk);
    let url = format!("{base}/guest.qcow2");
    d.both(&pair, &["image", "pull", &url]);
    d.both(&pair, &["image", "inspect", &url]);
    d.both(&pair, &["image", "pull", &format!("{base}/missing.qcow2")]);
    let gone = differential_common::path(&disk.with_extension("gone"));
    d.both(&pair, &["image", "import", "other", &gone]);

    let run =
        "vm run -o json --name d1 --nics 0 --cpu 1 --memory 1G --storage 10G --dns 10.0.0.53 guest";
    let (s, r) = d.line(&pair, run);
    s.ok("simulator vm run");
    r.ok("real vm run");
    d.line(&pair, run);
    d.line(
        &pair,
        "vm run --name d2 --nics 0 --cpu 2 --memory 512M guest",
    );
    d.line(&pair, "vm run --name d3 --nics 0 --cpu 64 guest");
    d.line(&pair, "vm run --name d3 --nics 0 not-imported");
    d.line(&pair, "vm inspect d1");
    d.line(&pair, "vm list -o json");
    d.line(&pair, "vm start d1");

    d.line(&pair, "snapshot save --name s1 --description first d1");
    d.line(&pair, "snapshot save --name s1 d1");
    d.line(&pair, "snapshot save --name s9 nope");
    d.line(&pair, "snapshot save --name st d2");
    d.line(&pair, "vm stop d2");
    d.line(&pair, "snapshot save --name s8 d2");
    d.line(&pair, "vm inspect d2");
    d.line(&pair, "vm start d2");
    d.line(&pair, "snapshot inspect s1");
    d.line(&pair, "snapshot inspect st");
    d.line(&pair, "vm inspect d1");

    // Tier S clone: the older flags are accepted; resources may only grow, up to the host.
    let clone = "vm clone -o json --name c1 --on-demand --pull --cpu 2 --memory 2G --storage 20G --nics 0 s1";
    let (s, r) = d.line(&pair, clone);
    s.ok("simulator vm clone");
    r.ok("real vm clone");
    d.line(&pair, "vm clone -o json --name c2 s1");
    d.line(&pair, "vm clone --name c3 --cpu 1 st");
    d.line(&pair, "vm clone --name c3 --memory 512M s1");
    d.line(&pair, "vm clone --name c3 --storage 5G s1");
    d.line(&pair, "vm clone --name c3 --cpu 64 s1");
    d.line(&pair, "vm clone --name c1 s1");
    d.line(&pair, "vm clone --name c3 nope");
    d.line(&pair, "vm inspect c1");
    d.line(&pair, "vm list -o json");

    let export = ["snapshot", "export", "s1", "-o", "-"];
    let (s, r) = pair.both(&export);
    d.compare_status(&pair, &export, &s, &r);
    let (sim_archive, real_archive) = (s.ok("simulator export").stdout, r.ok("real export").stdout);
    let (sm, rm) = (members(&sim_archive), members(&real_archive));
    if sm != rm {
        d.note(format!(
            "snapshot export members\n  simulator {sm:?}\n  real      {rm:?}"
        ));
    }
    let import = [
        "snapshot",
        "import",
        "--name",
        "s2",
        "--description",
        "imported",
    ];
    for (sim_in, real_in) in [
        (&sim_archive[..], &real_archive[..]),
        (&sim_archive[..], &real_archive[..]),
        (&b"not an archive"[..], &b"not an archive"[..]),
    ] {
        let s = pair.sim.run_with_stdin(&import, Some(sim_in));
        let r = pair.real.run_with_stdin(&import, Some(real_in));
        d.compare(&pair, &import, &s, &r);
    }
    d.line(&pair, "snapshot inspect s2");
    d.line(&pair, "vm clone -o json --name c4 s2");

    d.line(&pair, "snapshot rm s2");
    d.line(&pair, "snapshot rm s2");
    // A stream cut inside the first header or inside snapshot.json (both sides' archives
    // start with a 512-byte header, then the envelope).
    for cut in [100, 600] {
        let s = pair.sim.run_with_stdin(&import, Some(&sim_archive[..cut]));
        let r = pair
            .real
            .run_with_stdin(&import, Some(&real_archive[..cut]));
        d.compare(&pair, &import, &s, &r);
    }
    d.line(&pair, "snapshot inspect s2");

    // The real cocoon's archive is what another node would send: the simulator takes it too,
    // and clones it (with an empty guest filesystem: a real disk holds none of its images).
    let cross = ["snapshot", "import", "--name", "from-real"];
    let s = pair.sim.run_with_stdin(&cross, Some(&real_archive));
    let r = pair.real.run_with_stdin(&cross, Some(&real_archive));
    d.compare(&pair, &cross, &s, &r);
    d.line(&pair, "snapshot inspect from-real");
    d.line(&pair, "vm clone -o json --name c5 from-real");

    // A Windows guest boots through UEFI without a cloud-init seed: no cidata.img anywhere.
    d.line(
        &pair,
        "vm run -o json --windows --nics 0 --cpu 1 --name w1 guest",
    );
    d.line(&pair, "snapshot save --name ws w1");
    let export = ["snapshot", "export", "ws", "-o", "-"];
    let (s, r) = pair.both(&export);
    d.compare_status(&pair, &export, &s, &r);
    let (sm, rm) = (members(&s.stdout), members(&r.stdout));
    if sm != rm {
        d.note(format!(
            "snapshot export ws members\n  simulator {sm:?}\n  real      {rm:?}"
        ));
    }
    d.line(&pair, "vm clone -o json --name wc ws");

    d.line(&pair, "vm rm --force c1 c2 c4 c5 w1 wc");
    d.line(&pair, "vm rm --force c1");
    d.line(&pair, "vm rm --force d1 d2");
    d.line(&pair, "vm list -o json");
    d.line(&pair, "snapshot rm s1 st from-real ws");
    d.assert_none();
}

/// The daemon's cross-node clone: a snapshot of a VM booted from a cloud image pulled by URL,
/// exported on one node and imported on another that lacks the image, cloned there without
/// and with `--pull` (which pulls the image). Both nodes share this machine, so the real
/// clone without `--pull` still finds its overlay's backing file where the first node keeps it.
#[test]
fn a_second_node_clones_an_imported_snapshot() {
    let (Some(first), Some(second)) = (Pair::new(), Pair::new()) else {
        return;
    };
    let mut d = Differences::default();
    let disk = first.tmp.path().join("base.qcow2");
    let made = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&disk)
        .arg("64M")
        .status()
        .expect("qemu-img runs");
    assert!(made.success(), "qemu-img create");
    let url = format!("{}/base.qcow2", differential_common::web::serve(&disk));
    let (s, r) = d.both(&first, &["image", "pull", &url]);
    s.ok("simulator pull");
    r.ok("real pull");
    d.both(
        &first,
        &[
            "vm", "run", "--name", "src", "--nics", "0", "--cpu", "1", &url,
        ],
    );
    d.line(&first, "snapshot save --name base-snap src");
    let export = ["snapshot", "export", "base-snap", "-o", "-"];
    let (s, r) = first.both(&export);
    let (sim_archive, real_archive) = (s.ok("simulator export").stdout, r.ok("real export").stdout);

    let import = ["snapshot", "import", "--name", "base-snap"];
    let s = second.sim.run_with_stdin(&import, Some(&sim_archive));
    let r = second.real.run_with_stdin(&import, Some(&real_archive));
    d.compare(&second, &import, &s, &r);
    d.line(&second, "image inspect base-snap");
    d.both(&second, &["image", "inspect", &url]);
    d.line(&second, "vm clone -o json --name n1 --on-demand base-snap");
    d.line(
        &second,
        "vm clone -o json --name n2 --on-demand --pull base-snap",
    );
    d.both(&second, &["image", "inspect", &url]);
    d.line(&second, "vm rm --force n1 n2");
    d.line(&first, "vm rm --force src");
    d.assert_none();
}
