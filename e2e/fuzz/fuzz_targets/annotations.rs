//! A pod's annotations, resources, node selector and owners → the VM it asks for
//! (`reconcilers::spec::decode`), then that pod through the core's startup in the fake world,
//! whose every event and action must read back from the journal's JSON, and whose cocoon
//! commands carry no text that could read as a flag.
//!
//! The input is text, one `key=value` per line, so seeds are readable pods: `@ns=`, `@name=`
//! (DNS names only, as the API server admits) and `@uid=` set the pod's metadata;
//! `@req.<resource>=`, `@lim.<resource>=` its first container's resources (`@container=`
//! names one without any); `@sel.<k>=` its node selector; `@owner.<kind>=` an owner
//! reference; `@registry=` and `@cpu-class=` the node's config. Any other line is an
//! annotation; a key without `/` is one of the short names in `ALIASES`, else used as it is.

#![no_main]

use libfuzzer_sys::fuzz_target;
use reconcilers::config::Config;
use reconcilers::keys;
use reconcilers::names;
use reconcilers::pod::{Container, OwnerRef, PodView};
use reconcilers::quantity::parse_milli;
use reconcilers::spec::{self, VmSpec};
use reconcilers::testkit::World;
use reconcilers::{Action, Envelope};

const ALIASES: &[(&str, &str)] = &[
    ("name", keys::VM_NAME),
    ("id", keys::VM_ID),
    ("ip", keys::VM_IP),
    ("backend", keys::BACKEND),
    ("no-direct-io", keys::NO_DIRECT_IO),
    ("fork-from", keys::FORK_FROM),
    ("clone-from-dir", keys::CLONE_FROM_DIR),
    ("probe-port", keys::PROBE_PORT),
    ("hibernate", keys::HIBERNATE),
    ("restore-from-hibernate", keys::RESTORE_FROM_HIBERNATE),
    ("keep-snapshot-on-delete", keys::KEEP_SNAPSHOT_ON_DELETE),
    ("post-clone-state", keys::POST_CLONE_STATE),
    ("managed", keys::MANAGED),
    ("mode", keys::MODE),
    ("image", keys::IMAGE),
    ("os", keys::OS),
    ("storage", keys::STORAGE),
    ("network", keys::NETWORK),
    ("snapshot-policy", keys::SNAPSHOT_POLICY),
    ("force-pull", keys::FORCE_PULL),
    ("generation", keys::GENERATION),
];

fuzz_target!(|data: &[u8]| {
    let (pod, config) = pod_of(&String::from_utf8_lossy(data));
    let decoded = spec::decode(&pod);
    assert_eq!(
        spec::decode(&pod),
        decoded,
        "decoding is a function of the pod"
    );
    match &decoded {
        Ok(spec) => check_spec(&pod, spec),
        Err(e) => assert!(!e.key.is_empty() && !e.to_string().is_empty()),
    }
    start_in_fake_world(pod, config);
});

fn pod_of(text: &str) -> (PodView, Config) {
    let mut pod = PodView {
        namespace: "default".into(),
        name: "a".into(),
        uid: "u-a".into(),
        ..PodView::default()
    };
    let mut config = Config::default();
    let mut container: Option<Container> = None;
    for line in text.lines() {
        let (k, v) = line.split_once('=').unwrap_or((line, ""));
        let (k, v) = (k.to_string(), v.to_string());
        let c = || Container {
            name: "agent".into(),
            ..Container::default()
        };
        if let Some(r) = k.strip_prefix("@req.") {
            let c = container.get_or_insert_with(c);
            c.resources.requests.insert(r.into(), v);
        } else if let Some(r) = k.strip_prefix("@lim.") {
            let c = container.get_or_insert_with(c);
            c.resources.limits.insert(r.into(), v);
        } else if let Some(s) = k.strip_prefix("@sel.") {
            pod.node_selector.insert(s.into(), v);
        } else if let Some(kind) = k.strip_prefix("@owner.") {
            pod.owners.push(OwnerRef {
                kind: kind.into(),
                name: v,
            });
        } else {
            match k.as_str() {
                // The API server admits only DNS names here (no `/`, which `PodKey` relies
                // on); anything else could never reach the core.
                "@ns" if dns_name(&v) => pod.namespace = v,
                "@name" if dns_name(&v) => pod.name = v,
                "@uid" => pod.uid = v,
                "@container" => container.get_or_insert_with(c).name = v,
                "@registry" => config.registry = Some(v),
                "@cpu-class" => config.cpu_class = Some(v),
                _ => {
                    let key = match ALIASES.iter().find(|(short, _)| *short == k) {
                        Some((_, full)) => full.to_string(),
                        None => k,
                    };
                    pod.annotations.insert(key, v);
                }
            }
        }
    }
    pod.containers.extend(container);
    (pod, config)
}

fn dns_name(s: &str) -> bool {
    (1..=253).contains(&s.len())
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
}

/// What `decode` promises about a spec it accepts: every name bound for cocoon's argv is
/// valid (not a flag, no separator), and every size fits what the journal reads back (i64).
fn check_spec(pod: &PodView, s: &VmSpec) {
    assert!(names::valid_vm_name(&s.vm_name), "{s:?}");
    if s.managed && !s.image.is_empty() {
        assert!(names::valid_image_ref(&s.image), "{s:?}");
    }
    if let Some(n) = &s.network {
        assert!(names::valid_network(n), "{s:?}");
    }
    if let Some(f) = &s.fork_from {
        assert!(names::valid_vm_name(f), "{s:?}");
    }
    if let Some(d) = &s.clone_from_dir {
        let canonical = d == "/"
            || (d.starts_with('/')
                && d[1..]
                    .split('/')
                    .all(|seg| !seg.is_empty() && seg != "." && seg != ".."));
        assert!(
            canonical && !d.bytes().any(|c| c.is_ascii_control()),
            "{s:?}"
        );
    }
    assert_ne!(s.probe_port, Some(0));
    for size in [s.storage_bytes, s.vcpus, s.memory_bytes]
        .into_iter()
        .flatten()
    {
        assert!(
            (1..=i128::from(i64::MAX)).contains(&size),
            "a size the journal cannot read back: {s:?}"
        );
    }
    assert!((1..=10_000).contains(&s.cpu.weight), "{s:?}");
    let limit = pod
        .containers
        .first()
        .and_then(|c| c.resources.limits.get("cpu"))
        .and_then(|v| parse_milli(v));
    match limit {
        Some(m) => {
            let want = u64::try_from(m.saturating_mul(100).max(1000)).unwrap_or(u64::MAX);
            assert_eq!(s.cpu.quota_us, Some(want), "quota of a {m}m limit: {s:?}");
            assert_eq!(s.cpu.period_us, Some(100_000));
        }
        None => assert_eq!((s.cpu.quota_us, s.cpu.period_us), (None, None)),
    }
    if !s.managed {
        let ip = s
            .static_ip
            .as_deref()
            .expect("an unmanaged spec carries its IP");
        assert!(ip.parse::<std::net::Ipv4Addr>().is_ok(), "{s:?}");
        assert!(s.static_id.is_some());
    }
    let back: VmSpec = serde_json::from_str(&serde_json::to_string(s).unwrap()).unwrap();
    assert_eq!(&back, s);
    s.snapshot_on_delete(pod);
}

/// The pod at startup on an empty host, settled: the core decides, the fake cocoon answers.
/// Every step must survive the journal's JSON (`vk-cocoon replay` reads it back) and break
/// none of the world's invariants.
fn start_in_fake_world(pod: PodView, config: Config) {
    let mut w = World::new(config);
    w.max_steps = 2_000;
    w.start(vec![pod], vec![]);
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    for (env, actions) in &w.log {
        let text = serde_json::to_string(env).expect("an event serializes");
        let back: Envelope = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("the journal cannot read back {text}: {e}"));
        assert_eq!(&back, env);
        for a in actions {
            if let Action::RunCocoon { cmd, .. } = a {
                let fields = serde_json::to_value(cmd).expect("a command serializes");
                no_flag_in(&fields, cmd);
            }
        }
        let text = serde_json::to_string(actions).expect("actions serialize");
        let back: Vec<Action> = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("the journal cannot read back {text}: {e}"));
        assert_eq!(&back, actions);
    }
}

/// No text a command carries (names, image, directory, network…) can read as a flag in
/// cocoon's argv: the core runs cocoon as root with whatever the pod wrote.
fn no_flag_in(v: &serde_json::Value, cmd: &reconcilers::cocoon::CocoonCmd) {
    match v {
        serde_json::Value::String(s) => assert!(!s.starts_with('-'), "{s:?} in {:?}", cmd.argv()),
        serde_json::Value::Array(items) => items.iter().for_each(|i| no_flag_in(i, cmd)),
        serde_json::Value::Object(m) => m.values().for_each(|i| no_flag_in(i, cmd)),
        _ => {}
    }
}
