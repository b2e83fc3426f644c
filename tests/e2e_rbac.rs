//! The packaged RBAC is all the daemon needs: `packaging/daemonset.yaml` is applied to the
//! testbed, with its node-scope policy in force (N20), and vk-cocoon runs with a token of its
//! ServiceAccount that names its node, instead of the testbed's admin certificate: bound to the
//! host's Node as a systemd install mints it, or to the DaemonSet's pod as the kubelet mounts
//! it. It registers the node, renews the Lease, takes a pod from create to Ready (status and
//! annotations in one `pods/status` patch) and deletes it, with nothing forbidden.

use e2e::daemon;

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{annotation, create_pod, pod_manifest, wait_ready, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams};
use kube::config::Kubeconfig;
use serde_json::json;

const NS: &str = "default";
const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(60);

/// The testbed's kubeconfig with its client certificate swapped for a bearer token.
fn token_kubeconfig(admin: &Path, token: &str, out: &Path) -> Result<()> {
    swap_auth(admin, out, |auth| {
        auth.token = Some(token.to_string().into())
    })
}

/// The same with the token read from a file, as a systemd host's kubeconfig names it (the
/// client reads the file again every minute, so a rotated token needs no restart).
fn token_file_kubeconfig(admin: &Path, token_file: &Path, out: &Path) -> Result<()> {
    swap_auth(admin, out, |auth| {
        auth.token_file = Some(token_file.display().to_string())
    })
}

fn swap_auth(admin: &Path, out: &Path, set: impl Fn(&mut kube::config::AuthInfo)) -> Result<()> {
    let mut kc = Kubeconfig::read_from(admin)?;
    for user in &mut kc.auth_infos {
        let auth = user.auth_info.as_mut().context("user without auth")?;
        auth.client_certificate = None;
        auth.client_certificate_data = None;
        auth.client_key = None;
        auth.client_key_data = None;
        set(auth);
    }
    // JSON is YAML: kubeconfig readers take it as it is.
    std::fs::write(out, serde_json::to_vec_pretty(&kc)?)?;
    Ok(())
}

/// `kubectl create token vk-cocoon` with these extra arguments.
async fn daemon_token(tb: &Testbed, bound: &[&str]) -> Result<String> {
    let mut args = vec![
        "create",
        "token",
        "vk-cocoon",
        "-n",
        "cocoon-system",
        "--duration=1h",
    ];
    args.extend(bound);
    Ok(tb.kubectl(&args).await?.trim().to_string())
}

/// Applies the shipped manifest and returns once its node-scope policy refuses a token that
/// names no node, so the daemon below runs under the policy, not before it is loaded.
async fn apply_daemonset(tb: &Testbed) -> Result<()> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/daemonset.yaml");
    tb.kubectl(&["apply", "-f", &manifest.display().to_string()])
        .await?;
    let kubeconfig = tb.run_dir().join("no-node.kubeconfig");
    token_kubeconfig(tb.kubeconfig()?, &daemon_token(tb, &[]).await?, &kubeconfig)?;
    let nodes: Api<Node> = Api::all(e2e::kube::client(&kubeconfig).await?);
    let probe: Node = serde_json::from_value(json!({"metadata": {"name": "probe"}}))?;
    let dry = kube::api::PostParams {
        dry_run: true,
        ..Default::default()
    };
    daemon::until("the node-scope policy in force", LIMIT, || async {
        Ok(match nodes.create(&dry, &probe).await {
            Err(kube::Error::Api(s)) if s.code == 403 && s.message.contains("names no node") => {
                Some(())
            }
            _ => None,
        })
    })
    .await
}

/// Without a kubelet, the daemon runs under the host's own name, and its token is bound to the
/// Node that `packaging/host-node.yaml` makes for it, as README.md tells a systemd install.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_packaged_rbac_is_enough() -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let admin = tb.client()?;
    e2e::kube::ensure_namespace(&admin, "cocoon-system").await?;
    apply_daemonset(&tb).await?;
    let host_node = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/host-node.yaml"),
    )?
    .replace("name: cocoon-pool", &format!("name: {NODE}"));
    let host_node_file = tb.run_dir().join("host-node.yaml");
    std::fs::write(&host_node_file, host_node)?;
    tb.kubectl(&["apply", "-f", &host_node_file.display().to_string()])
        .await?;
    let token = daemon_token(
        &tb,
        &["--bound-object-kind", "Node", "--bound-object-name", NODE],
    )
    .await?;
    // Without its trailing newline, which no bearer header may carry.
    let token_file = tb.run_dir().join("vk-cocoon.token");
    std::fs::write(&token_file, &token)?;
    let kubeconfig = tb.run_dir().join("vk-cocoon-sa.kubeconfig");
    token_file_kubeconfig(tb.kubeconfig()?, &token_file, &kubeconfig)?;

    let journal = tb.run_dir().join("journal-rbac").join("events.journal");
    let opts = DaemonOptions {
        env: vec![("KUBECONFIG".into(), kubeconfig.display().to_string())],
        ..DaemonOptions::default()
    };
    let kubelet_port = e2e::ports::free_port()?;
    let d = daemon::start(&tb, &opts, &journal, e2e::ports::free_port()?, kubelet_port)?;
    let nodes: Api<Node> = Api::all(admin.clone());
    daemon::until("node registered", LIMIT, || async {
        Ok(nodes.get_opt(NODE).await?.map(|_| ()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;

    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let pod = pod_manifest(
        NS,
        "rbac-a",
        NODE,
        json!({
            "cocoonset.cocoonstack.io/managed": "true",
            "vm.cocoonstack.io/name": "vk-default-rbac-a",
            "cocoonset.cocoonstack.io/mode": "run",
            "cocoonset.cocoonstack.io/image": "ghcr.io/cocoonstack/ubuntu:24.04"
        }),
    )?;
    create_pod(&pods, &pod).await?;
    let ready = wait_ready(&pods, "rbac-a", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(40))?;
    ensure!(
        annotation(&ready, "vm.cocoonstack.io/lifecycle-state").as_deref() == Some("ready"),
        "lifecycle annotation written through pods/status"
    );
    ensure!(annotation(&ready, "vm.cocoonstack.io/id").is_some());
    // The kubelet API asks the apiserver who its callers are and what they may do (K9): the
    // packaged role must allow both reviews, for a certificate and for a token.
    tb.kubectl(&["logs", "rbac-a"])
        .await
        .with_context(|| d.proc.log_tail(40))?;
    let bearer = format!("Authorization: Bearer {}", token.trim());
    let code = daemon::curl_status(
        &format!("https://127.0.0.1:{kubelet_port}/pods"),
        &["-H", &bearer],
    )
    .await?;
    // The daemon's own ServiceAccount holds no nodes/proxy: reviewed, and refused.
    ensure!(code == "403", "the daemon's token on /pods: {code}");

    pods.delete("rbac-a", &DeleteParams::default()).await?;
    daemon::until("pod rbac-a gone", LIMIT, || async {
        Ok(pods.get_opt("rbac-a").await?.is_none().then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    // The daemon's Events pass the node-scope policy as reported by this node.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(admin.clone(), NS);
    daemon::until("an Event the daemon reported", LIMIT, || async {
        let list = events.list(&Default::default()).await?;
        Ok(list
            .items
            .iter()
            .any(|e| e.reporting_instance.as_deref() == Some(NODE))
            .then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;

    let log = std::fs::read_to_string(d.proc.log_path())?;
    ensure!(
        !log.to_lowercase().contains("forbidden"),
        "the daemon was refused something: {}",
        log.lines()
            .filter(|l| l.to_lowercase().contains("forbidden"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
    drop(d);
    daemon::replay_verify(&journal)?;
    Ok(())
}

/// The DaemonSet's container environment as the kubelet would give it on `host`: field
/// references resolved and `$(VAR)` expanded from the variables before it.
fn daemonset_env(
    ds: &k8s_openapi::api::apps::v1::DaemonSet,
    host: &str,
) -> Result<Vec<(String, String)>> {
    let container = ds
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|p| p.containers.first())
        .context("DaemonSet container")?;
    let mut env: Vec<(String, String)> = Vec::new();
    for v in container.env.clone().unwrap_or_default() {
        // The shipped registry is a placeholder for the operator's own; this testbed has none,
        // and the daemon must not reach any address but loopback.
        if v.value_from
            .as_ref()
            .is_some_and(|f| f.config_map_key_ref.is_some())
        {
            continue;
        }
        let value = match (
            &v.value,
            v.value_from.as_ref().and_then(|f| f.field_ref.as_ref()),
        ) {
            (Some(text), _) => env.iter().fold(text.clone(), |t, (k, val)| {
                t.replace(&format!("$({k})"), val)
            }),
            (None, Some(f)) if f.field_path == "spec.nodeName" => host.to_string(),
            (None, Some(f)) if f.field_path == "status.hostIP" => "127.0.0.1".to_string(),
            (None, other) => anyhow::bail!("{}: unexpected source {other:?}", v.name),
        };
        env.push((v.name, value));
    }
    Ok(env)
}

/// A Node without what the node lifecycle controller writes to any node (its `node.kubernetes.io/`
/// taints, and conditions it marks Unknown once the heartbeats stop) and without bookkeeping;
/// of the conditions only those the daemon writes (N8) count. A daemon that took the Node over
/// would change what is left.
fn as_its_kubelet_left_it(n: &Node) -> serde_json::Value {
    let mut n = n.clone();
    n.metadata.resource_version = None;
    n.metadata.managed_fields = None;
    if let Some(spec) = n.spec.as_mut() {
        spec.taints = spec
            .taints
            .take()
            .map(|ts| {
                ts.into_iter()
                    .filter(|t| !t.key.starts_with("node.kubernetes.io/"))
                    .collect::<Vec<_>>()
            })
            .filter(|ts| !ts.is_empty());
    }
    if let Some(status) = n.status.as_mut() {
        status.conditions = status.conditions.take().map(|cs| {
            cs.into_iter()
                .filter(|c| {
                    c.message
                        .as_deref()
                        .is_some_and(|m| m.contains("vk-cocoon"))
                })
                .collect()
        });
    }
    serde_json::to_value(n).unwrap_or_default()
}

/// The shipped DaemonSet on a host that has its own kubelet Node: the daemon, started with the
/// environment the DaemonSet gives it, registers `<host>-cocoon` and leaves the host's Node, its
/// Lease and the pods scheduled to it alone (a terminating pod there is not force-deleted).
/// Started under the host's own name, as an older manifest did, it refuses and exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_daemonset_takes_only_a_node_of_its_own() -> Result<()> {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::coordination::v1::Lease;
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let admin = tb.client()?;
    apply_daemonset(&tb).await?;
    // The host's own Node, as its kubelet keeps it.
    let nodes: Api<Node> = Api::all(admin.clone());
    // Ready with room for a pod, as its kubelet registers it, so the scheduler places the
    // host's pod there once the node lifecycle controller has taken `not-ready` off.
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let host: Node = serde_json::from_value(json!({
        "metadata": {"name": "host-1", "labels": {"cocoonstack.io/host": "true", "kubernetes.io/hostname": "host-1"}},
        "status": {
            "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}]
        }
    }))?;
    let host = nodes.create(&Default::default(), &host).await?;
    // A pod of the host's (no cocoon toleration), terminating behind a finalizer.
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let local: Pod = serde_json::from_value(json!({
        "metadata": {"name": "host-local", "namespace": NS, "finalizers": ["example.com/hold"]},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "host-1"},
            "containers": [{"name": "app", "image": "registry.invalid/app:1"}]
        }
    }))?;
    create_pod(&pods, &local).await?;
    daemon::until("the host's pod scheduled to host-1", LIMIT, || async {
        let p = pods.get("host-local").await?;
        Ok((p.spec.and_then(|s| s.node_name).as_deref() == Some("host-1")).then_some(()))
    })
    .await?;
    pods.delete("host-local", &DeleteParams::default()).await?;

    let ds: DaemonSet = Api::namespaced(admin.clone(), "cocoon-system")
        .get("vk-cocoon")
        .await?;
    let env = daemonset_env(&ds, "host-1")?;
    // The DaemonSet's pod on host-1, as its controller would make it, and the token the
    // kubelet would mount in it: bound to the pod, so it names host-1.
    let template = ds.spec.template.clone();
    let mut ds_pod = Pod {
        metadata: template.metadata.unwrap_or_default(),
        spec: template.spec,
        ..Pod::default()
    };
    ds_pod.metadata.name = Some("vk-cocoon-host-1".into());
    ds_pod.metadata.namespace = Some("cocoon-system".into());
    if let Some(spec) = ds_pod.spec.as_mut() {
        spec.node_name = Some("host-1".into());
    }
    Api::<Pod>::namespaced(admin.clone(), "cocoon-system")
        .create(&Default::default(), &ds_pod)
        .await?;
    let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let name = get("VK_NODE_NAME").context("VK_NODE_NAME")?;
    ensure!(
        name == "host-1-cocoon",
        "the DaemonSet names its node {name:?}"
    );
    ensure!(
        get("VK_KUBELET_PORT").as_deref() != Some("10250"),
        "the DaemonSet serves on the host kubelet's port"
    );
    let token = daemon_token(
        &tb,
        &[
            "--bound-object-kind",
            "Pod",
            "--bound-object-name",
            "vk-cocoon-host-1",
        ],
    )
    .await?;
    let kubeconfig = tb.run_dir().join("vk-cocoon-ds.kubeconfig");
    token_kubeconfig(tb.kubeconfig()?, token.trim(), &kubeconfig)?;
    // Listen addresses stay the test's own (free ports on loopback), and the cluster CA is the
    // testbed's (the host's /etc/kubernetes/pki is not this machine's).
    ensure!(
        get("VK_CLIENT_CA_FILE").is_some(),
        "the DaemonSet names no client CA"
    );
    // The peer API's node credentials are the host kubelet's; here, the testbed's (K7.1).
    ensure!(
        get("VK_PEER_CA_FILE").is_some() && get("VK_PEER_CERT").is_some(),
        "the DaemonSet names no peer credentials"
    );
    let mut opts_env: Vec<(String, String)> = env
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "VK_KUBELET_PORT"
                    | "VK_METRICS_ADDR"
                    | "VK_PEER_ADDR"
                    | "VK_NODE_NAME"
                    | "VK_CLIENT_CA_FILE"
                    | "VK_PEER_CA_FILE"
                    | "VK_PEER_CERT"
            )
        })
        .cloned()
        .collect();
    opts_env.push(("KUBECONFIG".into(), kubeconfig.display().to_string()));
    let opts = DaemonOptions {
        node: name.clone(),
        env: opts_env.clone(),
        ..DaemonOptions::default()
    };
    let journal = tb.run_dir().join("journal-ds").join("events.journal");
    let d = daemon::start(
        &tb,
        &opts,
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    daemon::until("host-1-cocoon Ready", LIMIT, || async {
        let n = nodes.get_opt(&name).await?;
        let ready = n
            .and_then(|n| n.status)
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        Ok(ready.then_some(()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    // The virtual node's Lease comes after its registration and first status round: once it
    // exists, each of those has had its chance to write to the host's Node.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    daemon::until("host-1-cocoon's Lease", LIMIT, || async {
        Ok(leases.get_opt(&name).await?.map(|_| ()))
    })
    .await
    .with_context(|| d.proc.log_tail(40))?;
    let host_now = nodes.get("host-1").await?;
    ensure!(
        as_its_kubelet_left_it(&host) == as_its_kubelet_left_it(&host_now),
        "the host's Node was written to: {host_now:?}"
    );
    ensure!(
        leases.get_opt("host-1").await?.is_none(),
        "a Lease was made for the host's Node"
    );
    ensure!(
        leases.get_opt(&name).await?.is_some(),
        "no Lease for the virtual node"
    );
    // Still there (not force-deleted), and its status as the scheduler left it.
    let local = pods.get("host-local").await?;
    let status = local.status.clone().unwrap_or_default();
    ensure!(
        local.metadata.deletion_timestamp.is_some()
            && status
                .conditions
                .iter()
                .flatten()
                .all(|c| c.type_ == "PodScheduled")
            && status.start_time.is_none()
            && status.container_statuses.is_none(),
        "the host's terminating pod was touched: {status:?}"
    );

    // Under the host's own name it refuses at once.
    let wrong = DaemonOptions {
        node: "host-1".into(),
        env: opts_env,
        ..DaemonOptions::default()
    };
    let journal2 = tb.run_dir().join("journal-ds-wrong").join("events.journal");
    let mut w = daemon::start(
        &tb,
        &wrong,
        &journal2,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    daemon::until("the daemon named after the host exits", LIMIT, || {
        let running = w.proc.running();
        async move { Ok((!running).then_some(())) }
    })
    .await?;
    let log = std::fs::read_to_string(w.proc.log_path())?;
    ensure!(log.contains("Refusing to take it over"), "{log}");
    ensure!(
        as_its_kubelet_left_it(&host) == as_its_kubelet_left_it(&nodes.get("host-1").await?),
        "the refused daemon wrote to the host's Node"
    );

    let release = json!({"metadata": {"finalizers": null}});
    pods.patch(
        "host-local",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&release),
    )
    .await?;
    drop(d);
    Ok(())
}
