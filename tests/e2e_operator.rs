//! The real cocoon-operator with the real daemon on the simulator: CocoonSets and
//! CocoonHibernations go through the operator's reconcilers, the pods they make through the
//! scheduler onto the daemon's node, and each test checks both sides: what the operator says
//! (the set's or hibernation's status, conditions and Events) and what the daemon did (pods,
//! lifecycle annotations, VMs, local snapshots, registry tags). Where the two disagree about
//! the annotation contract the assertion names the rule.

use e2e::daemon;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{annotation, is_ready, until, Daemon, DaemonOptions};
use e2e::operator::{GROUP, PREFIX, VERSION};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use serde_json::{json, Value};
use vk_cocoon::cocoon::CocoonCli;
use vk_cocoon::registry::cocoon_pipe::push_from_cocoon;
use vk_cocoon::registry::{PushKnobs, Registry};

const NS: &str = "default";
const NODE: &str = "node-a";
const NODE_B: &str = "node-b";
const LIMIT: Duration = Duration::from_secs(90);
const IMAGE: &str = "ghcr.io/cocoonstack/ubuntu:24.04";
const OPERATOR: &str = "cocoon-operator";

/// The testbed with the operator, one daemon pointed at the same registry prefix, and clients.
struct Bed {
    // The daemons stop before the testbed they talk to.
    d: Daemon,
    /// The second node's daemon, when there is one.
    others: Vec<Daemon>,
    tb: Testbed,
    sets: Api<DynamicObject>,
    hibs: Api<DynamicObject>,
    pods: Api<Pod>,
    events: Api<Event>,
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GROUP, VERSION, kind), plural)
}

async fn bed() -> Result<Bed> {
    bed_on(false, &[]).await
}

/// With `second`, a second node `node-b` on its own simulator host: the two daemons serve
/// the peer API each on its own loopback address, as e2e_peer's do.
/// `env` goes to every daemon (and so to the simulator it runs).
async fn bed_on(second: bool, env: &[(&str, &str)]) -> Result<Bed> {
    let mut tb = Testbed::start(
        TestbedOptions::control_plane()
            .with_sim()
            .with_registry()
            .with_operator(),
    )
    .await?;
    let oci = tb
        .operator
        .as_ref()
        .context("operator")?
        .oci_registry
        .clone();
    let peer_port = e2e::ports::free_port()?;
    let opts = |node: &str, ip: &str, host: Option<&str>| DaemonOptions {
        node: node.into(),
        env: std::iter::once(("OCI_REGISTRY".to_string(), oci.clone()))
            .chain(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .collect(),
        host: host.map(str::to_string),
        node_ip: second.then(|| ip.to_string()),
        peer_addr: second.then(|| format!("{ip}:{peer_port}")),
        ..DaemonOptions::default()
    };
    let mut nodes = vec![(NODE, "127.0.0.2", None)];
    if second {
        tb.add_host("sim-b")?;
        nodes.push((NODE_B, "127.0.0.3", Some("sim-b")));
    }
    let mut daemons = Vec::new();
    for (node, ip, host) in nodes {
        let journal = tb
            .run_dir()
            .join(format!("journal-{node}"))
            .join("events.journal");
        let d = daemon::start(
            &tb,
            &opts(node, ip, host),
            &journal,
            e2e::ports::free_port()?,
            e2e::ports::free_port()?,
        )?;
        daemon::node_registered(&tb, &d, node, LIMIT).await?;
        daemons.push(d);
    }
    let d = daemons.remove(0);
    let client = tb.client()?;
    Ok(Bed {
        sets: Api::namespaced_with(client.clone(), NS, &resource("CocoonSet", "cocoonsets")),
        hibs: Api::namespaced_with(
            client.clone(),
            NS,
            &resource("CocoonHibernation", "cocoonhibernations"),
        ),
        pods: Api::namespaced(client.clone(), NS),
        events: Api::namespaced(client, NS),
        d,
        others: daemons,
        tb,
    })
}

impl Bed {
    async fn create_set(&self, name: &str, spec: Value) -> Result<()> {
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "kind": "CocoonSet",
            "metadata": {"name": name, "namespace": NS},
            "spec": spec,
        }))?;
        self.sets.create(&PostParams::default(), &obj).await?;
        Ok(())
    }

    async fn patch_set(&self, name: &str, spec: Value) -> Result<()> {
        self.sets
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&json!({ "spec": spec })),
            )
            .await?;
        Ok(())
    }

    /// Waits until the set's whole object satisfies `pred`; the error carries the last status
    /// seen and the tails of the operator's and the daemon's logs.
    async fn set_until(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let last = std::sync::Mutex::new(Value::Null);
        let got = until(&format!("CocoonSet {name}: {what}"), LIMIT, || async {
            let obj = serde_json::to_value(self.sets.get(name).await?)?;
            let ok = pred(&obj);
            *last.lock().unwrap() = obj["status"].clone();
            Ok(ok.then_some(obj))
        })
        .await;
        match got {
            Ok(obj) => Ok(obj),
            Err(e) => {
                let pods = self.pods_summary().await;
                Err(e.context(format!(
                    "{}\n--- pods:\n{pods}",
                    self.context(&last.lock().unwrap())
                )))
            }
        }
    }

    /// Each pod's generation stamp and lifecycle triple, for a failure's context.
    async fn pods_summary(&self) -> String {
        let Ok(list) = self.pods.list(&ListParams::default()).await else {
            return "(pods could not be listed)".into();
        };
        list.items
            .iter()
            .map(|p| {
                let a = |k: &str| annotation(p, k).unwrap_or_else(|| "-".into());
                format!(
                    "{} uid={} generation={} hibernate={} lifecycle={}@{} {:?}",
                    p.metadata.name.as_deref().unwrap_or_default(),
                    p.metadata.uid.as_deref().unwrap_or_default(),
                    a("cocoonset.cocoonstack.io/generation"),
                    a("vm.cocoonstack.io/hibernate"),
                    a("vm.cocoonstack.io/lifecycle-state"),
                    a("vm.cocoonstack.io/lifecycle-observed-generation"),
                    a("vm.cocoonstack.io/lifecycle-state-message"),
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn hib_until(
        &self,
        name: &str,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Value> {
        let last = std::sync::Mutex::new(Value::Null);
        let got = until(
            &format!("CocoonHibernation {name}: {what}"),
            LIMIT,
            || async {
                let obj = serde_json::to_value(self.hibs.get(name).await?)?;
                let ok = pred(&obj);
                *last.lock().unwrap() = obj["status"].clone();
                Ok(ok.then_some(obj))
            },
        )
        .await;
        got.with_context(|| self.context(&last.lock().unwrap()))
    }

    async fn pod_until(&self, name: &str, what: &str, pred: impl Fn(&Pod) -> bool) -> Result<Pod> {
        let got = until(&format!("pod {name}: {what}"), LIMIT, || async {
            Ok(self.pods.get_opt(name).await?.filter(|p| pred(p)))
        })
        .await;
        got.with_context(|| self.context(&Value::Null))
    }

    async fn pod_gone(&self, name: &str) -> Result<()> {
        let got = until(&format!("pod {name} gone"), LIMIT, || async {
            Ok(self.pods.get_opt(name).await?.is_none().then_some(()))
        })
        .await;
        got.with_context(|| self.context(&Value::Null))
    }

    fn context(&self, status: &Value) -> String {
        let operator = self.tb.operator.as_ref().map(|o| o.proc.log_tail(40));
        let mut out = format!(
            "last status: {status}\n--- cocoon-operator:\n{}\n--- vk-cocoon:\n{}",
            operator.unwrap_or_default(),
            self.d.proc.log_tail(40)
        );
        for d in &self.others {
            out += &format!("\n--- vk-cocoon ({NODE_B}):\n{}", d.proc.log_tail(40));
        }
        out
    }

    /// The operator's Events about one object, as (type, reason, message).
    async fn operator_events(&self, object: &str) -> Result<Vec<(String, String, String)>> {
        Ok(self
            .events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(object))
            .filter(|e| {
                e.source.as_ref().and_then(|s| s.component.as_deref()) == Some(OPERATOR)
                    || e.reporting_component.as_deref() == Some(OPERATOR)
            })
            .map(|e| {
                (
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default(),
                )
            })
            .collect())
    }

    async fn operator_event(&self, object: &str, reason: &str) -> Result<(String, String)> {
        let got = until(
            &format!("a {reason} Event from the operator on {object}"),
            LIMIT,
            || async {
                Ok(self
                    .operator_events(object)
                    .await?
                    .into_iter()
                    .find(|(_, r, _)| r == reason)
                    .map(|(t, _, m)| (t, m)))
            },
        )
        .await;
        match got {
            Ok(v) => Ok(v),
            Err(e) => {
                let seen = self.all_events().await.unwrap_or_default();
                Err(e.context(format!(
                    "Events:\n{}\n{}",
                    seen.join("\n"),
                    self.context(&Value::Null)
                )))
            }
        }
    }

    /// Every Event in the namespace, one line each, for a failure's message.
    async fn all_events(&self) -> Result<Vec<String>> {
        Ok(self
            .events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(|e| {
                format!(
                    "{} {} {} {}: {}",
                    e.type_.unwrap_or_default(),
                    e.source.and_then(|s| s.component).unwrap_or_default(),
                    e.involved_object.name.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default()
                )
            })
            .collect())
    }

    /// Warnings about the pods and the operator's objects from any component other than the
    /// scheduler (which reports FailedScheduling while the node registers). The control
    /// plane's own Warnings about itself (its Service CIDR, say) are not the test's business.
    async fn warnings(&self) -> Result<Vec<String>> {
        let ours =
            |kind: Option<&str>| matches!(kind, Some("Pod" | "CocoonSet" | "CocoonHibernation"));
        Ok(self
            .events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.type_.as_deref() == Some("Warning") && !daemon::from_the_scheduler(e))
            .filter(|e| ours(e.involved_object.kind.as_deref()))
            .map(|e| {
                format!(
                    "{}: {} {}",
                    e.involved_object.name.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default()
                )
            })
            .collect())
    }

    fn sim(&self, args: &[&str]) -> Result<Value> {
        let out = self.tb.host(None)?.run(args)?;
        Ok(serde_json::from_str(out.trim()).unwrap_or(json!([])))
    }

    /// Names of the VMs the simulator runs.
    fn vms(&self) -> Result<Vec<String>> {
        let v = self.sim(&["vm", "list", "-o", "json"])?;
        Ok(names(&v, |e| e["config"]["name"].as_str()))
    }

    /// Names of the node-local snapshots.
    fn snapshots(&self) -> Result<Vec<String>> {
        let v = self.sim(&["snapshot", "list", "-o", "json"])?;
        Ok(names(&v, |e| e["name"].as_str()))
    }

    async fn tags(&self, vm: &str) -> Result<Vec<String>> {
        let reg = self.tb.registry.as_ref().context("registry")?;
        let mut t = reg.tags(&format!("{PREFIX}/{vm}")).await?;
        t.sort();
        Ok(t)
    }

    async fn tags_until(&self, vm: &str, want: &[&str]) -> Result<()> {
        let got = until(&format!("tags of {vm} {want:?}"), LIMIT, || async {
            Ok((self.tags(vm).await? == want).then_some(()))
        })
        .await;
        got.with_context(|| self.context(&Value::Null))
    }
}

fn names(v: &Value, f: impl Fn(&Value) -> Option<&str>) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().filter_map(|e| f(e).map(str::to_string)).collect())
        .unwrap_or_default()
}

fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

fn phase_is(obj: &Value, phase: &str) -> bool {
    obj["status"]["phase"] == phase
}

/// The set's status is current (observedGeneration) and says `ready` of `desired` agents.
fn agents_ready(obj: &Value, ready: i64, desired: i64) -> bool {
    obj["status"]["observedGeneration"] == obj["metadata"]["generation"]
        && count(obj, "readyAgents") == ready
        && count(obj, "desiredAgents") == desired
}

/// A status count; the operator's merge patch of its status leaves out a count that is 0.
fn count(obj: &Value, field: &str) -> i64 {
    obj["status"][field].as_i64().unwrap_or(0)
}

fn vm_name(set: &str, slot: usize) -> String {
    format!("vk-{NS}-{set}-{slot}")
}

fn run_agent(replicas: i64) -> Value {
    json!({
        "replicas": replicas,
        "image": IMAGE,
        "mode": "run",
        "resources": {"requests": {"cpu": "500m", "memory": "512Mi"},
                      "limits": {"cpu": "1", "memory": "1Gi"}},
    })
}

/// What the operator reports for each agent matches the pod the daemon brought up.
async fn check_agents(b: &Bed, set: &str, obj: &Value, slots: usize) -> Result<()> {
    let agents = obj["status"]["agents"]
        .as_array()
        .context("status.agents")?;
    ensure!(agents.len() == slots, "status.agents: {agents:?}");
    for (slot, a) in agents.iter().enumerate() {
        let pod_name = format!("{set}-{slot}");
        let pod = b.pods.get(&pod_name).await?;
        ensure!(is_ready(&pod), "{pod_name} not Ready");
        ensure!(
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE),
            "{pod_name} was not scheduled to {NODE}"
        );
        let role = if slot == 0 { "main" } else { "sub-agent" };
        ensure!(
            a["slot"] == slot as i64 && a["role"] == role,
            "agent {slot}: {a}"
        );
        ensure!(a["podName"] == pod_name.as_str(), "agent {slot}: {a}");
        ensure!(
            a["vmName"] == vm_name(set, slot).as_str(),
            "agent {slot}: {a}"
        );
        ensure!(a["phase"] == "Running", "agent {slot}: {a}");
        // ANN-3: the operator's vmID and ip are the daemon's runtime annotations.
        let id = annotation(&pod, "vm.cocoonstack.io/id").context("id annotation")?;
        let ip = annotation(&pod, "vm.cocoonstack.io/ip").context("ip annotation")?;
        ensure!(
            a["vmID"] == id.as_str() && a["ip"] == ip.as_str(),
            "agent {slot}: {a}"
        );
        ensure!(
            annotation(&pod, "vm.cocoonstack.io/lifecycle-state").as_deref() == Some("ready"),
            "{pod_name} lifecycle"
        );
        // ANN-4.2.2: the daemon echoes the generation the operator stamped.
        ensure!(
            annotation(&pod, "vm.cocoonstack.io/lifecycle-observed-generation")
                == annotation(&pod, "cocoonset.cocoonstack.io/generation"),
            "{pod_name}: observed generation is not the stamped one"
        );
        if slot > 0 {
            ensure!(
                a["forkedFrom"] == vm_name(set, 0).as_str(),
                "agent {slot}: {a}"
            );
            ensure!(
                annotation(&pod, "vm.cocoonstack.io/fork-from") == Some(vm_name(set, 0)),
                "{pod_name} fork-from"
            );
        }
    }
    Ok(())
}

async fn running(b: &Bed, set: &str, agents: i64) -> Result<Value> {
    b.set_until(
        set,
        &format!("Running with {agents}/{agents} agents"),
        |o| phase_is(o, "Running") && agents_ready(o, agents, agents),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_mode_set_with_sub_agents_comes_up() -> Result<()> {
    let b = bed().await?;
    b.create_set("web", json!({"agent": run_agent(2)})).await?;
    let obj = running(&b, "web", 3).await?;
    check_agents(&b, "web", &obj, 3).await?;

    let ready = condition(&obj, "Ready").context("Ready condition")?;
    ensure!(
        ready["status"] == "True" && ready["reason"] == "AllAgentsReady",
        "Ready: {ready}"
    );
    ensure!(
        ready["message"] == "3/3 agents ready, 0/0 toolboxes ready",
        "Ready: {ready}"
    );
    let progressing = condition(&obj, "Progressing").context("Progressing condition")?;
    ensure!(
        progressing["status"] == "False" && progressing["reason"] == "Stable",
        "Progressing: {progressing}"
    );
    let finalizers = &obj["metadata"]["finalizers"];
    ensure!(
        finalizers
            .as_array()
            .is_some_and(|f| f.iter().any(|f| f == "cocoonset.cocoonstack.io/finalizer")),
        "finalizers: {finalizers}"
    );
    let vms = b.vms()?;
    for slot in 0..3 {
        ensure!(vms.contains(&vm_name("web", slot)), "VMs: {vms:?}");
    }
    // C9: the sub-agents were cloned from the main VM's fork snapshot.
    ensure!(
        b.snapshots()?
            .contains(&format!("fork-{}", vm_name("web", 0))),
        "no fork snapshot"
    );
    let warnings = b.warnings().await?;
    ensure!(warnings.is_empty(), "Warnings: {warnings:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_down_and_up() -> Result<()> {
    let b = bed().await?;
    b.create_set(
        "pool",
        json!({"snapshotPolicy": "main-only", "agent": run_agent(2)}),
    )
    .await?;
    running(&b, "pool", 3).await?;

    b.patch_set("pool", json!({"agent": {"replicas": 1}}))
        .await?;
    let obj = running(&b, "pool", 2).await?;
    b.pod_gone("pool-2").await?;
    check_agents(&b, "pool", &obj, 2).await?;
    let gone = vm_name("pool", 2);
    ensure!(!b.vms()?.contains(&gone), "{gone} still runs");
    // D4, ANN-2.5: `main-only` pushes nothing for a sub-agent; its pod is gone only after
    // any push, so an empty repository here is the daemon's decision, not a lag.
    ensure!(b.tags(&gone).await?.is_empty(), "{gone} was pushed");

    b.patch_set("pool", json!({"agent": {"replicas": 3}}))
        .await?;
    let obj = running(&b, "pool", 4).await?;
    check_agents(&b, "pool", &obj, 4).await?;
    ensure!(obj["metadata"]["generation"] == 3, "generation: {obj}");
    // The operator's teardown keeps `:latest` where the same policy says the daemon pushed.
    delete_leaves_nothing(&b, "pool", 4, "main-only").await?;
    let warnings = b.warnings().await?;
    ensure!(warnings.is_empty(), "Warnings: {warnings:?}");
    Ok(())
}

/// Returns once the wall clock has left the second of the condition's lastTransitionTime.
async fn past_the_second_of(condition: &Value) -> Result<()> {
    let t: Time = serde_json::from_value(condition["lastTransitionTime"].clone())?;
    past_second(t.0.as_second()).await
}

fn unix_second() -> Result<i64> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    Ok(now.as_secs() as i64)
}

async fn past_second(second: i64) -> Result<()> {
    until("the next second", LIMIT, || async {
        Ok((unix_second()? > second).then_some(()))
    })
    .await
}

async fn create_hibernation(b: &Bed, name: &str, pod: &str, desire: &str) -> Result<()> {
    let obj: DynamicObject = serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "CocoonHibernation",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"podRef": {"name": pod}, "desire": desire},
    }))?;
    b.hibs.create(&PostParams::default(), &obj).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hibernations_hibernate_and_wake_the_main_and_a_sub_agent() -> Result<()> {
    let b = bed().await?;
    b.create_set("sleepy", json!({"agent": run_agent(1)}))
        .await?;
    running(&b, "sleepy", 2).await?;
    let vm = vm_name("sleepy", 0);

    create_hibernation(&b, "nap", "sleepy-0", "Hibernate").await?;
    let hib = b
        .hib_until("nap", "Hibernated", |o| phase_is(o, "Hibernated"))
        .await?;
    ensure!(hib["status"]["vmName"] == vm.as_str(), "status: {hib}");
    let ready = condition(&hib, "Ready").context("Ready condition")?;
    ensure!(
        ready["status"] == "True" && ready["reason"] == "Done",
        "Ready: {ready}"
    );
    let (kind, msg) = b.operator_event("nap", "Hibernated").await?;
    ensure!(
        kind == "Normal" && msg.contains(&vm),
        "Hibernated Event: {kind} {msg}"
    );
    let pod = b.pods.get("sleepy-0").await?;
    ensure!(
        annotation(&pod, "vm.cocoonstack.io/hibernate").as_deref() == Some("true"),
        "hibernate annotation"
    );
    ensure!(
        annotation(&pod, "vm.cocoonstack.io/lifecycle-state").as_deref() == Some("hibernated"),
        "lifecycle"
    );
    ensure!(
        b.tags(&vm).await?.contains(&"hibernate".to_string()),
        "no :hibernate tag"
    );
    ensure!(!b.vms()?.contains(&vm), "{vm} still runs while hibernated");
    // The set counts a hibernated main as not ready; its sub-agent runs on.
    let set = b
        .set_until("sleepy", "1/2 ready while hibernated", |o| {
            agents_ready(o, 1, 2)
        })
        .await?;
    let set_ready = condition(&set, "Ready").context("set Ready")?;
    ensure!(set_ready["status"] == "False", "set Ready: {set_ready}");

    // The operator announces a phase exit once per Ready transition, told apart by
    // lastTransitionTime, which has whole seconds: a wake whose Waking starts in the second
    // the hibernation started in would exit with no WokenActive Event.
    past_the_second_of(ready).await?;
    b.hibs
        .patch(
            "nap",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"desire": "Wake"}})),
        )
        .await?;
    let hib = b
        .hib_until("nap", "Active", |o| phase_is(o, "Active"))
        .await?;
    let ready = condition(&hib, "Ready").context("Ready condition")?;
    ensure!(
        ready["status"] == "True" && ready["reason"] == "Done",
        "Ready: {ready}"
    );
    let (kind, _) = b.operator_event("nap", "WokenActive").await?;
    ensure!(kind == "Normal", "WokenActive Event type {kind}");
    let pod = b
        .pod_until("sleepy-0", "Ready after the wake", is_ready)
        .await?;
    ensure!(
        annotation(&pod, "vm.cocoonstack.io/hibernate").is_none(),
        "hibernate annotation left after the wake"
    );
    ensure!(b.vms()?.contains(&vm), "{vm} not running after the wake");
    // The operator drops the tag once the woken VM runs (hibernation doc §8.1).
    b.tags_until(&vm, &[]).await?;
    running(&b, "sleepy", 2).await?;

    // A sub-agent hibernates into its own tag and wakes under its own name, not as a fork.
    let sub = vm_name("sleepy", 1);
    create_hibernation(&b, "sub-nap", "sleepy-1", "Hibernate").await?;
    let hib = b
        .hib_until("sub-nap", "Hibernated", |o| phase_is(o, "Hibernated"))
        .await?;
    ensure!(b.tags(&sub).await? == ["hibernate"], "{sub} tags");
    ensure!(
        !b.vms()?.contains(&sub),
        "{sub} still runs while hibernated"
    );
    past_the_second_of(condition(&hib, "Ready").context("Ready condition")?).await?;
    b.hibs
        .patch(
            "sub-nap",
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"desire": "Wake"}})),
        )
        .await?;
    b.hib_until("sub-nap", "Active", |o| phase_is(o, "Active"))
        .await?;
    let (kind, _) = b.operator_event("sub-nap", "WokenActive").await?;
    ensure!(kind == "Normal", "WokenActive Event type {kind}");
    b.tags_until(&sub, &[]).await?;
    let obj = running(&b, "sleepy", 2).await?;
    check_agents(&b, "sleepy", &obj, 2).await?;
    b.hibs.delete("sub-nap", &DeleteParams::default()).await?;

    b.hibs.delete("nap", &DeleteParams::default()).await?;
    until("the hibernation gone", LIMIT, || async {
        Ok(b.hibs.get_opt("nap").await?.is_none().then_some(()))
    })
    .await
    .with_context(|| b.context(&Value::Null))?;
    let warnings = b.warnings().await?;
    ensure!(warnings.is_empty(), "Warnings: {warnings:?}");
    Ok(())
}

/// A clone base that exists only in the registry, as `<prefix>/agent-base:v1`: made on the
/// simulator, pushed as the daemon pushes snapshots, then removed from the host.
async fn seed_registry_base(b: &Bed) -> Result<()> {
    let sim = b.tb.sim.as_ref().context("simulator")?;
    let mut env = sim.env();
    env.push((
        e2e::procs::MARKER.to_string(),
        b.tb.run_dir().display().to_string(),
    ));
    let cli = CocoonCli {
        env,
        ..CocoonCli::new(sim.bin.display().to_string())
    };
    sim.run(&["image", "pull", IMAGE])?;
    sim.run(&["vm", "run", "--name", "base-maker", IMAGE])?;
    sim.run(&["snapshot", "save", "--name", "agent-base:v1", "base-maker"])?;
    let spool = b.tb.run_dir().join("test-spool");
    std::fs::create_dir_all(&spool)?;
    let oci = &b.tb.operator.as_ref().context("operator")?.oci_registry;
    let reg = Registry::from_config(oci)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .with_spool_dir(spool);
    push_from_cocoon(
        &reg,
        &cli,
        "agent-base:v1",
        "agent-base",
        "v1",
        Some(IMAGE),
        None,
        &PushKnobs::default(),
    )
    .await
    .map_err(|e| anyhow::anyhow!("seeding the registry: {e}"))?;
    sim.run(&["snapshot", "rm", "agent-base:v1"])?;
    sim.run(&["vm", "rm", "--force", "base-maker"])?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_mode_set_comes_up_from_a_registry_base() -> Result<()> {
    let b = bed().await?;
    seed_registry_base(&b).await?;
    ensure!(
        !b.snapshots()?.iter().any(|s| s == "agent-base:v1"),
        "base still local"
    );

    // No mode: the CRD's default is clone.
    b.create_set(
        "twin",
        json!({"agent": {"replicas": 1, "image": "agent-base:v1"}}),
    )
    .await?;
    let obj = running(&b, "twin", 2).await?;
    check_agents(&b, "twin", &obj, 2).await?;
    let main = b.pods.get("twin-0").await?;
    ensure!(
        annotation(&main, "cocoonset.cocoonstack.io/mode").as_deref() == Some("clone"),
        "mode annotation: {:?}",
        annotation(&main, "cocoonset.cocoonstack.io/mode")
    );
    // C8.3: the daemon pulled the base from the registry under its local name (ANN-2.3).
    ensure!(
        b.snapshots()?.iter().any(|s| s == "agent-base:v1"),
        "snapshots: {:?}",
        b.snapshots()?
    );
    let warnings = b.warnings().await?;
    ensure!(warnings.is_empty(), "Warnings: {warnings:?}");
    Ok(())
}

fn set_annotation(obj: &Value, key: &str) -> Option<String> {
    obj["metadata"]["annotations"][key]
        .as_str()
        .map(str::to_string)
}

/// Deletes the set and checks that nothing of its VMs is left but what the contract keeps:
/// the daemon pushed `:latest` of each VM its snapshot policy names (D4, ANN-2.5) and the
/// operator's teardown dropped every `:hibernate` (hibernation doc §8.5).
async fn delete_leaves_nothing(b: &Bed, set: &str, slots: usize, policy: &str) -> Result<()> {
    b.sets.delete(set, &DeleteParams::default()).await?;
    until(&format!("CocoonSet {set} gone"), LIMIT, || async {
        Ok(b.sets.get_opt(set).await?.is_none().then_some(()))
    })
    .await
    .with_context(|| b.context(&Value::Null))?;
    for slot in 0..slots {
        b.pod_gone(&format!("{set}-{slot}")).await?;
    }
    let vms = b.vms()?;
    let snapshots = b.snapshots()?;
    for slot in 0..slots {
        let vm = vm_name(set, slot);
        ensure!(!vms.contains(&vm), "{vm} still runs: {vms:?}");
        ensure!(
            !snapshots.iter().any(|s| s.contains(&vm)),
            "local snapshots of {vm} left: {snapshots:?}"
        );
        let tags = b.tags(&vm).await?;
        let pushed = policy == "always" || (policy == "main-only" && slot == 0);
        let want: &[&str] = if pushed { &["latest"] } else { &[] };
        ensure!(tags == want, "{vm} tags after the delete: {tags:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_and_unsuspend_retain_then_delete() -> Result<()> {
    let b = bed().await?;
    b.create_set("keep", json!({"agent": run_agent(1)})).await?;
    running(&b, "keep", 2).await?;

    b.patch_set("keep", json!({"suspend": true})).await?;
    let obj = b
        .set_until("keep", "Suspended", |o| phase_is(o, "Suspended"))
        .await?;
    let generation = obj["metadata"]["generation"]
        .as_i64()
        .context("generation")?;
    let ready = condition(&obj, "Ready").context("Ready condition")?;
    ensure!(ready["status"] == "False", "Ready while suspended: {ready}");
    let vms = b.vms()?;
    for slot in 0..2 {
        let vm = vm_name("keep", slot);
        let pod = b.pods.get(&format!("keep-{slot}")).await?;
        ensure!(
            annotation(&pod, "vm.cocoonstack.io/hibernate").as_deref() == Some("true"),
            "keep-{slot} hibernate annotation"
        );
        ensure!(
            annotation(&pod, "vm.cocoonstack.io/lifecycle-state").as_deref() == Some("hibernated"),
            "keep-{slot} lifecycle"
        );
        let observed = annotation(&pod, "vm.cocoonstack.io/lifecycle-observed-generation")
            .and_then(|g| g.parse::<i64>().ok())
            .unwrap_or_default();
        ensure!(
            observed >= generation,
            "keep-{slot} observed {observed} < {generation}"
        );
        ensure!(b.tags(&vm).await? == ["hibernate"], "{vm} tags");
        ensure!(!vms.contains(&vm), "{vm} runs while suspended");
    }

    // ANN-4.2.6: a spec change while suspended raises the generation the operator stamps on
    // the hibernated pods, and the set is Suspended at it only once the daemon has echoed it
    // for pods that have no VM. The new sub-agent waits for the unsuspend.
    b.patch_set("keep", json!({"agent": {"replicas": 2}}))
        .await?;
    let raised = generation + 1;
    b.set_until("keep", "Suspended at the raised generation", |o| {
        o["metadata"]["generation"] == raised
            && o["status"]["observedGeneration"] == raised
            && phase_is(o, "Suspended")
    })
    .await?;
    for slot in 0..2 {
        let pod = b.pods.get(&format!("keep-{slot}")).await?;
        ensure!(
            annotation(&pod, "vm.cocoonstack.io/lifecycle-observed-generation")
                == Some(raised.to_string()),
            "keep-{slot} did not echo generation {raised}"
        );
    }
    ensure!(
        b.pods.get_opt("keep-2").await?.is_none(),
        "a sub-agent made while suspended"
    );

    b.patch_set("keep", json!({"suspend": false})).await?;
    let obj = running(&b, "keep", 3).await?;
    check_agents(&b, "keep", &obj, 3).await?;
    for slot in 0..2 {
        let pod = b.pods.get(&format!("keep-{slot}")).await?;
        ensure!(
            annotation(&pod, "vm.cocoonstack.io/hibernate").is_none(),
            "keep-{slot} hibernate annotation left"
        );
        // Hibernation doc §8.2: a retain-mode unsuspend leaves the tags in place.
        let vm = vm_name("keep", slot);
        ensure!(
            b.tags(&vm).await? == ["hibernate"],
            "{vm} tags after the unsuspend"
        );
    }

    delete_leaves_nothing(&b, "keep", 3, "always").await?;
    let warnings = b.warnings().await?;
    ensure!(warnings.is_empty(), "Warnings: {warnings:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_and_unsuspend_release_then_delete() -> Result<()> {
    let b = bed().await?;
    b.create_set(
        "seat",
        json!({"hibernatePolicy": "release", "agent": run_agent(0)}),
    )
    .await?;
    running(&b, "seat", 1).await?;
    let vm = vm_name("seat", 0);

    b.patch_set("seat", json!({"suspend": true})).await?;
    b.pod_gone("seat-0").await?;
    let obj = b
        .set_until("seat", "Suspended", |o| phase_is(o, "Suspended"))
        .await?;
    ensure!(
        set_annotation(&obj, "cocoonset.cocoonstack.io/hibernated-on-node").as_deref()
            == Some(NODE),
        "hibernated-on-node: {obj}"
    );
    ensure!(
        b.tags(&vm).await? == ["hibernate"],
        "{vm} tags while released"
    );
    ensure!(!b.vms()?.contains(&vm), "{vm} runs while released");
    // ANN-1.3 keep-snapshot-on-delete: the node keeps the local snapshot as warm-wake cache.
    ensure!(
        b.snapshots()?.contains(&vm),
        "no local snapshot {vm} kept: {:?}",
        b.snapshots()?
    );

    b.patch_set("seat", json!({"suspend": false})).await?;
    let obj = running(&b, "seat", 1).await?;
    check_agents(&b, "seat", &obj, 1).await?;
    let pod = b.pods.get("seat-0").await?;
    ensure!(
        annotation(&pod, "vm.cocoonstack.io/restore-from-hibernate").as_deref() == Some("true"),
        "the woken main carries no restore marker"
    );
    // Hibernation doc §8.3: the wake drops the tag and the node hint once the VM is live.
    b.tags_until(&vm, &[]).await?;
    let obj = b
        .set_until("seat", "hint cleared", |o| {
            set_annotation(o, "cocoonset.cocoonstack.io/hibernated-on-node").is_none()
        })
        .await?;
    ensure!(phase_is(&obj, "Running"), "phase after the wake: {obj}");

    delete_leaves_nothing(&b, "seat", 1, "always").await?;
    let warnings = b.warnings().await?;
    ensure!(warnings.is_empty(), "Warnings: {warnings:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_the_daemon_reports_reach_the_operator() -> Result<()> {
    let b = bed().await?;
    let sim = b.tb.host(None)?;
    // Every run fails until the fault is cleared, so the failure holds long enough for the
    // operator to act on it whatever the daemon's retry backoff (P3) is at.
    sim.run(&[
        "sim",
        "fault",
        "fail",
        "vm run",
        "--times",
        "1000",
        "--message",
        "host out of capacity",
    ])?;
    b.create_set("brittle", json!({"agent": run_agent(1)}))
        .await?;
    // ANN-4.4: a `failed` main puts the set in Failed, with the daemon's message in the Event.
    let obj = b
        .set_until("brittle", "Failed", |o| phase_is(o, "Failed"))
        .await?;
    ensure!(count(&obj, "readyAgents") == 0, "status: {obj}");
    let (kind, msg) = b.operator_event("brittle", "PodLifecycleFailed").await?;
    ensure!(
        kind == "Warning" && msg.contains("brittle-0") && msg.contains("host out of capacity"),
        "PodLifecycleFailed Event: {kind} {msg}"
    );
    // The lifecycle itself is not read back here: the daemon retries (P3), so it alternates
    // between `failed` and `creating` until the fault is cleared.
    let main = b.pods.get("brittle-0").await?;

    // The daemon's own retry brings the same pod up once the host recovers.
    sim.run(&["sim", "fault", "clear"])?;
    let recovered = b
        .pod_until("brittle-0", "Ready after the fault", is_ready)
        .await?;
    ensure!(
        recovered.metadata.uid == main.metadata.uid,
        "the main was recreated, not retried"
    );
    // No RecoveredFromFailure Event is asserted: the operator emits it only when one pass
    // sees its Failed phase and a Ready main together, and the daemon's retry writes
    // `creating` first (ANN-4.3), whose reconcile already moves the set out of Failed.
    running(&b, "brittle", 2).await?;

    // ANN-4.4: a `failed` sub-agent is deleted and made again by the operator.
    sim.run(&[
        "sim",
        "fault",
        "fail",
        "vm clone",
        "--times",
        "1000",
        "--message",
        "clone refused",
    ])?;
    b.patch_set("brittle", json!({"agent": {"replicas": 2}}))
        .await?;
    let (kind, msg) = b.operator_event("brittle", "SubAgentRebuilding").await?;
    ensure!(
        kind == "Normal" && msg.starts_with("slot 2 attempt 1/"),
        "SubAgentRebuilding: {msg}"
    );
    sim.run(&["sim", "fault", "clear"])?;
    let obj = running(&b, "brittle", 3).await?;
    check_agents(&b, "brittle", &obj, 3).await?;
    let history = set_annotation(&obj, "cocoonset.cocoonstack.io/rebuild-history")
        .context("no rebuild history")?;
    ensure!(history.contains("\"2\""), "rebuild history: {history}");
    Ok(())
}

/// The simulator's address for VM `id`, once it has one.
async fn sim_ip(b: &Bed, id: &str) -> Result<String> {
    let sim = b.tb.host(None)?;
    until(&format!("an address for {id}"), LIMIT, || async {
        let v: Value = serde_json::from_str(&sim.run(&["sim", "info", id])?)?;
        Ok(v["ip"]
            .as_str()
            .filter(|ip| !ip.is_empty())
            .map(str::to_string))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_and_static_toolboxes() -> Result<()> {
    let b = bed().await?;
    // A static toolbox names a VM that exists before the set (T10: the node checks the claim).
    let sim = b.tb.host(None)?;
    sim.run(&["image", "pull", IMAGE])?;
    let made: Value = serde_json::from_str(
        &sim.run(&["vm", "run", "--output", "json", "--name", "desk", IMAGE])?,
    )?;
    let id = made["id"].as_str().context("desk id")?.to_string();
    let ip = sim_ip(&b, &id).await?;

    b.create_set(
        "kit",
        json!({"agent": run_agent(0), "toolboxes": [
            {"name": "shell", "image": IMAGE},
            {"name": "desk", "mode": "static", "staticVMID": id, "staticIP": ip, "vncPort": 5901},
        ]}),
    )
    .await?;
    let obj = b
        .set_until("kit", "Running with both toolboxes", |o| {
            phase_is(o, "Running")
                && agents_ready(o, 1, 1)
                && count(o, "readyToolboxes") == 2
                && count(o, "desiredToolboxes") == 2
        })
        .await?;
    let ready = condition(&obj, "Ready").context("Ready condition")?;
    ensure!(
        ready["message"] == "1/1 agents ready, 2/2 toolboxes ready",
        "Ready: {ready}"
    );
    let toolboxes = obj["status"]["toolboxes"].as_array().context("toolboxes")?;
    let by_name = |n: &str| toolboxes.iter().find(|t| t["name"] == n).cloned();
    let shell = by_name("shell").context("shell status")?;
    let shell_pod = b.pods.get("kit-shell").await?;
    ensure!(
        shell["vmName"] == "vk-default-kit-shell"
            && shell["connType"] == "ssh"
            && shell["phase"] == "Running"
            && shell["vmID"].as_str() == annotation(&shell_pod, "vm.cocoonstack.io/id").as_deref(),
        "shell: {shell}"
    );
    ensure!(
        b.vms()?.contains(&"vk-default-kit-shell".to_string()),
        "no shell VM"
    );
    let desk = by_name("desk").context("desk status")?;
    ensure!(
        desk["vmID"] == id.as_str()
            && desk["ip"] == ip.as_str()
            && desk["connType"] == "vnc"
            && desk["vncPort"] == 5901
            && desk["phase"] == "Running",
        "desk: {desk}"
    );
    // ANN-0 read-only rule: the daemon never rewrites a static toolbox's vnc-port, id or ip
    // differently, or the operator would see drift and recreate the pod.
    let desk_pod = b.pods.get("kit-desk").await?;
    ensure!(is_ready(&desk_pod), "desk not Ready");
    for (key, want) in [
        ("vm.cocoonstack.io/id", id.as_str()),
        ("vm.cocoonstack.io/ip", ip.as_str()),
        ("vm.cocoonstack.io/vnc-port", "5901"),
    ] {
        ensure!(
            annotation(&desk_pod, key).as_deref() == Some(want),
            "desk {key}"
        );
    }
    ensure!(
        annotation(&desk_pod, "cocoonset.cocoonstack.io/managed").is_none(),
        "a static toolbox is unmanaged"
    );
    running(&b, "kit", 1).await?;
    let again = b.pods.get("kit-desk").await?;
    ensure!(
        again.metadata.uid == desk_pod.metadata.uid,
        "the desk pod was recreated"
    );

    // C5/D1: deleting the set forgets the static toolbox's VM and leaves it running.
    b.sets.delete("kit", &DeleteParams::default()).await?;
    for pod in ["kit-0", "kit-shell", "kit-desk"] {
        b.pod_gone(pod).await?;
    }
    let vms = b.vms()?;
    ensure!(
        vms.contains(&"desk".to_string()),
        "the static VM was removed: {vms:?}"
    );
    ensure!(
        !vms.contains(&"vk-default-kit-shell".to_string()),
        "shell VM left: {vms:?}"
    );
    let warnings = b.warnings().await?;
    ensure!(warnings.is_empty(), "Warnings: {warnings:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_made_again_after_a_retain_unsuspend_boot_fresh() -> Result<()> {
    let b = bed().await?;
    b.create_set("again", json!({"agent": run_agent(1)}))
        .await?;
    running(&b, "again", 2).await?;
    b.patch_set("again", json!({"suspend": true})).await?;
    b.set_until("again", "Suspended", |o| phase_is(o, "Suspended"))
        .await?;
    b.patch_set("again", json!({"suspend": false})).await?;
    running(&b, "again", 2).await?;
    let sub = vm_name("again", 1);
    ensure!(
        b.tags(&sub).await? == ["hibernate"],
        "{sub} tags after the unsuspend"
    );
    // The daemon compares the tag's push time with the pod's creationTimestamp, which has
    // whole seconds: a pod made in the second of the push would count as made before it and
    // the tag as a wake it lost. Every push is done by now; later pods start a second later.
    past_second(unix_second()?).await?;

    // A new sub-agent under the old name: it forks the main (C9) while its predecessor's
    // :hibernate tag is still in the registry.
    b.patch_set("again", json!({"agent": {"replicas": 0}}))
        .await?;
    running(&b, "again", 1).await?;
    b.pod_gone("again-1").await?;
    b.patch_set("again", json!({"agent": {"replicas": 1}}))
        .await?;
    let obj = running(&b, "again", 2).await?;
    check_agents(&b, "again", &obj, 2).await?;

    // A drifted main (new resources) is deleted and made again by the operator, without the
    // restore marker, while its :hibernate tag is also left.
    let old = b.pods.get("again-0").await?.metadata.uid;
    let mut agent = run_agent(1);
    agent["resources"]["limits"]["cpu"] = json!("2");
    b.patch_set("again", json!({ "agent": agent })).await?;
    let main = b
        .pod_until("again-0", "made again and Ready", |p| {
            p.metadata.uid != old && is_ready(p)
        })
        .await?;
    ensure!(
        annotation(&main, "vm.cocoonstack.io/restore-from-hibernate").is_none(),
        "the operator marked a drift rebuild for restore"
    );
    let obj = running(&b, "again", 2).await?;
    check_agents(&b, "again", &obj, 2).await?;
    // C11.1: each new pod found its predecessor's tag, older than itself, and booted fresh,
    // saying so; nothing else went wrong.
    let warnings = b.warnings().await?;
    for pod in ["again-0", "again-1"] {
        ensure!(
            warnings
                .iter()
                .any(|w| w.starts_with(&format!("{pod}: HibernateSnapshotPredatesPod"))),
            "no HibernateSnapshotPredatesPod for {pod}: {warnings:?}"
        );
    }
    ensure!(
        warnings
            .iter()
            .all(|w| w.contains("HibernateSnapshotPredatesPod")),
        "Warnings: {warnings:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_agent_migrates_to_another_node() -> Result<()> {
    let b = bed_on(true, &[]).await?;
    b.create_set("mover", json!({"nodeName": NODE, "agent": run_agent(0)}))
        .await?;
    running(&b, "mover", 1).await?;
    let vm = vm_name("mover", 0);
    let before = b.pods.get("mover-0").await?;
    ensure!(
        before.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE),
        "not on {NODE}"
    );

    // Hibernation doc §8.4: quiesce on node-a, push :hibernate, delete, restore on node-b.
    b.patch_set("mover", json!({ "nodeName": NODE_B })).await?;
    b.set_until("mover", "Migrating", |o| phase_is(o, "Migrating"))
        .await?;
    let moved = b
        .pod_until("mover-0", "Ready on node-b", |p| {
            p.metadata.uid != before.metadata.uid
                && is_ready(p)
                && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE_B)
        })
        .await?;
    ensure!(
        annotation(&moved, "vm.cocoonstack.io/restore-from-hibernate").as_deref() == Some("true"),
        "the new main carries no restore marker"
    );
    let obj = running(&b, "mover", 1).await?;
    let agent = &obj["status"]["agents"][0];
    ensure!(
        agent["vmID"].as_str() == annotation(&moved, "vm.cocoonstack.io/id").as_deref(),
        "status: {agent}"
    );
    // The operator drops the tag once the restored VM runs.
    b.tags_until(&vm, &[]).await?;
    ensure!(!b.vms()?.contains(&vm), "{vm} still runs on node-a");
    let on_b =
        b.tb.host(Some("sim-b"))?
            .run(&["vm", "list", "-o", "json"])?;
    ensure!(on_b.contains(&vm), "{vm} does not run on node-b: {on_b}");
    let warnings = b.warnings().await?;
    ensure!(warnings.is_empty(), "Warnings: {warnings:?}");
    Ok(())
}

/// The operator makes a deleted pod of a hibernated agent again with the restore marker, and
/// its hibernation reconciler puts `hibernate=true` back on it a moment later. Whichever the
/// daemon sees first, the pod settles `hibernated` (B6: taken in hibernated, it shows that
/// state at once; U2: a restore already under way is hibernated again once its VM is up), so
/// the hibernation reports Hibernated again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hibernated_agent_whose_pod_is_made_again_stays_hibernated() -> Result<()> {
    let b = bed().await?;
    b.create_set("again", json!({"agent": run_agent(0)}))
        .await?;
    running(&b, "again", 1).await?;
    let vm = vm_name("again", 0);
    create_hibernation(&b, "nap", "again-0", "Hibernate").await?;
    b.hib_until("nap", "Hibernated", |o| phase_is(o, "Hibernated"))
        .await?;
    let old = b.pods.get("again-0").await?.metadata.uid;
    b.pods.delete("again-0", &DeleteParams::default()).await?;
    let pod = b
        .pod_until("again-0", "made again", |p| p.metadata.uid != old)
        .await?;
    ensure!(
        annotation(&pod, "vm.cocoonstack.io/restore-from-hibernate").as_deref() == Some("true"),
        "the operator made the pod again without the restore marker"
    );
    b.pod_until("again-0", "lifecycle hibernated", |p| {
        annotation(p, "vm.cocoonstack.io/lifecycle-state").as_deref() == Some("hibernated")
            && annotation(p, "vm.cocoonstack.io/hibernate").as_deref() == Some("true")
    })
    .await?;
    b.hib_until("nap", "Hibernated again", |o| phase_is(o, "Hibernated"))
        .await?;
    ensure!(
        !b.vms()?.contains(&vm),
        "{vm} runs while its agent is hibernated"
    );
    Ok(())
}
