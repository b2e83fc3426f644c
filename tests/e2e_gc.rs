//! The cluster's own controllers around a cocoon node: kube-controller-manager gives a new
//! namespace its `default` ServiceAccount, the node lifecycle controller takes the apiserver's
//! `not-ready` taint off the daemon's Ready node, kube-scheduler places a pod that names no node
//! by the pool label and the provider toleration, and when the pod's owner is deleted the
//! garbage collector deletes the pod and the daemon removes its VM.

use e2e::daemon;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{annotation, create_pod, run_pod, until, wait_ready, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

const NS: &str = "gc";
const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(60);

fn taint_keys(n: &Node) -> Vec<String> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|ts| ts.iter().map(|t| t.key.clone()).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_pods_and_the_garbage_collector() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let client = tb.client()?;
    let sim = tb.sim.as_ref().context("sim")?;

    // A namespace created as a user creates it: nothing but the object.
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NS}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    until(
        "the default ServiceAccount in a new namespace",
        LIMIT,
        || async { Ok(sas.get_opt("default").await?.map(|_| ())) },
    )
    .await?;

    let journal = tb.run_dir().join("journal-gc").join("events.journal");
    let d = daemon::start(
        &tb,
        &DaemonOptions::default(),
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    daemon::node_registered(&tb, &d, NODE, LIMIT).await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let node = until("the not-ready taint off the Ready node", LIMIT, || async {
        let n = nodes.get(NODE).await?;
        Ok((!taint_keys(&n)
            .iter()
            .any(|k| k == "node.kubernetes.io/not-ready"))
        .then_some(n))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    ensure!(
        taint_keys(&node) == ["virtual-kubelet.io/provider"],
        "the node keeps only the provider taint: {:?}",
        taint_keys(&node)
    );

    // The owner: any object will do; a ConfigMap is the simplest.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let owner: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "owner"}}))?;
    let owner = cms.create(&PostParams::default(), &owner).await?;
    let mut pod = run_pod(NS, "owned", NODE)?;
    ensure!(
        pod.spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_none(),
        "the manifest names no node"
    );
    pod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "owner".into(),
        uid: owner.metadata.uid.clone().context("owner uid")?,
        ..Default::default()
    }]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    create_pod(&pods, &pod).await?;
    let ready = wait_ready(&pods, "owned", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(40))?;
    let spec = ready.spec.as_ref().context("spec")?;
    ensure!(
        spec.node_name.as_deref() == Some(NODE),
        "placed on {:?}",
        spec.node_name
    );
    ensure!(
        spec.service_account_name.as_deref() == Some("default"),
        "admitted with the namespace's default ServiceAccount: {:?}",
        spec.service_account_name
    );
    let scheduled = ready
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "PodScheduled" && c.status == "True")
        });
    ensure!(scheduled, "PodScheduled, as the scheduler binds");
    let id = annotation(&ready, "vm.cocoonstack.io/id").context("the pod's VM id")?;
    ensure!(sim.vm_ids().contains(&id), "VM {id} runs");

    // Background propagation, the default: the owner goes at once, the collector follows.
    cms.delete("owner", &DeleteParams::default()).await?;
    until(
        "the garbage collector deleted the owned pod",
        LIMIT,
        || async { Ok(pods.get_opt("owned").await?.is_none().then_some(())) },
    )
    .await
    .with_context(|| d.proc.log_tail(40))?;
    until("the daemon removed the pod's VM", LIMIT, || async {
        Ok((!sim.vm_ids().contains(&id)).then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;

    let node = nodes.get(NODE).await?;
    ensure!(
        taint_keys(&node) == ["virtual-kubelet.io/provider"],
        "no taint came back while the node renewed its lease: {:?}",
        taint_keys(&node)
    );
    drop(d);
    daemon::replay_verify(&journal)?;
    Ok(())
}
