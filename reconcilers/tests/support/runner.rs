//! The scenario command language: each command drives or inspects a testkit `World` and
//! returns the lines it shows. A block is one or more commands, `----`, then their output.
//!
//! Setup: `config k=v…` (orphan_policy, cpu_class, restore_mode, cocoon=reference|current, node_ip, dhcp=off|DURATION,
//! stream=off, release=off, echo=off; before anything else touches the world), `pod KEY
//! k=v…`, `vm id=… name=… …`, `snapshot name=… hypervisor=… image=…`, `image-missing IMAGE`,
//! `tag NAME:TAG [kind=snapshot|cloud-image|container-image] [id=…] [hypervisor=…] [image=…] [pushed=TIME]
//! [base=…] [from=…]` (an artifact in the fake
//! registry; `config registry=BASE` turns the registry on).
//!
//! Bringing the node up: `start [settle=false] [config…]` feeds the pod relist and `cocoon vm
//! list` and settles what follows — the startup reconcile and the work it begins, such as
//! creates — so a file begins from a running node. It prints nothing but a `fatal`: startup is
//! the rule of few files, and those write `start show` (its trace through the file's filter)
//! or `start show=all`. `restart` brings a new process up the same way over the old world's
//! VMs, pods and leases.
//!
//! Driving: `apply KEY`, `annotate KEY k=v k-`, `delete`, `remove`, `remove-silently`,
//! `relist`, `relist-begin|item|end`, `vm-listed`, `vm-list-failed`, `stream KIND vm…`,
//! `stream-closed [clean]`, `stream-connected`, `crash ID`, `vanish ID`, `lease MAC IP`,
//! `lease-drop MAC`, `lease-vm ID IP`, `lease-vm-drop ID`, `probe KEY ok|fail`, `timer-fire
//! KIND KEY`, and answers to one pending effect by op id: `cocoon-ok`, `cocoon-err`,
//! `cocoon-garbage`, `kube-err`, `lease-release-err`; `registry-fail-next CALL TEXT [N]` queues
//! registry failures (`inspect`, `push`, `pull`, `delete-tag`, `peer-restore`); `peer NODE NAME
//! id=ID` gives another node a local snapshot to copy. Each prints the actions of the one
//! event it fed. `exec OP…` executes pending effects against the fake world, `settle` runs
//! until nothing is left, `run DURATION` also moves the clock; these print the trace: each
//! event as `> event`, its actions indented below. Faults for later: `fail-next VERB TEXT
//! [N]`, `garbage-next VERB`, `kube-fail-next KEY KIND`, `unreachable ID`, `reachable ID`,
//! `advance DURATION`.
//!
//! Inspecting: `status KEY`, `annotations KEY`, `state`, `events`, `pending`, `cocoon`, `registry`,
//! `counters [TERM…]` and `timers [TERM…]` (given terms, only the counters or the scheduled
//! items that begin with one: `counters pod_lifecycle`, `timers "timer create-retry"`).
//!
//! Filtering: a block shows only the actions its rule is about. `show TERM…` sets the filter
//! for the commands after it (`show all`, the initial one, shows everything); `show=TERM,…` on
//! one command overrides it for that command (a bare `show` lets `start` or `restart` use the
//! file's filter). A term is an action kind — the first word of the rendered line: `cocoon`,
//! `patch`, `delete-pod`, `release-lease`, `probe`, `stop-probe`, `timer`, `count`, `observe`,
//! `log`, `event`, `register-node`, `fatal` — or a longer prefix with `#op` left out (`"cocoon
//! vm inspect"`, `"timer recheck"`, `"count pod_lifecycle"`). Every printed action passes the
//! filter, and under a filter an event line is printed only when one of its actions is, so a
//! new timer or counter elsewhere changes no file that does not show it.

use std::collections::BTreeMap;

use reconcilers::action::{Action, Timer};
use reconcilers::cocoon_caps::CocoonCaps;
use reconcilers::config::{Config, OrphanPolicy, RestoreMode};
use reconcilers::event::{
    CocoonOk, Envelope, Event, KubeError, KubeErrorKind, SnapshotInfo, StaleOutcome, VmEventKind,
};
use reconcilers::keys;
use reconcilers::phase::{DeleteWait, HibernateStep, Phase, SaveStep};
use reconcilers::pod::{PodKey, PodView};
use reconcilers::status;
use reconcilers::testkit::{self, render, World};
use reconcilers::vm::{CocoonError, CocoonErrorKind, VmRecord};

pub struct Runner {
    config: Config,
    world: Option<World>,
    defs: BTreeMap<PodKey, PodView>,
    /// World switches applied to every world this runner makes.
    dhcp: Option<u64>,
    stream: bool,
    echo: bool,
    /// The filter set by the last `show` directive.
    show: Show,
    /// `expect unexpected`: the scenario provokes an outcome its pod was not waiting for.
    unexpected_expected: bool,
    /// The unexpected outcomes of worlds a `restart` replaced.
    unexpected_before: Vec<String>,
}

/// The unexpected outcomes in `w`'s log, as its error lines say them.
fn unexpected_in(w: &World) -> Vec<String> {
    w.log
        .iter()
        .flat_map(|(_, acts)| acts)
        .filter_map(|a| match a {
            Action::Log { message, .. } if message.starts_with("unexpected outcome:") => {
                Some(message.clone())
            }
            _ => None,
        })
        .collect()
}

fn key(s: &str) -> PodKey {
    let (ns, name) = s.split_once('/').unwrap_or(("default", s));
    PodKey::new(ns, name)
}

pub fn duration_ms(s: &str) -> u64 {
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60_000)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3_600_000)
    } else {
        (s, 1)
    };
    num.parse::<u64>()
        .unwrap_or_else(|_| panic!("bad duration {s:?}"))
        * mult
}

/// `k=v` arguments; a bare word is `word=""`.
fn args(toks: &[String]) -> Vec<(String, String)> {
    toks.iter()
        .map(|t| match t.split_once('=') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (t.clone(), String::new()),
        })
        .collect()
}

/// Short annotation names a scenario may use; anything with a `/` is a full key.
fn annotation_key(k: &str) -> Option<String> {
    let full = match k {
        "id" => keys::VM_ID,
        "ip" => keys::VM_IP,
        "vm" => keys::VM_NAME,
        "lifecycle" => keys::LIFECYCLE_STATE,
        "observed-gen" => keys::LIFECYCLE_GENERATION,
        "lifecycle-message" => keys::LIFECYCLE_MESSAGE,
        "post-clone" => keys::POST_CLONE_STATE,
        "gen" => keys::GENERATION,
        "os" => keys::OS,
        "backend" => keys::BACKEND,
        "storage" => keys::STORAGE,
        "network" => keys::NETWORK,
        "mode" => keys::MODE,
        "image" => keys::IMAGE,
        "fork-from" => keys::FORK_FROM,
        "clone-from-dir" => keys::CLONE_FROM_DIR,
        "probe-port" => keys::PROBE_PORT,
        "keep-snapshot" => keys::KEEP_SNAPSHOT_ON_DELETE,
        "snapshot-policy" => keys::SNAPSHOT_POLICY,
        "hibernate" => keys::HIBERNATE,
        "no-direct-io" => keys::NO_DIRECT_IO,
        "force-pull" => keys::FORCE_PULL,
        "managed" => keys::MANAGED,
        "restore-from-hibernate" => keys::RESTORE_FROM_HIBERNATE,
        k if k.contains('/') => k,
        _ => return None,
    };
    Some(full.to_string())
}

fn flag_value(v: &str) -> &str {
    if v.is_empty() {
        "true"
    } else {
        v
    }
}

fn vm_record(a: &[(String, String)]) -> VmRecord {
    let get = |k: &str| a.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str());
    let id = get("id").expect("vm needs id=");
    let mut b = testkit::vm(id, get("name").unwrap_or(""));
    for (k, v) in a {
        b = match k.as_str() {
            "state" => b.state(v),
            "pid" => b.pid(v.parse().expect("pid")),
            "mac" => b.mac(v),
            "ip" => b.static_ip(v),
            "hypervisor" => b.hypervisor(v),
            "image" => b.image(v),
            "id" | "name" => b,
            other => panic!("vm: unknown argument {other}"),
        };
    }
    let mut r = b.build();
    if get("mac") == Some("-") {
        r.mac = None;
    }
    r
}

/// Which action lines a command prints: every one, or those that begin with one of the terms
/// once `#op` ids are dropped. A term is a kind (`cocoon`) or a longer prefix ending at a word
/// boundary (`"cocoon vm inspect"`, `"count pod_lifecycle"`), so a block can name exactly the
/// actions its rule is about and stay unchanged when unrelated ones come or go.
#[derive(Clone)]
enum Show {
    All,
    Only(Vec<String>),
}

impl Show {
    /// `all`, or terms separated by blanks (directive) or commas (`show=`).
    fn parse<'a>(terms: impl IntoIterator<Item = &'a str>) -> Show {
        let terms: Vec<String> = terms
            .into_iter()
            .flat_map(|t| t.split(','))
            .filter(|t| !t.is_empty())
            .map(str::to_string)
            .collect();
        if terms.is_empty() || terms.iter().any(|t| t == "all") {
            Show::All
        } else {
            Show::Only(terms)
        }
    }

    fn shows(&self, line: &str) -> bool {
        let Show::Only(terms) = self else {
            return true;
        };
        let line: Vec<&str> = line.split(' ').filter(|w| !is_op(w)).collect();
        let line = line.join(" ");
        terms.iter().any(|t| begins_with_word(&line, t))
    }
}

fn is_op(word: &str) -> bool {
    word.strip_prefix('#')
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

fn begins_with_word(line: &str, term: &str) -> bool {
    line.strip_prefix(term)
        .is_some_and(|rest| !rest.starts_with(|c: char| c.is_alphanumeric() || "_-".contains(c)))
}

/// What a command produced, before the filter applies.
enum Out {
    Lines(Vec<String>),
    Actions(Vec<Action>),
    /// The events logged from this index on, each with its actions.
    Trace(usize),
}

/// Each event, then its shown actions indented. Under a filter an event whose actions are all
/// hidden is left out too, so that only the lines the block is about remain.
fn trace(log: &[(Envelope, Vec<Action>)], show: &Show) -> Vec<String> {
    let mut out = Vec::new();
    for (env, actions) in log {
        let shown: Vec<String> = actions
            .iter()
            .map(render::action)
            .filter(|l| show.shows(l))
            .collect();
        if shown.is_empty() && matches!(show, Show::Only(_)) {
            continue;
        }
        out.push(format!("> {}", render::event(&env.event)));
        out.extend(shown.iter().map(|l| format!("  {l}")));
    }
    out
}

impl Runner {
    pub fn new() -> Self {
        Self {
            config: Config::default(),
            world: None,
            defs: BTreeMap::new(),
            dhcp: None,
            stream: true,
            echo: true,
            show: Show::All,
            unexpected_expected: false,
            unexpected_before: Vec::new(),
        }
    }

    fn world(&mut self) -> &mut World {
        if self.world.is_none() {
            let mut w = World::new(self.config.clone());
            w.dhcp = self.dhcp;
            w.stream = self.stream;
            w.api.echo = self.echo;
            self.world = Some(w);
        }
        self.world.as_mut().expect("made")
    }

    /// What the run broke: the world's invariants, and (unless the scenario says `expect
    /// unexpected`) every outcome the core did not expect, since the fake world is faithful
    /// and an unexpected outcome there is a bug of the core or of the fake.
    pub fn finish(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .world
            .as_ref()
            .map(|w| w.violations.clone())
            .unwrap_or_default();
        let mut unexpected = self.unexpected_before.clone();
        unexpected.extend(self.world.as_ref().map(unexpected_in).unwrap_or_default());
        match (self.unexpected_expected, unexpected.is_empty()) {
            (false, false) => {
                out.extend(unexpected.into_iter().map(|u| {
                    format!("{u} (a scenario that provokes one says `expect unexpected`)")
                }))
            }
            (true, true) => out.push("`expect unexpected`, but no outcome was unexpected".into()),
            (false, true) | (true, false) => {}
        }
        out
    }

    fn configure(&mut self, a: &[(String, String)]) {
        for (k, v) in a {
            match k.as_str() {
                "orphan_policy" => self.config.orphan_policy = OrphanPolicy::parse(v),
                "cpu_class" => self.config.cpu_class = Some(v.clone()),
                "restore_mode" => {
                    self.config.restore_mode = match v.as_str() {
                        "copy" => RestoreMode::Copy,
                        "mmap" => RestoreMode::Mmap,
                        _ => RestoreMode::Ondemand,
                    }
                }
                "node_ip" => self.config.node_ip = v.clone(),
                "cocoon" => {
                    self.config.cocoon = match v.as_str() {
                        "reference" => CocoonCaps::REFERENCE,
                        _ => CocoonCaps::CURRENT,
                    }
                }
                "dhcp" => {
                    self.dhcp = match v.as_str() {
                        "off" => None,
                        d => Some(duration_ms(d)),
                    }
                }
                "stream" => self.stream = v != "off",
                "release" => self.config.release_dhcp_leases = v != "off",
                "from-dir-root" => self.config.clone_from_dir_root = Some(v.clone()),
                "macos-vnc" => self.config.macos_vnc = v != "off",
                "registry" => self.config.registry = Some(v.clone()).filter(|v| v != "off"),
                "echo" => self.echo = v != "off",
                "write_slots" => self.config.write_slots = v.parse().expect("write_slots"),
                // `networks=ns:a+b,*:c`: namespace `ns` may join a and b, every namespace c.
                "networks" => {
                    let mut lists = std::collections::BTreeMap::new();
                    for entry in v.split(',').filter(|e| !e.is_empty()) {
                        let (ns, nets) = entry.split_once(':').expect("ns:net+net");
                        lists.insert(
                            ns.to_string(),
                            nets.split('+').map(str::to_string).collect(),
                        );
                    }
                    self.config.networks = Some(lists);
                }
                // `public=a,b`: the repositories VK_PUBLIC_SNAPSHOTS lists (`public=` none).
                "public" => {
                    self.config.public_snapshots = Some(
                        v.split(',')
                            .filter(|n| !n.is_empty())
                            .map(str::to_string)
                            .collect(),
                    )
                }
                "image_url_hosts" => {
                    self.config.image_url_hosts = Some(
                        v.split(',')
                            .filter(|h| !h.is_empty())
                            .map(str::to_string)
                            .collect(),
                    )
                }
                "settle" => {}
                other => panic!("unknown setting {other}"),
            }
        }
        let settings = a.iter().filter(|(k, _)| k != "settle").count();
        assert!(
            settings == 0 || self.world.is_none(),
            "config must come before the world is made"
        );
    }

    fn pod(&mut self, toks: &[String]) {
        let k = key(&toks[0]);
        let mut b = testkit::pod(k.namespace(), k.name());
        for (a, v) in args(&toks[1..]) {
            b = match a.as_str() {
                "managed" => b.managed(),
                "run" => b.run(&v),
                "clone" => b.clone_of(&v),
                "uid" => b.uid(&v),
                "created" => b.created(duration_ms(&v) as i64),
                "vm" if v == "-" => b.no_vm_name(),
                "cpu" | "memory" => {
                    let (req, lim) = v.split_once('/').unwrap_or((&v, ""));
                    if a == "cpu" {
                        b.cpu(req, lim)
                    } else {
                        b.memory(req, lim)
                    }
                }
                "selector" => {
                    let (sk, sv) = v.split_once(':').expect("selector=key:value");
                    b.node_selector(sk, sv)
                }
                "cpu-class" => b.node_selector(keys::CPU_CLASS_SELECTOR, &v),
                "restart" => b.restart_policy(&v),
                "deleting" => b.deleting(0),
                "owner" => {
                    let (kind, name) = v.split_once(':').expect("owner=Kind:name");
                    b.owner(kind, name)
                }
                other => match annotation_key(other) {
                    Some(full) => b.annotation(&full, flag_value(&v)),
                    None => panic!("pod: unknown argument {other}"),
                },
            };
        }
        let pod = b.build();
        self.defs.insert(k, pod);
    }

    pub fn run(&mut self, line: &str) -> Vec<String> {
        let toks = super::datadriven::tokenize(line);
        let (cmd, rest) = toks.split_first().expect("empty command");
        let (shows, rest): (Vec<String>, Vec<String>) = rest
            .iter()
            .cloned()
            .partition(|t| t == "show" || t.starts_with("show="));
        let show = match shows.last() {
            Some(t) => t
                .strip_prefix("show=")
                .map_or(self.show.clone(), |v| Show::parse([v])),
            // Startup is the rule of few files; the rest only need the node up.
            None if cmd == "start" || cmd == "restart" => Show::Only(vec!["fatal".into()]),
            None => self.show.clone(),
        };
        match self.command(cmd, &rest) {
            Out::Lines(lines) => lines,
            Out::Actions(acts) => acts
                .iter()
                .map(render::action)
                .filter(|l| show.shows(l))
                .collect(),
            Out::Trace(from) => trace(&self.world().log[from..], &show),
        }
    }

    fn command(&mut self, cmd: &str, rest: &[String]) -> Out {
        let a = args(rest);
        match cmd {
            // `stray cocoon|kube|registry|sac OP`: an outcome for an operation nobody has out
            // (a shell that delivered one twice).
            "stray" => {
                let op = rest[1].parse().expect("op");
                let event = match rest[0].as_str() {
                    "cocoon" => Event::CocoonDone {
                        op,
                        result: Ok(CocoonOk::Done),
                    },
                    "kube" => Event::KubeDone {
                        op,
                        result: Ok(reconcilers::event::KubeOk::Done),
                    },
                    "registry" => Event::RegistryDone {
                        op,
                        result: Ok(reconcilers::event::RegistryOk::Pulled),
                    },
                    "sac" => Event::SacDone { op, result: Ok(()) },
                    other => panic!("stray {other}: cocoon, kube, registry or sac"),
                };
                Out::Actions(self.world().feed(event))
            }
            // `holders-restored`: the journal's records arriving after the start (a shell bug).
            "holders-restored" => Out::Actions(self.world().feed(Event::HoldersRestored {
                holders: Default::default(),
                problem: None,
            })),
            "expect" if rest.first().map(String::as_str) == Some("unexpected") => {
                self.unexpected_expected = true;
                Out::Lines(vec![])
            }
            "show" => {
                self.show = Show::parse(rest.iter().map(String::as_str));
                Out::Lines(vec![])
            }
            "config" => {
                self.configure(&a);
                Out::Lines(vec![])
            }
            "vm" => {
                let r = vm_record(&a);
                self.world().cocoon.add_vm(r);
                Out::Lines(vec![])
            }
            "snapshot" => {
                let get = |k: &str| {
                    a.iter()
                        .find(|(x, _)| x == k)
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default()
                };
                let (n, h, i) = (get("name"), get("hypervisor"), get("image"));
                self.world().cocoon.add_snapshot(&n, &h, &i);
                let owner = get("owner");
                if !owner.is_empty() {
                    let d = format!("{}{owner}", reconcilers::owner::DESCRIPTION_PREFIX);
                    self.world().cocoon.describe(&n, &d);
                }
                Out::Lines(vec![])
            }
            "tag" => {
                let get = |k: &str| {
                    a.iter()
                        .find(|(x, _)| x == k)
                        .map(|(_, v)| v.clone())
                        .unwrap_or_default()
                };
                let kind = match get("kind").as_str() {
                    "cloud-image" => reconcilers::event::ArtifactKind::CloudImage,
                    "container-image" => reconcilers::event::ArtifactKind::ContainerImage,
                    _ => reconcilers::event::ArtifactKind::Snapshot,
                };
                let stored = testkit::registry::Stored {
                    kind,
                    snapshot_id: Some(get("id"))
                        .filter(|i| !i.is_empty())
                        .unwrap_or_else(|| format!("R-{}", rest[0])),
                    hypervisor: get("hypervisor"),
                    image: get("image"),
                    base_image: Some(get("base")).filter(|b| !b.is_empty()),
                    from_node: Some(get("from")).filter(|f| !f.is_empty()),
                    owner: Some(get("owner")).filter(|o| !o.is_empty()),
                    pushed_at: Some(get("pushed"))
                        .filter(|p| !p.is_empty())
                        .map(|p| duration_ms(&p) as i64),
                };
                self.world().registry.tags.insert(rest[0].clone(), stored);
                Out::Lines(vec![])
            }
            // `peer NODE NAME id=ID`: NODE holds the local snapshot NAME, a peer restore's
            // source.
            "peer" => {
                let id = a
                    .iter()
                    .find(|(k, _)| k == "id")
                    .map(|(_, v)| v.clone())
                    .expect("peer NODE NAME id=ID");
                self.world()
                    .registry
                    .peers
                    .entry(rest[0].clone())
                    .or_default()
                    .insert(rest[1].clone(), id);
                Out::Lines(vec![])
            }
            // `nics VM dhcp|IP/PREFIX/GW ...`: the NICs a VM of that name gets when created.
            "nics" => {
                let plan = rest[1..]
                    .iter()
                    .map(|n| match n.as_str() {
                        "dhcp" => None,
                        spec => {
                            let mut p = spec.split('/');
                            Some(reconcilers::vm::StaticNet {
                                ip: p.next().expect("ip").to_string(),
                                prefix: p.next().map(|x| x.parse().expect("prefix")),
                                gateway: p.next().map(str::to_string),
                            })
                        }
                    })
                    .collect();
                self.world().cocoon.nets.insert(rest[0].clone(), plan);
                Out::Lines(vec![])
            }
            // `copied-guest VM`: clones of that name hold no lease until fixed up.
            "copied-guest" => {
                self.world().cocoon.copied_guests.insert(rest[0].clone());
                Out::Lines(vec![])
            }
            // `sac-fail-next STAGE TEXT`: the next SAC dialog fails at STAGE.
            "sac-fail-next" => {
                let stage = match rest[0].as_str() {
                    "dial" => reconcilers::event::SacStage::Dial,
                    "enum" => reconcilers::event::SacStage::Enum,
                    "set" => reconcilers::event::SacStage::Set,
                    "verify" => reconcilers::event::SacStage::Verify,
                    other => panic!("unknown SAC stage {other}"),
                };
                self.world()
                    .sac_faults
                    .push_back(reconcilers::event::SacError {
                        stage,
                        message: rest[1].clone(),
                    });
                Out::Lines(vec![])
            }
            "image-missing" => {
                self.world().cocoon.unpullable.insert(rest[0].clone());
                Out::Lines(vec![])
            }
            "pod" => {
                self.pod(rest);
                Out::Lines(vec![])
            }
            // `hold VM NS/POD [id=ID] [ns-uid=UID] [kept=true]`: a holder record the journal gives back at
            // the next start (T11); the pod's UID is the defined pod's.
            "hold" => {
                let k = key(&rest[1]);
                let uid = self
                    .defs
                    .get(&k)
                    .map_or(format!("u-{}", k.name()), |p| p.uid.clone());
                let ns_uid = a
                    .iter()
                    .find(|(x, _)| x == "ns-uid")
                    .map(|(_, v)| v.as_str());
                let tenant = reconcilers::owner::Tenant {
                    namespace: k.namespace(),
                    uid: ns_uid,
                };
                let held = reconcilers::holders::Held {
                    holder: reconcilers::holders::Holder::of(&k, &uid, tenant),
                    id: a.iter().find(|(x, _)| x == "id").map(|(_, v)| v.clone()),
                    kept: a.iter().any(|(x, v)| x == "kept" && v == "true"),
                };
                self.world().journaled_holders.set(&rest[0], Some(held));
                Out::Lines(vec![])
            }
            "start" => {
                self.configure(&a);
                let manual = a.iter().any(|(k, v)| k == "settle" && v == "false");
                let pods: Vec<PodView> = self.defs.values().cloned().collect();
                let w = self.world();
                let from = w.log.len();
                w.start_unsettled(pods, vec![]);
                if !manual {
                    w.settle();
                }
                Out::Trace(from)
            }
            "restart" => self.restart(&a),
            "apply" => {
                let k = key(&rest[0]);
                let pod = self
                    .defs
                    .get(&k)
                    .expect("apply: no such pod defined")
                    .clone();
                Out::Actions(self.world().apply(pod))
            }
            "annotate" => {
                let k = key(&rest[0]);
                let mut out = Vec::new();
                for t in &rest[1..] {
                    let (ak, v) = match t.strip_suffix('-') {
                        Some(ak) if !t.contains('=') => (ak.to_string(), None),
                        _ => {
                            let (ak, v) = t.split_once('=').unwrap_or((t, ""));
                            (ak.to_string(), Some(flag_value(v).to_string()))
                        }
                    };
                    let full = annotation_key(&ak).unwrap_or_else(|| panic!("key {ak}"));
                    out.extend(self.world().annotate(&k, &full, v.as_deref()));
                }
                Out::Actions(out)
            }
            "delete" => Out::Actions(self.world().delete_pod(&key(&rest[0]))),
            // `evict NS/POD REASON`: the cluster deletes the pod (DisruptionTarget REASON).
            "evict" => Out::Actions(self.world().evict_pod(&key(&rest[0]), &rest[1])),
            "remove" => Out::Actions(self.world().remove_pod(&key(&rest[0]))),
            // Gone from the API while the watch missed it: only a relist can tell.
            "remove-silently" => {
                self.world().api.pods.remove(&key(&rest[0]));
                Out::Lines(vec![])
            }
            "vm-listed" => {
                let w = self.world();
                let vms = w.cocoon.vms.values().cloned().collect();
                Out::Actions(w.feed(Event::VmListed { vms }))
            }
            "vm-list-failed" => {
                let error = CocoonError::classify(&rest[0]);
                Out::Actions(self.world().feed(Event::VmListFailed { error }))
            }
            "relist-begin" => Out::Actions(self.world().feed(Event::PodRelistBegin)),
            // `namespace NAME uid=UID`: the namespace watch reports NAME (T16).
            "namespace" => {
                let uid = a.iter().find(|(x, _)| x == "uid").expect("uid=").1.clone();
                let name = rest[0].clone();
                Out::Actions(self.world().feed(Event::Namespace { name, uid }))
            }
            "relist-item" => {
                let k = key(&rest[0]);
                let pod = self.defs.get(&k).expect("relist-item: no such pod").clone();
                let w = self.world();
                w.api.pods.insert(k, pod.clone());
                Out::Actions(w.feed(Event::PodRelistItem { pod }))
            }
            "relist-end" => Out::Actions(self.world().feed(Event::PodRelistEnd)),
            "relist" => {
                let w = self.world();
                let from = w.log.len();
                w.relist();
                Out::Trace(from)
            }
            "cocoon-ok" => {
                let op = rest[0].parse().expect("op");
                let ok = cocoon_ok(&rest[1..]);
                Out::Actions(self.world().cocoon_done(op, Ok(ok)))
            }
            "cocoon-err" => {
                let op = rest[0].parse().expect("op");
                let err = CocoonError::classify(&rest[1]);
                Out::Actions(self.world().cocoon_done(op, Err(err)))
            }
            "cocoon-garbage" => {
                let op = rest[0].parse().expect("op");
                let err = CocoonError::new(
                    CocoonErrorKind::BadOutput,
                    "decode output: expected value at line 1 column 1",
                );
                Out::Actions(self.world().cocoon_done(op, Err(err)))
            }
            // `lease-release-err OP TEXT`: cocoon-net refused or was unreachable.
            "lease-release-err" => {
                let op = rest[0].parse().expect("op");
                Out::Actions(self.world().lease_released(op, Err(rest[1].clone())))
            }
            "kube-err" => {
                let op = rest[0].parse().expect("op");
                let kind = kube_kind(&rest[1]);
                let err = KubeError {
                    kind,
                    message: format!("{kind:?}"),
                };
                Out::Actions(self.world().kube_done(op, Err(err)))
            }
            "exec" => {
                let w = self.world();
                let from = w.log.len();
                for op in rest {
                    w.exec_op(op.parse().expect("op"));
                }
                Out::Trace(from)
            }
            "lease" => Out::Actions(self.world().set_lease(&rest[0], &rest[1])),
            "lease-drop" => Out::Actions(self.world().drop_lease(&rest[0])),
            // The lease of a VM's first NIC, by VM id (its MAC is the fake cocoon's).
            "lease-vm" => {
                let mac = self.mac_of(&rest[0]);
                Out::Actions(self.world().set_lease(&mac, &rest[1]))
            }
            "lease-vm-drop" => {
                let mac = self.mac_of(&rest[0]);
                Out::Actions(self.world().drop_lease(&mac))
            }
            "probe" => {
                let ok = rest[1] == "ok";
                Out::Actions(
                    self.world()
                        .answer_probe(&key(&rest[0]), ok)
                        .expect("no probe scheduled for that pod"),
                )
            }
            "advance" => {
                self.world().advance(duration_ms(&rest[0]));
                Out::Lines(vec![])
            }
            "timer-fire" => {
                let want = format!("{} {}", rest[0], rest[1]);
                let pick = move |t: &Timer| render::timer(t) == want;
                Out::Actions(self.world().fire_timer(pick).expect("no such timer armed"))
            }
            "stream" => {
                let kind = match rest[0].as_str() {
                    "ADDED" => VmEventKind::Added,
                    "MODIFIED" => VmEventKind::Modified,
                    _ => VmEventKind::Deleted,
                };
                let vm = vm_record(&a[1..]);
                Out::Actions(self.world().feed(Event::VmStream { kind, vm }))
            }
            "stream-closed" => {
                let clean = rest.first().is_some_and(|c| c == "clean");
                Out::Actions(
                    self.world()
                        .feed(Event::VmStreamClosed { clean, error: None }),
                )
            }
            "stream-connected" => Out::Actions(self.world().feed(Event::VmStreamConnected)),
            "crash" => Out::Actions(self.world().crash(&rest[0])),
            // `macos-vm NAME [vnc=D] [state=S]`: a cocoon-macos guest (pid 0 unless running).
            "macos-vm" => {
                let w = self.world();
                let vm = w.cocoon.add_macos(&rest[0], None);
                for (k, v) in &a[1..] {
                    match k.as_str() {
                        "vnc" => vm.vnc = Some(v.parse().expect("vnc=D")),
                        "state" => vm.state = v.clone(),
                        other => panic!("macos-vm: unknown argument {other}"),
                    }
                }
                if !vm.is_running() {
                    vm.pid = 0;
                }
                Out::Lines(vec![])
            }
            // `macos-set-vnc NAME D|-`: the guest now serves display D, or no VNC.
            "macos-set-vnc" => {
                let vnc = (rest[1] != "-").then(|| rest[1].parse().expect("display"));
                if let Some(vm) = self.world().cocoon.macos.get_mut(&rest[0]) {
                    vm.vnc = vnc;
                }
                Out::Lines(vec![])
            }
            // The guest was removed behind vk's back.
            "macos-vanish" => {
                self.world().cocoon.macos.remove(&rest[0]);
                Out::Lines(vec![])
            }
            // The guest's QEMU died behind vk's back.
            "macos-crash" => {
                self.world().cocoon.macos_crash(&rest[0]);
                Out::Lines(vec![])
            }
            "macos-guests" => {
                let w = self.world();
                let mut lines: Vec<String> = w
                    .cocoon
                    .macos
                    .values()
                    .map(|v| {
                        let vnc = v.vnc.map_or("-".to_string(), |d| d.to_string());
                        format!("{} {} pid={} vnc={vnc}", v.name, v.state, v.pid)
                    })
                    .collect();
                if lines.is_empty() {
                    lines.push("(no guests)".into());
                }
                Out::Lines(lines)
            }
            "vanish" => Out::Actions(self.world().vanish(&rest[0])),
            // `fail-next VERB TEXT [N]`: the next N calls of VERB fail with TEXT.
            "fail-next" => {
                let n: usize = rest.get(2).map_or(1, |n| n.parse().expect("count"));
                for _ in 0..n {
                    self.world().cocoon.fail_next(&rest[0], &rest[1]);
                }
                Out::Lines(vec![])
            }
            "registry-fail-next" => {
                let n: usize = rest.get(2).map_or(1, |n| n.parse().expect("count"));
                for _ in 0..n {
                    self.world().registry.fail_next(&rest[0], &rest[1]);
                }
                Out::Lines(vec![])
            }
            "registry" => {
                let w = self.world();
                let mut lines: Vec<String> = w
                    .registry
                    .tags
                    .iter()
                    .map(|(tag, t)| {
                        let base = t.base_image.as_deref().unwrap_or("-");
                        let from = t.from_node.as_deref().unwrap_or("-");
                        let owner = match &t.owner {
                            Some(o) => format!(" owner={o}"),
                            None => String::new(),
                        };
                        format!("{tag} id={} base={base} from={from}{owner}", t.snapshot_id)
                    })
                    .collect();
                if lines.is_empty() {
                    lines.push("(no tags)".into());
                }
                lines.extend(w.registry.staged.iter().map(|d| format!("staged {d}")));
                Out::Lines(lines)
            }
            "garbage-next" => {
                self.world().cocoon.garbage_next(&rest[0]);
                Out::Lines(vec![])
            }
            "kube-fail-next" => {
                let kind = kube_kind(&rest[1]);
                self.world().api.fail_next(&key(&rest[0]), kind);
                Out::Lines(vec![])
            }
            "unreachable" => {
                self.world().unreachable.insert(rest[0].clone());
                Out::Lines(vec![])
            }
            "reachable" => {
                self.world().unreachable.remove(&rest[0]);
                Out::Lines(vec![])
            }
            "settle" => {
                let w = self.world();
                let from = w.log.len();
                w.settle();
                Out::Trace(from)
            }
            "run" => {
                let w = self.world();
                let from = w.log.len();
                w.run_for(duration_ms(&rest[0]));
                Out::Trace(from)
            }
            "status" => Out::Lines(self.status(&key(&rest[0]))),
            "annotations" => Out::Lines(self.annotations(&key(&rest[0]))),
            "counters" => {
                let names = Show::parse(rest.iter().map(String::as_str));
                Out::Lines(
                    self.world()
                        .counters
                        .iter()
                        .map(|(k, v)| format!("{k} {v}"))
                        .filter(|l| names.shows(l))
                        .collect(),
                )
            }
            "events" => Out::Lines(
                self.world()
                    .events
                    .iter()
                    .map(|e| format!("{} {} {} {:?}", e.key, e.kind, e.reason, e.message))
                    .collect(),
            ),
            "pending" => Out::Actions(self.world().pending().cloned().collect()),
            "timers" => {
                let only = Show::parse(rest.iter().map(String::as_str));
                let w = self.world();
                let now = w.now;
                Out::Lines(
                    w.scheduled()
                        .map(|((due, _), s)| (due - now, scheduled(s)))
                        .filter(|(_, s)| only.shows(s))
                        .map(|(wait, s)| format!("+{wait}ms {s}"))
                        .collect(),
                )
            }
            "state" => Out::Lines(self.state()),
            "cocoon" => {
                let c = &self.world().cocoon;
                let mut out: Vec<String> = c
                    .vms
                    .values()
                    .map(|v| format!("vm {} {} {}", v.id, v.name, v.state))
                    .collect();
                out.extend(
                    c.snapshots
                        .iter()
                        .map(|(n, s)| match s.description.as_str() {
                            "" => format!("snapshot {n}"),
                            d => format!("snapshot {n} description={d:?}"),
                        }),
                );
                Out::Lines(out)
            }
            other => panic!("unknown command {other:?}"),
        }
    }

    fn mac_of(&mut self, id: &str) -> String {
        let w = self.world();
        w.cocoon
            .vms
            .get(id)
            .and_then(|v| v.mac.clone())
            .unwrap_or_else(|| testkit::mac_for(id))
    }

    fn restart(&mut self, a: &[(String, String)]) -> Out {
        let old = self.world.take().expect("restart before start");
        self.unexpected_before.extend(unexpected_in(&old));
        let manual = a.iter().any(|(k, v)| k == "settle" && v == "false");
        self.world = Some(old.restarted());
        let w = self.world();
        let from = w.log.len();
        w.start_unsettled(vec![], vec![]);
        // The shell's lease-file source reports the table once it has read it.
        w.feed_lease_table();
        if !manual {
            w.settle();
        }
        Out::Trace(from)
    }

    fn status(&mut self, k: &PodKey) -> Vec<String> {
        let w = self.world();
        let mut out = Vec::new();
        if let Some(e) = w.state.pods.get(k) {
            let d = status::derive(&w.state.config, e);
            out.push(format!("derived: {}", render::status(&d)));
            let when = d.start_time.as_deref().unwrap_or("-");
            let ready_at = d
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .and_then(|c| c.last_transition_time.as_deref())
                .unwrap_or("-");
            out.push(format!("  startTime={when} readySince={ready_at}"));
        } else {
            out.push("derived: (no entry)".into());
        }
        match w.api.pods.get(k) {
            Some(p) => out.push(format!("server: {}", render::status(&p.status))),
            None => out.push("server: (no pod)".into()),
        }
        out
    }

    fn annotations(&mut self, k: &PodKey) -> Vec<String> {
        let w = self.world();
        match w.api.pods.get(k) {
            None => vec!["(no pod)".into()],
            Some(p) => p
                .annotations
                .iter()
                .filter(|(k, _)| k.starts_with("vm.cocoonstack.io/") && k.as_str() != keys::VM_NAME)
                .map(|(k, v)| format!("{}={v}", render::short_key(k)))
                .collect(),
        }
    }

    fn state(&mut self) -> Vec<String> {
        let w = self.world();
        let mut out: Vec<String> = w
            .state
            .pods
            .sorted()
            .into_iter()
            .map(|(k, e)| {
                let vm = e.vm().map_or("-".into(), |v| v.record.id.clone());
                let busy = busy(&e.phase);
                let (life, stamp) = e.lifecycle().map_or(("-", 0), |(s, g, _)| (s.as_str(), g));
                format!(
                    "{k} vm={vm} busy={busy} lifecycle={life}@{stamp} probe={}",
                    if e.probe.ready { "ready" } else { "not-ready" }
                )
            })
            .collect();
        for name in w.state.unclaimed.keys() {
            out.push(format!("unclaimed {name}"));
        }
        if out.is_empty() {
            out.push("(no pods)".into());
        }
        out
    }
}

/// The step the pod waits on, if any: a bring-up step, a VM task, a removal.
fn busy(phase: &Phase) -> String {
    let step = |v: serde_json::Value| v["step"].as_str().unwrap_or("?").to_string();
    match phase {
        Phase::Creating(c) => step(serde_json::to_value(&c.step).expect("serializable")),
        Phase::Running(r) => r.task.as_ref().map_or("-".into(), |t| {
            step(serde_json::to_value(&t.step).expect("serializable"))
        }),
        Phase::Deleting(d) => match d.wait {
            DeleteWait::RemoveVm(_) => "remove_vm".into(),
            DeleteWait::Task(_) => "task".into(),
            DeleteWait::Save(SaveStep::Save | SaveStep::SaveAgain, _) => "save".into(),
            DeleteWait::Save(SaveStep::InspectHolder, _) => "inspect_taken_save".into(),
            DeleteWait::Save(SaveStep::RemoveHolder, _) => "remove_taken_save".into(),
            DeleteWait::Push(_) => "push".into(),
            DeleteWait::Keep(_, _) => "keep".into(),
            DeleteWait::Retry => "-".into(),
        },
        Phase::Evicting(e) if e.delete.is_none() => "remove_for_evict".into(),
        Phase::Hibernating(h) => match h.step {
            HibernateStep::Save { save } => match save {
                SaveStep::Save => "hibernate_save".into(),
                SaveStep::InspectHolder => "hibernate_inspecttakensave".into(),
                SaveStep::RemoveHolder => "hibernate_removetakensave".into(),
                SaveStep::SaveAgain => "hibernate_saveagain".into(),
            },
            ref step @ (HibernateStep::Start
            | HibernateStep::ReleaseLease
            | HibernateStep::DropNic
            | HibernateStep::Push
            | HibernateStep::Remove
            | HibernateStep::RestoreNic { .. }) => format!("hibernate_{step:?}").to_lowercase(),
        },
        Phase::Hibernated => "hibernated".into(),
        Phase::Waiting
        | Phase::Failed(_)
        | Phase::Evicting(_)
        | Phase::Terminal(_)
        | Phase::Gone(_) => "-".into(),
    }
}

fn scheduled(s: &testkit::Scheduled) -> String {
    match s {
        testkit::Scheduled::Timer(t) => format!("timer {}", render::timer(t)),
        testkit::Scheduled::Probe { key, seq, .. } => format!("probe {key} p{seq}"),
        testkit::Scheduled::Lease { mac, ip } => format!("lease {mac}={ip}"),
    }
}

fn kube_kind(s: &str) -> KubeErrorKind {
    match s {
        "not_found" | "404" => KubeErrorKind::NotFound,
        "conflict" | "409" => KubeErrorKind::Conflict,
        "invalid" | "422" => KubeErrorKind::Invalid,
        _ => KubeErrorKind::Other,
    }
}

/// `vm id=… name=… …` | `snapshot name=… hypervisor=… image=…` | `stale OUTCOME` | nothing.
fn cocoon_ok(toks: &[String]) -> CocoonOk {
    let Some((what, rest)) = toks.split_first() else {
        return CocoonOk::Done;
    };
    let a = args(rest);
    let get = |k: &str| {
        a.iter()
            .find(|(x, _)| x == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    match what.as_str() {
        "vm" => CocoonOk::Vm { vm: vm_record(&a) },
        "snapshot" => CocoonOk::Snapshot {
            snapshot: SnapshotInfo {
                id: format!("S-{}", get("name")),
                name: get("name"),
                hypervisor: get("hypervisor"),
                image: get("image"),
                description: Some(get("owner"))
                    .filter(|o| !o.is_empty())
                    .map(|o| format!("{}{o}", reconcilers::owner::DESCRIPTION_PREFIX))
                    .unwrap_or_default(),
            },
        },
        "stale" => CocoonOk::StaleCreate {
            outcome: StaleOutcome::parse(&rest[0])
                .unwrap_or_else(|| panic!("cocoon-ok: unknown stale-create outcome {}", rest[0])),
        },
        other => panic!("cocoon-ok: unknown result {other}"),
    }
}
