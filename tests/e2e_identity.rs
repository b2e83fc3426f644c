//! Each host acts as itself (N20) and only the operator writes the annotations a VM is made
//! from (T9), against the real apiserver with the packaged policies applied
//! (`packaging/daemonset.yaml`, `packaging/annotation-policy.yaml`). Host A's ServiceAccount
//! token, bound to its Node as a systemd host's is, writes its own virtual node, Lease and pods
//! and nothing of host B's, nor a leader-election Lease; the token of the DaemonSet's pod on A
//! leaves A's kubelet its Lease and pods; a token naming no node writes nothing.
//! A tenant with pod rights in its namespace can neither create a pod carrying a stateful
//! annotation nor add or change one, while the operator's ServiceAccount can; the daemon's
//! runtime annotations still go through.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use e2e::daemon;
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use kube::Client;
use serde_json::{json, Value};

const TEAM: &str = "team-a";
const LIMIT: Duration = Duration::from_secs(30);
/// What the node-scope policy says to a token that names no node.
const NO_NODE: &str = "this token names no node";
/// What the annotation policy says, naming the key it refused.
const STATEFUL: &str = "decides which VM the pod runs and what it is made from";

/// The testbed's kubeconfig with its client certificate swapped for a bearer token.
async fn token_client(tb: &Testbed, name: &str, token: &str) -> Result<Client> {
    let mut kc = Kubeconfig::read_from(tb.kubeconfig()?)?;
    for user in &mut kc.auth_infos {
        let auth = user.auth_info.as_mut().context("user without auth")?;
        auth.client_certificate = None;
        auth.client_certificate_data = None;
        auth.client_key = None;
        auth.client_key_data = None;
        auth.token = Some(token.trim().to_string().into());
    }
    let out = tb.run_dir().join(format!("{name}.kubeconfig"));
    // JSON is YAML: kubeconfig readers take it as it is.
    std::fs::write(&out, serde_json::to_vec_pretty(&kc)?)?;
    e2e::kube::client(&out).await
}

/// A token of `account` in `ns`, bound to the object `(kind, name)` when one is named.
async fn token(
    tb: &Testbed,
    ns: &str,
    account: &str,
    bound: Option<(&str, &str)>,
) -> Result<String> {
    let mut args = vec!["create", "token", account, "-n", ns, "--duration=1h"];
    if let Some((kind, name)) = bound {
        args.extend(["--bound-object-kind", kind, "--bound-object-name", name]);
    }
    tb.kubectl(&args).await
}

/// The request was refused by admission or RBAC (403) with a message containing `says`.
fn refused<T: std::fmt::Debug>(
    r: std::result::Result<T, kube::Error>,
    what: &str,
    says: &str,
) -> Result<()> {
    match r {
        Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains(says) => Ok(()),
        other => bail!("{what}: expected a 403 saying {says:?}, got {other:?}"),
    }
}

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

fn node(name: &str, is_virtual: bool) -> Result<Node> {
    let mut labels = json!({"kubernetes.io/hostname": name});
    if is_virtual {
        labels["type"] = json!("virtual-kubelet");
    }
    Ok(serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}}),
    )?)
}

fn lease(ns: &str, name: &str) -> Result<Lease> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40}
    }))?)
}

fn pod(name: &str, node: Option<&str>, annotations: Value) -> Result<Pod> {
    let mut spec = json!({"containers": [{"name": "agent", "image": "ghcr.io/cocoonstack/placeholder:latest"}]});
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": TEAM, "annotations": annotations},
        "spec": spec
    }))?)
}

/// An Event as vk-cocoon reports it, from the node `node`.
fn event(name: &str, node: &str) -> Result<Event> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": TEAM},
        "involvedObject": {"kind": "Pod", "namespace": TEAM, "name": "pa"},
        "reason": "Probe", "message": "a host's event", "type": "Normal",
        "source": {"component": "vk-cocoon", "host": node},
        "reportingComponent": "vk-cocoon", "reportingInstance": node
    }))?)
}

fn merge(v: Value) -> Patch<Value> {
    Patch::Merge(v)
}

/// The operator's pods carry the whole VMSpec, as cocoon-operator writes it.
fn vm_spec(vm: &str) -> Value {
    json!({
        "cocoonset.cocoonstack.io/managed": "true",
        "vm.cocoonstack.io/name": vm,
        "cocoonset.cocoonstack.io/mode": "clone",
        "cocoonset.cocoonstack.io/image": "acme/agent:v1",
        "cocoonset.cocoonstack.io/snapshot-policy": "always",
        "vm.cocoonstack.io/fork-from": "vk-team-a-set-0"
    })
}

/// The test's own identities: the operator's ServiceAccount and a tenant's, each allowed to
/// write pods in the team namespace (the tenant no more than that).
const IDENTITIES: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: cocoon-operator, namespace: cocoon-system}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: tenant, namespace: team-a}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: pod-writer}
rules:
  - apiGroups: [""]
    resources: [pods]
    verbs: [get, list, create, update, patch, delete]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: pod-writers, namespace: team-a}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-writer}
subjects:
  - {kind: ServiceAccount, name: tenant, namespace: team-a}
  - {kind: ServiceAccount, name: cocoon-operator, namespace: cocoon-system}
"#;

struct Who {
    admin: Client,
    host_a: Client,
    host_b: Client,
    nobody: Client,
    operator: Client,
    tenant: Client,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_host_acts_as_itself_and_only_the_operator_writes_stateful_annotations() -> Result<()>
{
    let tb = Testbed::start(TestbedOptions::control_plane().apiserver_only()).await?;
    let admin = tb.client()?;
    tb.ensure_namespace("cocoon-system").await?;
    tb.ensure_namespace(TEAM).await?;
    let top = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging");
    for file in ["daemonset.yaml", "annotation-policy.yaml"] {
        tb.kubectl(&["apply", "-f", &top.join(file).display().to_string()])
            .await?;
    }
    let identities = tb.run_dir().join("identities.yaml");
    std::fs::write(&identities, IDENTITIES)?;
    tb.kubectl(&["apply", "-f", &identities.display().to_string()])
        .await?;
    // Two hosts, each with its own kubelet's Node (no virtual-kubelet label).
    let nodes: Api<Node> = Api::all(admin.clone());
    for host in ["host-a", "host-b"] {
        nodes
            .create(&PostParams::default(), &node(host, false)?)
            .await?;
    }
    let who = Who {
        host_a: token_client(
            &tb,
            "host-a",
            &token(&tb, "cocoon-system", "vk-cocoon", Some(("Node", "host-a"))).await?,
        )
        .await?,
        host_b: token_client(
            &tb,
            "host-b",
            &token(&tb, "cocoon-system", "vk-cocoon", Some(("Node", "host-b"))).await?,
        )
        .await?,
        nobody: token_client(
            &tb,
            "nobody",
            &token(&tb, "cocoon-system", "vk-cocoon", None).await?,
        )
        .await?,
        operator: token_client(
            &tb,
            "operator",
            &token(&tb, "cocoon-system", "cocoon-operator", None).await?,
        )
        .await?,
        tenant: token_client(&tb, "tenant", &token(&tb, TEAM, "tenant", None).await?).await?,
        admin,
    };
    // The policies take effect once the apiserver has loaded them: probe with dry runs.
    let probe_nodes: Api<Node> = Api::all(who.nobody.clone());
    daemon::until("the node-scope policy in force", LIMIT, || async {
        let r = probe_nodes
            .create(&dry_run(), &node("x-cocoon", true)?)
            .await;
        Ok(refused(r, "probe", NO_NODE).ok())
    })
    .await?;
    let probe_pods: Api<Pod> = Api::namespaced(who.tenant.clone(), TEAM);
    daemon::until("the annotation policy in force", LIMIT, || async {
        let p = pod("probe", None, json!({"vm.cocoonstack.io/name": "vk-x"}))?;
        Ok(refused(probe_pods.create(&dry_run(), &p).await, "probe", STATEFUL).ok())
    })
    .await?;

    nodes_and_leases(&who).await?;
    a_daemonset_pod_is_not_its_kubelet(&tb, &who).await?;
    pods_of_each_host(&who).await?;
    tenants_and_the_operator(&who).await?;
    Ok(())
}

/// N20 for Nodes, Leases and Events.
async fn nodes_and_leases(who: &Who) -> Result<()> {
    let a_nodes: Api<Node> = Api::all(who.host_a.clone());
    let b_nodes: Api<Node> = Api::all(who.host_b.clone());
    let pp = PostParams::default();
    a_nodes.create(&pp, &node("host-a-cocoon", true)?).await?;
    b_nodes.create(&pp, &node("host-b-cocoon", true)?).await?;
    let label = merge(json!({"metadata": {"labels": {"cocoonstack.io/pool": "default"}}}));
    let status = merge(json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}));
    let ppatch = PatchParams::default();
    a_nodes.patch("host-a-cocoon", &ppatch, &label).await?;
    a_nodes
        .patch_status("host-a-cocoon", &ppatch, &status)
        .await?;
    let mine = "may write only its own virtual Node";
    refused(
        a_nodes.patch("host-b-cocoon", &ppatch, &label).await,
        "A patches B's node",
        mine,
    )?;
    refused(
        a_nodes
            .patch_status("host-b-cocoon", &ppatch, &status)
            .await,
        "A patches B's node status",
        mine,
    )?;
    refused(
        a_nodes.create(&pp, &node("host-c-cocoon", true)?).await,
        "A makes another node",
        mine,
    )?;
    // Its own host's kubelet Node, and its own virtual node made to look like one, are not its.
    refused(
        a_nodes.patch("host-a", &ppatch, &label).await,
        "A patches its kubelet's node",
        mine,
    )?;
    let unlabel = merge(json!({"metadata": {"labels": {"type": null}}}));
    refused(
        a_nodes.patch("host-a-cocoon", &ppatch, &unlabel).await,
        "A strips its node's virtual-kubelet label",
        mine,
    )?;
    // Isolation labels are the administrator's: set by the admin, kept by the host's writes.
    let isolation = "node-restriction.kubernetes.io/tenant";
    let claim = merge(json!({"metadata": {"labels": {isolation: "team-a"}}}));
    let restricted = "may not set, change or remove node-restriction.kubernetes.io/ labels";
    refused(
        a_nodes.patch("host-a-cocoon", &ppatch, &claim).await,
        "A labels itself into a tenant's placement",
        restricted,
    )?;
    Api::<Node>::all(who.admin.clone())
        .patch("host-a-cocoon", &ppatch, &claim)
        .await?;
    a_nodes.patch("host-a-cocoon", &ppatch, &label).await?;
    a_nodes
        .patch_status("host-a-cocoon", &ppatch, &status)
        .await?;
    let drop = merge(json!({"metadata": {"labels": {isolation: null}}}));
    refused(
        a_nodes.patch("host-a-cocoon", &ppatch, &drop).await,
        "A drops an isolation label",
        restricted,
    )?;
    let nobody: Api<Node> = Api::all(who.nobody.clone());
    refused(
        nobody.patch("host-a-cocoon", &ppatch, &label).await,
        "a token with no node",
        NO_NODE,
    )?;

    let a_leases: Api<Lease> = Api::namespaced(who.host_a.clone(), "kube-node-lease");
    let b_leases: Api<Lease> = Api::namespaced(who.host_b.clone(), "kube-node-lease");
    let own = a_leases
        .create(&pp, &lease("kube-node-lease", "host-a-cocoon")?)
        .await?;
    a_leases.replace("host-a-cocoon", &pp, &own).await?;
    let theirs = b_leases
        .create(&pp, &lease("kube-node-lease", "host-b-cocoon")?)
        .await?;
    let lease_msg = "may write only the Lease kube-node-lease/host-a-cocoon";
    refused(
        a_leases.replace("host-b-cocoon", &pp, &theirs).await,
        "A renews B's Lease",
        lease_msg,
    )?;
    refused(
        a_leases
            .create(&pp, &lease("kube-node-lease", "host-b")?)
            .await,
        "A makes B's host Lease",
        lease_msg,
    )?;
    refused(
        Api::<Lease>::namespaced(who.nobody.clone(), "kube-node-lease")
            .create(&pp, &lease("kube-node-lease", "x-cocoon")?)
            .await,
        "a token with no node makes a Lease",
        NO_NODE,
    )?;
    // The leader elections are out of RBAC's reach: no role in kube-system at all.
    let system: Api<Lease> = Api::namespaced(who.admin.clone(), "kube-system");
    for name in ["kube-scheduler", "kube-controller-manager"] {
        let held = system.create(&pp, &lease("kube-system", name)?).await?;
        let a_system: Api<Lease> = Api::namespaced(who.host_a.clone(), "kube-system");
        refused(
            a_system.replace(name, &pp, &held).await,
            "A takes a leader-election Lease",
            "cannot update resource \"leases\"",
        )?;
    }

    let a_events: Api<Event> = Api::namespaced(who.host_a.clone(), TEAM);
    a_events
        .create(&pp, &event("from-a", "host-a-cocoon")?)
        .await?;
    refused(
        a_events.create(&pp, &event("as-b", "host-b-cocoon")?).await,
        "A reports as B",
        "may report Events only as host-a-cocoon or host-a, not as host-b-cocoon",
    )?;
    let nobody_events: Api<Event> = Api::namespaced(who.nobody.clone(), TEAM);
    refused(
        nobody_events
            .create(&pp, &event("from-nobody", "x-cocoon")?)
            .await,
        "an event with no node",
        NO_NODE,
    )?;
    Ok(())
}

/// N20 with the token the kubelet mounts in the DaemonSet's pod on host-a: the host's own
/// name, its kubelet's, is not the daemon's, only `host-a-cocoon` is.
async fn a_daemonset_pod_is_not_its_kubelet(tb: &Testbed, who: &Who) -> Result<()> {
    let pp = PostParams::default();
    let ds_pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "vk-cocoon-host-a", "namespace": "cocoon-system"},
        "spec": {"serviceAccountName": "vk-cocoon", "nodeName": "host-a",
                 "containers": [{"name": "vk-cocoon", "image": "localhost/vk-cocoon:0.1.0"}]}
    }))?;
    Api::<Pod>::namespaced(who.admin.clone(), "cocoon-system")
        .create(&pp, &ds_pod)
        .await?;
    let bound = Some(("Pod", "vk-cocoon-host-a"));
    let ds = token_client(
        tb,
        "ds-host-a",
        &token(tb, "cocoon-system", "vk-cocoon", bound).await?,
    )
    .await?;
    let kubelet_lease = Api::<Lease>::namespaced(who.admin.clone(), "kube-node-lease")
        .create(&pp, &lease("kube-node-lease", "host-a")?)
        .await?;
    let leases: Api<Lease> = Api::namespaced(ds.clone(), "kube-node-lease");
    refused(
        leases.replace("host-a", &pp, &kubelet_lease).await,
        "the DaemonSet pod renews its kubelet's Lease",
        "may write only the Lease kube-node-lease/host-a-cocoon, not kube-node-lease/host-a",
    )?;
    let own = leases.get("host-a-cocoon").await?;
    leases.replace("host-a-cocoon", &pp, &own).await?;
    Api::<Pod>::namespaced(who.admin.clone(), TEAM)
        .create(&pp, &pod("kubelets", Some("host-a"), json!({}))?)
        .await?;
    refused(
        Api::<Pod>::namespaced(ds, TEAM)
            .delete("kubelets", &DeleteParams::default())
            .await,
        "the DaemonSet pod deletes its kubelet's pod",
        "may write only pods bound to host-a-cocoon, not pod team-a/kubelets",
    )?;
    Ok(())
}

/// N20 for pods, with T9 letting the daemon's runtime annotations through.
async fn pods_of_each_host(who: &Who) -> Result<()> {
    let op: Api<Pod> = Api::namespaced(who.operator.clone(), TEAM);
    let pp = PostParams::default();
    op.create(
        &pp,
        &pod("pa", Some("host-a-cocoon"), vm_spec("vk-team-a-pa"))?,
    )
    .await?;
    op.create(
        &pp,
        &pod("pb", Some("host-b-cocoon"), vm_spec("vk-team-a-pb"))?,
    )
    .await?;
    let a_pods: Api<Pod> = Api::namespaced(who.host_a.clone(), TEAM);
    let ppatch = PatchParams::default();
    let runtime = merge(json!({
        "metadata": {"annotations": {
            "vm.cocoonstack.io/id": "vm-1", "vm.cocoonstack.io/ip": "10.0.0.2",
            "vm.cocoonstack.io/lifecycle-state": "ready",
            "vm.cocoonstack.io/lifecycle-observed-generation": "0"
        }},
        "status": {"phase": "Running", "podIP": "10.0.0.2"}
    }));
    let done = a_pods.patch_status("pa", &ppatch, &runtime).await?;
    ensure!(
        daemon::annotation(&done, "vm.cocoonstack.io/id").as_deref() == Some("vm-1"),
        "the runtime annotations were not written: {:?}",
        done.metadata.annotations
    );
    // Not even its own pod's VMSpec is the daemon's to change.
    let spec_change = merge(
        json!({"metadata": {"annotations": {"cocoonset.cocoonstack.io/image": "acme/other:v1"}}}),
    );
    refused(
        a_pods.patch_status("pa", &ppatch, &spec_change).await,
        "A rewrites its pod's image",
        &format!("cocoonset.cocoonstack.io/image {STATEFUL}"),
    )?;
    // An unmanaged pod's id and ip name the VM it brings: vk may write them again as they
    // are, a tenant or vk may not change them.
    let static_vm = json!({
        "vm.cocoonstack.io/name": "vk-team-a-static", "cocoonset.cocoonstack.io/mode": "static",
        "vm.cocoonstack.io/id": "static-1", "vm.cocoonstack.io/ip": "10.0.0.9"
    });
    op.create(&pp, &pod("static", Some("host-a-cocoon"), static_vm)?)
        .await?;
    let same = merge(json!({"metadata": {"annotations": {
        "vm.cocoonstack.io/id": "static-1", "vm.cocoonstack.io/ip": "10.0.0.9",
        "vm.cocoonstack.io/lifecycle-state": "ready"
    }}}));
    a_pods.patch_status("static", &ppatch, &same).await?;
    let moved = merge(json!({"metadata": {"annotations": {"vm.cocoonstack.io/ip": "10.0.0.2"}}}));
    refused(
        a_pods.patch_status("static", &ppatch, &moved).await,
        "A moves an unmanaged pod's ip",
        &format!("vm.cocoonstack.io/ip {STATEFUL}"),
    )?;
    refused(
        Api::<Pod>::namespaced(who.tenant.clone(), TEAM)
            .patch("static", &ppatch, &moved)
            .await,
        "a tenant moves an unmanaged pod's ip",
        &format!("vm.cocoonstack.io/ip {STATEFUL}"),
    )?;
    let theirs = "may write only pods bound to host-a-cocoon or host-a, not pod team-a/pb";
    refused(
        a_pods.patch_status("pb", &ppatch, &runtime).await,
        "A writes B's pod status",
        theirs,
    )?;
    refused(
        a_pods.delete("pb", &DeleteParams::default()).await,
        "A deletes B's pod",
        theirs,
    )?;
    let nobody: Api<Pod> = Api::namespaced(who.nobody.clone(), TEAM);
    refused(
        nobody.delete("pa", &DeleteParams::default()).await,
        "a token with no node deletes",
        NO_NODE,
    )?;
    a_pods
        .delete("pa", &DeleteParams::background().grace_period(0))
        .await?;
    Ok(())
}

/// T9: a tenant against the operator.
async fn tenants_and_the_operator(who: &Who) -> Result<()> {
    let tenant: Api<Pod> = Api::namespaced(who.tenant.clone(), TEAM);
    let op: Api<Pod> = Api::namespaced(who.operator.clone(), TEAM);
    let pp = PostParams::default();
    let ppatch = PatchParams::default();
    let keys = [
        "vm.cocoonstack.io/name",
        "cocoonset.cocoonstack.io/mode",
        "cocoonset.cocoonstack.io/image",
        "cocoonset.cocoonstack.io/managed",
        "cocoonset.cocoonstack.io/snapshot-policy",
        "cocoonset.cocoonstack.io/network",
        "vm.cocoonstack.io/fork-from",
        "vm.cocoonstack.io/clone-from-dir",
        "vm.cocoonstack.io/restore-from-hibernate",
    ];
    for key in keys {
        let p = pod("t-create", Some("host-a-cocoon"), json!({key: "x"}))?;
        refused(
            tenant.create(&pp, &p).await,
            &format!("a tenant creates a pod with {key}"),
            &format!("{key} {STATEFUL}"),
        )?;
    }
    // A pod of its own with other annotations is the tenant's to make and change.
    let plain = json!({"vm.cocoonstack.io/hibernate": "true", "example.com/team": "a"});
    tenant
        .create(&pp, &pod("t-plain", Some("host-a-cocoon"), plain)?)
        .await?;
    tenant
        .patch(
            "t-plain",
            &ppatch,
            &merge(json!({"metadata": {"annotations": {"example.com/team": "b"}}})),
        )
        .await?;
    refused(
        tenant
            .patch("t-plain", &ppatch, &merge(json!({"metadata": {"annotations": {"cocoonset.cocoonstack.io/image": "acme/agent:v1"}}})))
            .await,
        "a tenant adds an image to its pod",
        "cocoonset.cocoonstack.io/image",
    )?;
    // Through a full update as well as a patch.
    let mut whole = tenant.get("t-plain").await?;
    whole
        .metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert("vm.cocoonstack.io/name".into(), "vk-team-a-pb".into());
    refused(
        tenant.replace("t-plain", &pp, &whole).await,
        "a tenant names a VM by update",
        STATEFUL,
    )?;

    // The operator's pod: the tenant may hibernate it, not remake it.
    refused(
        tenant
            .patch(
                "pb",
                &ppatch,
                &merge(
                    json!({"metadata": {"annotations": {"cocoonset.cocoonstack.io/mode": "run"}}}),
                ),
            )
            .await,
        "a tenant changes the operator's mode",
        "cocoonset.cocoonstack.io/mode",
    )?;
    refused(
        tenant
            .patch(
                "pb",
                &ppatch,
                &merge(json!({"metadata": {"annotations": {"vm.cocoonstack.io/fork-from": null}}})),
            )
            .await,
        "a tenant removes fork-from",
        "vm.cocoonstack.io/fork-from",
    )?;
    tenant
        .patch(
            "pb",
            &ppatch,
            &merge(json!({"metadata": {"annotations": {"vm.cocoonstack.io/hibernate": "true"}}})),
        )
        .await?;
    let changed = op
        .patch("pb", &ppatch, &merge(json!({"metadata": {"annotations": {"cocoonset.cocoonstack.io/image": "acme/agent:v2"}}})))
        .await?;
    ensure!(
        daemon::annotation(&changed, "cocoonset.cocoonstack.io/image").as_deref()
            == Some("acme/agent:v2"),
        "the operator's change did not land"
    );
    op.create(&pp, &pod("op-new", None, vm_spec("vk-team-a-op-new"))?)
        .await?;
    // A binding's annotations are copied onto the pod: a scheduler's (none) passes, one
    // carrying a stateful key does not, whoever sends it.
    let admin: Api<Pod> = Api::namespaced(who.admin.clone(), TEAM);
    admin.create(&pp, &pod("unbound", None, json!({}))?).await?;
    let binding = |annotations: Value| {
        json!({
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": "unbound", "namespace": TEAM, "annotations": annotations},
            "target": {"apiVersion": "v1", "kind": "Node", "name": "host-a-cocoon"}
        })
    };
    let named = binding(json!({"vm.cocoonstack.io/name": "vk-team-a-pb"}));
    refused(
        admin
            .create_subresource::<_, Value>("binding", "unbound", &pp, &named)
            .await,
        "a binding names a VM",
        &format!("vm.cocoonstack.io/name {STATEFUL}"),
    )?;
    admin
        .create_subresource::<_, Value>("binding", "unbound", &pp, &binding(json!({})))
        .await?;
    Ok(())
}
