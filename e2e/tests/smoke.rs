//! The control plane end to end: a Node as a cocoon node registers it and a Pod the scheduler
//! places there through kube-rs, read back with kubectl, then a teardown that leaves nothing
//! behind.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};

use e2e::sim::{netns_list, CocoonSim};
use e2e::{Testbed, TestbedOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_and_pod_round_trip_then_clean_teardown() {
    let tb = Testbed::start(
        TestbedOptions::control_plane()
            .with_sim()
            .with_namespace("smoke"),
    )
    .await
    .expect("testbed starts");
    let client = tb.client().unwrap();

    // What the daemon registers (N2, N4, N8, N12): the pool label, the provider taint, Ready,
    // and room for a pod. The node lifecycle controller takes the `not-ready` taint the
    // apiserver adds to every new node off once it sees Ready.
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": "cocoon-node-1",
            "labels": { "type": "virtual-kubelet", "kubernetes.io/role": "agent",
                        "kubernetes.io/hostname": "cocoon-node-1",
                        "cocoonstack.io/pool": e2e::daemon::POOL }
        },
        "spec": {
            "taints": [{ "key": "virtual-kubelet.io/provider", "value": "cocoon", "effect": "NoSchedule" }]
        },
        "status": {
            "capacity": { "cpu": "8", "memory": "16Gi", "pods": "110" },
            "allocatable": { "cpu": "8", "memory": "16Gi", "pods": "110" },
            "conditions": [{ "type": "Ready", "status": "True", "reason": "KubeletReady",
                             "lastHeartbeatTime": now, "lastTransitionTime": now }]
        }
    }))
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("node created");

    let pod = e2e::daemon::pod_manifest("smoke", "hello", "cocoon-node-1", serde_json::json!({}))
        .unwrap();
    assert!(pod.spec.as_ref().unwrap().node_name.is_none());
    let pods = Api::<Pod>::namespaced(client.clone(), "smoke");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("pod created: needs the default ServiceAccount the controller-manager creates");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let p = pods.get("hello").await.unwrap();
        if p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("cocoon-node-1") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the scheduler did not place the pod: {:?}",
            p.status
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    let version = tb
        .kubectl(&["version", "--client", "-o", "json"])
        .await
        .unwrap();
    let version: serde_json::Value = serde_json::from_str(&version).unwrap();
    assert_eq!(
        version["clientVersion"]["minor"], "37",
        "the built kubectl, not /usr/bin's"
    );

    let node_json = tb
        .kubectl(&["get", "node", "cocoon-node-1", "-o", "json"])
        .await
        .unwrap();
    let node_json: serde_json::Value = serde_json::from_str(&node_json).unwrap();
    assert_eq!(node_json["metadata"]["labels"]["type"], "virtual-kubelet");

    let bound = tb
        .kubectl(&[
            "get",
            "pod",
            "hello",
            "-n",
            "smoke",
            "-o",
            "jsonpath={.spec.nodeName}",
        ])
        .await
        .unwrap();
    assert_eq!(bound, "cocoon-node-1");
    let on_node = tb
        .kubectl(&[
            "get",
            "pods",
            "-A",
            "--field-selector",
            "spec.nodeName=cocoon-node-1",
            "-o",
            "name",
        ])
        .await
        .unwrap();
    assert_eq!(on_node.trim(), "pod/hello");

    // One simulated VM, so the teardown has a guest process, a netns and a cgroup scope to
    // take back. The simulator fetches nothing: images are a local index.
    let sim = tb.sim.as_ref().unwrap();
    sim.run(&["image", "pull", "localhost/smoke/base:1"])
        .unwrap();
    sim.run(&["vm", "run", "--name", "smoke-vm", "localhost/smoke/base:1"])
        .unwrap();
    let ids = sim.vm_ids();
    assert_eq!(ids.len(), 1, "one VM: {ids:?}");
    let netns: Vec<String> = ids.iter().map(|id| CocoonSim::netns_name(id)).collect();
    if e2e::sim::netns_supported() {
        assert!(netns_list().contains(&netns[0]), "the VM got its netns");
    }
    let cgroup = sim.cgroup_parent_dir();

    let run = tb.run_dir().to_path_buf();
    let started: Vec<i32> = tb.processes().into_iter().map(|(pid, _)| pid).collect();
    assert!(
        started.len() >= 4,
        "etcd, kube-apiserver, kube-scheduler and kube-controller-manager run: {started:?}"
    );

    drop(tb);

    assert!(
        e2e::procs::processes_of(&run).is_empty(),
        "processes left: {:?}",
        e2e::procs::processes_of(&run)
    );
    for pid in started {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")),
            "pid {pid} survived the teardown"
        );
    }
    assert!(!run.exists(), "run directory {} left behind", run.display());
    let left: Vec<String> = netns_list()
        .into_iter()
        .filter(|n| netns.contains(n))
        .collect();
    assert!(left.is_empty(), "network namespaces left: {left:?}");
    let guests: Vec<_> = e2e::sim::guest_processes()
        .into_iter()
        .filter(|(_, id)| ids.contains(id))
        .collect();
    assert!(guests.is_empty(), "guest processes left: {guests:?}");
    if let Some(cg) = cgroup {
        assert!(!cg.exists(), "cgroup {} left behind", cg.display());
    }
}
