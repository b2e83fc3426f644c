//! Which client made which requests: one FlowSchema per kind of request a client makes, plus
//! one for the rest, each counted by the apiserver in
//! `apiserver_flowcontrol_dispatched_requests_total`.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context, Result};
use k8s_openapi::api::flowcontrol::v1::FlowSchema;
use kube::api::{Api, PostParams};
use kube::Client;
use serde_json::json;

use super::Metrics;

/// One kind of request a client makes, as a FlowSchema resource rule matches it.
#[derive(Clone, Copy, Debug)]
pub struct Kind {
    /// How reports name it, e.g. `patch pods/status`.
    pub name: &'static str,
    pub verbs: &'static [&'static str],
    pub groups: &'static [&'static str],
    pub resources: &'static [&'static str],
    /// Whether it changes something (counts against the write budget).
    pub write: bool,
    /// The priority level the built-in schemas give a node's request of this kind.
    pub priority: &'static str,
}

const fn kind(
    name: &'static str,
    verbs: &'static [&'static str],
    groups: &'static [&'static str],
    resources: &'static [&'static str],
    write: bool,
    priority: &'static str,
) -> Kind {
    Kind {
        name,
        verbs,
        groups,
        resources,
        write,
        priority,
    }
}

const CORE: &[&str] = &[""];
const LEASES: &[&str] = &["coordination.k8s.io"];
/// `system-node-high` serves a node's Node and Lease requests; `system-nodes` the rest.
const HIGH: &str = "node-high";
const SYSTEM: &str = "system";

/// What a node agent (a kubelet, or this daemon as one) asks of the apiserver. Anything else
/// it asks lands in [`OTHER`].
pub const NODE_KINDS: &[Kind] = &[
    kind("get leases", &["get"], LEASES, &["leases"], false, HIGH),
    kind(
        "update leases",
        &["update", "patch"],
        LEASES,
        &["leases"],
        true,
        HIGH,
    ),
    kind(
        "create leases",
        &["create"],
        LEASES,
        &["leases"],
        true,
        HIGH,
    ),
    kind("get nodes", &["get"], CORE, &["nodes"], false, HIGH),
    kind("create nodes", &["create"], CORE, &["nodes"], true, HIGH),
    kind(
        "patch nodes",
        &["patch", "update"],
        CORE,
        &["nodes"],
        true,
        HIGH,
    ),
    kind(
        "patch nodes/status",
        &["patch", "update"],
        CORE,
        &["nodes/status"],
        true,
        HIGH,
    ),
    kind("list pods", &["list"], CORE, &["pods"], false, SYSTEM),
    kind("watch pods", &["watch"], CORE, &["pods"], false, SYSTEM),
    kind("get pods", &["get"], CORE, &["pods"], false, SYSTEM),
    kind(
        "patch pods/status",
        &["patch", "update"],
        CORE,
        &["pods/status"],
        true,
        SYSTEM,
    ),
    kind("delete pods", &["delete"], CORE, &["pods"], true, SYSTEM),
    kind(
        "create events",
        &["create", "patch", "update"],
        &["", "events.k8s.io"],
        &["events"],
        true,
        SYSTEM,
    ),
];

/// The name reports give requests of an attributed client that match none of its kinds.
pub const OTHER: &str = "other";

/// Lower than every built-in schema that could match a node (`system-node-high` is 400), so
/// these decide; the catch-all after the specific ones.
const PRECEDENCE: i32 = 300;
const CATCH_ALL_PRECEDENCE: i32 = 350;

fn schema_name(tag: &str, i: Option<usize>) -> String {
    match i {
        Some(i) => format!("attribute-{tag}-{i}"),
        None => format!("attribute-{tag}-{OTHER}"),
    }
}

/// Creates the FlowSchemas that attribute `user`'s requests to `kinds` under `tag` (a DNS
/// label: lower-case letters, digits and `-`), then waits until APF has taken the last one in.
pub async fn attribute(client: &Client, tag: &str, user: &str, kinds: &[Kind]) -> Result<()> {
    let api: Api<FlowSchema> = Api::all(client.clone());
    let subject = json!([{"kind": "User", "user": {"name": user}}]);
    let mut schemas = Vec::new();
    for (i, k) in kinds.iter().enumerate() {
        let rule = json!({"verbs": k.verbs, "apiGroups": k.groups, "resources": k.resources,
            "clusterScope": true, "namespaces": ["*"]});
        schemas.push((
            schema_name(tag, Some(i)),
            k.priority,
            PRECEDENCE,
            rule,
            None,
        ));
    }
    let all = json!({"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
        "clusterScope": true, "namespaces": ["*"]});
    let non_resource = json!([{"verbs": ["*"], "nonResourceURLs": ["*"]}]);
    let last = schema_name(tag, None);
    schemas.push((
        last.clone(),
        SYSTEM,
        CATCH_ALL_PRECEDENCE,
        all,
        Some(non_resource),
    ));
    for (name, priority, precedence, rule, non_resource) in schemas {
        let mut rules = json!({"subjects": subject, "resourceRules": [rule]});
        if let Some(nr) = non_resource {
            rules["nonResourceRules"] = nr;
        }
        let fs: FlowSchema = serde_json::from_value(json!({
            "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
            "metadata": {"name": name},
            "spec": {"priorityLevelConfiguration": {"name": priority},
                "matchingPrecedence": precedence,
                "distinguisherMethod": {"type": "ByUser"}, "rules": [rules]}}))?;
        api.create(&PostParams::default(), &fs)
            .await
            .with_context(|| format!("creating FlowSchema {name}"))?;
    }
    // The APF configuration controller marks each schema it has taken in with a `Dangling`
    // condition; requests before that go to the built-in schemas.
    crate::daemon::until(
        &format!("FlowSchema {last} in effect"),
        Duration::from_secs(60),
        || async {
            let fs = api.get(&last).await?;
            let seen = fs
                .status
                .and_then(|s| s.conditions)
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Dangling"));
            Ok(seen.then_some(()))
        },
    )
    .await
}

/// The requests `tag`'s client made, by the names of `kinds` (and [`OTHER`]), from a scrape
/// or a difference of two.
pub fn attributed(m: &Metrics, tag: &str, kinds: &[Kind]) -> BTreeMap<&'static str, f64> {
    let mut names: BTreeMap<String, &'static str> = kinds
        .iter()
        .enumerate()
        .map(|(i, k)| (schema_name(tag, Some(i)), k.name))
        .collect();
    names.insert(schema_name(tag, None), OTHER);
    let mut out: BTreeMap<&'static str, f64> = names.values().map(|n| (*n, 0.0)).collect();
    let dispatched = m.by(
        "apiserver_flowcontrol_dispatched_requests_total",
        &["flow_schema"],
        |_| true,
    );
    for (key, v) in dispatched {
        if let Some(name) = key.first().and_then(|s| names.get(s)) {
            *out.entry(name).or_insert(0.0) += v;
        }
    }
    out
}

/// The requests of `kinds` that change something, of one client's attributed requests.
pub fn writes(requests: &BTreeMap<&'static str, f64>, kinds: &[Kind]) -> f64 {
    let write = |name: &str| kinds.iter().any(|k| k.name == name && k.write);
    requests
        .iter()
        .filter(|(k, _)| write(k))
        .map(|(_, v)| v)
        .sum()
}

/// The requests of `kinds` that only read (watches included), [`OTHER`] aside.
pub fn reads(requests: &BTreeMap<&'static str, f64>, kinds: &[Kind]) -> f64 {
    let read = |name: &str| kinds.iter().any(|k| k.name == name && !k.write);
    requests
        .iter()
        .filter(|(k, _)| read(k))
        .map(|(_, v)| v)
        .sum()
}
