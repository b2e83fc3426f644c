use super::*;

/// What cocoon's buildCLIArgs gives for a direct-boot (OCI) VM with 2 vCPUs, 1 GiB, two
/// layers, the COW disk, one NIC and a balloon.
fn cocoon_direct_boot() -> Vec<String> {
    [
        "cloud-hypervisor",
        "--api-socket", "/var/lib/cocoon/run/cloudhypervisor/vm1/api.sock",
        "--cpus", "boot=2,max=2",
        "--memory", "size=1073741824",
        "--disk",
        "path=/var/lib/cocoon/oci/blobs/aaa.erofs,readonly=on,image_type=raw,num_queues=2,queue_size=512,serial=cocoon-layer0",
        "path=/var/lib/cocoon/run/cloudhypervisor/vm1/cow.raw,direct=on,sparse=on,image_type=raw,num_queues=2,queue_size=512,queue_affinity=[0@[0],1@[1]],serial=cocoon-cow",
        "--kernel", "/var/lib/cocoon/oci/boot/kkk/vmlinuz",
        "--initramfs", "/var/lib/cocoon/oci/boot/iii/initrd.img",
        "--cmdline", "console=hvc0 loglevel=3 boot=cocoon-overlay cocoon.layers=cocoon-layer0 cocoon.cow=cocoon-cow clocksource=kvm-clock rw net.ifnames=0 cocoon.hostname=web-0 ip=10.215.0.2::10.215.0.1:255.255.255.0:web-0:eth0:off",
        "--net", "tap=tapvm1-0,mac=02:11:22:33:44:55,num_queues=4,queue_size=256,offload_tso=on,offload_ufo=on,offload_csum=on",
        "--rng", "src=/dev/urandom",
        "--watchdog",
        "--balloon", "size=268435456,deflate_on_oom=on,free_page_reporting=on",
        "--serial", "off",
        "--console", "pty",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn cocoon_direct_boot_vector() {
    let Launch::Vmm {
        api_socket,
        vm: Some(vm),
        restore: None,
        ..
    } = parse(cocoon_direct_boot()).unwrap()
    else {
        panic!("not a boot");
    };
    assert_eq!(
        api_socket.as_deref(),
        Some("/var/lib/cocoon/run/cloudhypervisor/vm1/api.sock")
    );
    assert_eq!(vm.disks.len(), 2);
    assert_eq!(vm.nets.len(), 1);
    assert!(vm.watchdog);
    assert_eq!(vm.console, "pty");
    let cfg = crate::config::from_params(&vm).unwrap();
    assert_eq!(cfg["cpus"]["boot_vcpus"], 2);
    assert_eq!(cfg["memory"]["size"], 1073741824u64);
    assert_eq!(cfg["disks"][0]["readonly"], true);
    assert_eq!(cfg["disks"][0]["image_type"], "Raw");
    assert_eq!(cfg["disks"][1]["queue_affinity"][1]["host_cpus"][0], 1);
    assert_eq!(cfg["disks"][1]["serial"], "cocoon-cow");
    assert_eq!(cfg["net"][0]["mac"], "02:11:22:33:44:55");
    assert_eq!(cfg["net"][0]["num_queues"], 4);
    assert_eq!(cfg["console"]["mode"], "Pty");
    assert_eq!(cfg["serial"]["mode"], "Off");
    assert_eq!(cfg["balloon"]["size"], 268435456u64);
    assert_eq!(
        cfg["payload"]["initramfs"],
        "/var/lib/cocoon/oci/boot/iii/initrd.img"
    );
}

/// The UEFI (cloud image) form: firmware instead of kernel, serial on a socket, qcow2 overlay.
#[test]
fn cocoon_uefi_vector() {
    let args = [
        "cloud-hypervisor", "--api-socket", "/run/vm2/api.sock", "--cpus", "boot=1,max=4,kvm_hyperv=on",
        "--memory", "size=536870912,hugepages=on",
        "--disk", "path=/run/vm2/overlay.qcow2,direct=on,image_type=qcow2,backing_files=on,num_queues=1,queue_size=512",
        "path=/run/vm2/cidata.img,readonly=on,image_type=raw,num_queues=1,queue_size=512",
        "--firmware", "/usr/share/cloud-hypervisor/CLOUDHV.fd",
        "--net", "tap=tapvm2-0,mac=02:00:00:00:00:01,num_queues=2,queue_size=256,offload_tso=on,offload_ufo=on,offload_csum=on",
        "--rng", "src=/dev/urandom", "--watchdog",
        "--serial", "socket=/run/vm2/console.sock", "--console", "off",
    ];
    let Launch::Vmm { vm: Some(vm), .. } = parse(args).unwrap() else {
        panic!("not a boot")
    };
    let cfg = crate::config::from_params(&vm).unwrap();
    assert_eq!(cfg["cpus"]["kvm_hyperv"], true);
    assert_eq!(cfg["memory"]["hugepages"], true);
    assert_eq!(cfg["disks"][0]["image_type"], "Qcow2");
    assert_eq!(cfg["disks"][0]["backing_files"], true);
    assert_eq!(cfg["serial"]["mode"], "Socket");
    assert_eq!(cfg["serial"]["socket"], "/run/vm2/console.sock");
    assert_eq!(
        cfg["payload"]["firmware"],
        "/usr/share/cloud-hypervisor/CLOUDHV.fd"
    );
}

/// Clone and restore launch an empty VMM: the API socket only.
#[test]
fn restore_launch_is_socket_only() {
    let l = parse(["cloud-hypervisor", "--api-socket", "/run/vm3/api.sock"]).unwrap();
    assert_eq!(
        l,
        Launch::Vmm {
            api_socket: Some("/run/vm3/api.sock".into()),
            vm: None,
            restore: None,
            log_file: None,
            no_shutdown: false
        }
    );
    assert_eq!(api_socket_path("path=/x.sock"), "/x.sock");
    assert_eq!(
        parse(["cloud-hypervisor", "--version"]).unwrap(),
        Launch::Version
    );
}

#[test]
fn unknown_arguments_and_options_fail() {
    let e = parse(["cloud-hypervisor", "--api-socket", "/a", "--bogus"]).unwrap_err();
    assert!(
        e.to_string().contains("unexpected argument '--bogus'"),
        "{e}"
    );
    assert_eq!(e.exit_code(), 2);
    // VM options without a payload are refused, as cloud-hypervisor's groups refuse them.
    assert!(parse(["cloud-hypervisor", "--api-socket", "/a", "--cpus", "boot=1"]).is_err());
    let mut args = cocoon_direct_boot();
    let i = args.iter().position(|a| a == "--rng").unwrap();
    args[i + 1] = "src=/dev/urandom,colour=blue".into();
    let Launch::Vmm { vm: Some(vm), .. } = parse(args).unwrap() else {
        panic!()
    };
    assert_eq!(
        crate::config::from_params(&vm).unwrap_err(),
        "Error parsing --rng: unknown option: colour"
    );
}
