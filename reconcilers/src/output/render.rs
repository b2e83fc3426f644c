//! One line per action or event: the compact form scenario files and journal diffs show.
//! Cocoon calls print their exact argv; annotation keys under `vm.cocoonstack.io/` drop that
//! prefix (every key vk writes lives there, so nothing becomes ambiguous).

use crate::action::{
    Action, CountHistogram, Counter, Histogram, ProbeCheck, ProbeTarget, RegistryCall, Timer,
};
use crate::event::{CocoonOk, Event, KubeOk, RegistryOk};
use crate::status::PodStatus;

fn q(s: &str) -> String {
    format!("{s:?}")
}

pub fn registry_call(c: &RegistryCall) -> String {
    match c {
        RegistryCall::Inspect { name, tag } => format!("inspect {name}:{tag}"),
        RegistryCall::Push {
            snapshot,
            name,
            tag,
            base_image,
            owner,
        } => format!("push {snapshot} -> {name}:{tag} base={base_image} owner={owner}"),
        RegistryCall::Pull {
            name,
            tag,
            local,
            namespace,
            namespace_uid,
        } => match namespace_uid {
            None => format!("pull {name}:{tag} -> {local} for={namespace}"),
            Some(uid) => format!("pull {name}:{tag} -> {local} for={namespace}@{uid}"),
        },
        RegistryCall::DeleteTag { name, tag } => format!("delete-tag {name}:{tag}"),
        RegistryCall::PullCloudImage { name, tag, image } => {
            format!("pull-cloud-image {name}:{tag} -> {image}")
        }
        RegistryCall::PeerRestore {
            name,
            tag,
            node,
            snapshot_id,
            staging,
        } => format!(
            "peer-restore {name} from={node} id={snapshot_id} for={name}:{tag} -> {staging}"
        ),
        RegistryCall::RemoveStaging { staging } => format!("remove-staging {staging}"),
    }
}

pub fn short_key(k: &str) -> &str {
    k.strip_prefix("vm.cocoonstack.io/").unwrap_or(k)
}

pub fn timer(t: &Timer) -> String {
    let (kind, key) = match t {
        Timer::CreateRetry { key, .. } => ("create-retry", key),
        Timer::Recheck { key, .. } => ("recheck", key),
        Timer::IpWait { key, .. } => ("lease-wait", key),
        Timer::RenewNudge { key, .. } => ("renew-nudge", key),
        Timer::PostCloneRetry { key, .. } => ("post-clone-retry", key),
        Timer::KubeRetry { key, .. } => ("kube-retry", key),
        Timer::DeleteRetry { key, .. } => ("delete-retry", key),
        Timer::EvictRetry { key, .. } => ("evict-retry", key),
        Timer::HibernateRetry { key, .. } => ("hibernate-retry", key),
        Timer::StaleCreate { id, .. } => return format!("stale-create {id}"),
        Timer::Sweep => return "sweep".into(),
    };
    format!("{kind} {key}")
}

pub fn counter(c: &Counter) -> String {
    match c {
        Counter::PodLifecycle { op, result, reason } => {
            format!("pod_lifecycle{{op={op},result={result},reason={reason}}}")
        }
        Counter::OrphanVm => "orphan_vm".into(),
        Counter::SnapshotKept => "snapshot_kept".into(),
        Counter::VmInspectTransientFail => "vm_inspect_transient_fail".into(),
        Counter::PodEvictFailure => "pod_evict_failure".into(),
        Counter::ReconcileAdoptByName => "reconcile_adopt_by_name".into(),
        Counter::StaleCreateReconcile { outcome } => {
            format!("stale_create_reconcile{{outcome={outcome}}}")
        }
        Counter::WakeIpWait { result } => format!("wake_ip_wait{{result={result}}}"),
        Counter::SnapshotPull { result } => format!("snapshot_pull{{result={result}}}"),
        Counter::CloneFromDir { result } => format!("clone_from_dir{{result={result}}}"),
        Counter::StartupResume { op } => format!("startup_resume{{op={op}}}"),
        Counter::LeaseRelease { result } => format!("lease_release{{result={result}}}"),
        Counter::UnexpectedOutcome => "unexpected_outcome".into(),
        Counter::SnapshotSave { result } => format!("snapshot_save{{result={result}}}"),
        Counter::SnapshotPush { result } => format!("snapshot_push{{result={result}}}"),
        Counter::Hibernate { phase, result } => {
            format!("hibernate{{phase={phase},result={result}}}")
        }
        Counter::Wake { result } => format!("wake{{result={result}}}"),
        Counter::SnapshotVerify { result } => format!("snapshot_verify{{result={result}}}"),
        Counter::SnapshotPeerRestore { result } => {
            format!("snapshot_peer_restore{{result={result}}}")
        }
        Counter::WakeRenewNudge { result } => format!("wake_renew_nudge{{result={result}}}"),
        Counter::HibernateEvidence { verdict } => {
            format!("hibernate_evidence{{verdict={verdict}}}")
        }
        Counter::PostClone { kind, result } => {
            format!("postclone{{kind={kind},result={result}}}")
        }
    }
}

fn probe_target(t: &ProbeTarget) -> String {
    let check = match &t.check {
        ProbeCheck::Icmp => "icmp".to_string(),
        ProbeCheck::Tcp { port } => format!("tcp:{port}"),
        ProbeCheck::SshBanner => "ssh".to_string(),
    };
    format!("{check} {}", t.ip.as_deref().unwrap_or("-"))
}

/// `phase=Running ready=true ip=10.0.0.5`, plus reason, message and a terminated container.
pub fn status(s: &PodStatus) -> String {
    let mut out = format!("phase={}", s.phase);
    if let Some(c) = s.conditions.iter().find(|c| c.type_ == "Ready") {
        out += &format!(" ready={}", c.status == "True");
    }
    if let Some(ip) = &s.pod_ip {
        out += &format!(" ip={ip}");
    }
    if let Some(r) = &s.reason {
        out += &format!(" reason={r}");
    }
    if let Some(m) = &s.message {
        out += &format!(" message={}", q(m));
    }
    for c in &s.container_statuses {
        if let Some(t) = &c.state.terminated {
            out += &format!(
                " terminated={}:{}",
                t.reason.as_deref().unwrap_or("-"),
                t.exit_code
            );
        }
    }
    out
}

pub fn action(a: &Action) -> String {
    match a {
        // A guest script's lines stay on the action's one line.
        Action::RunCocoon { op, cmd, .. } => {
            let argv = cmd.argv().join(" ").replace('\n', "\\n");
            match cmd.binary() {
                crate::cocoon::Binary::Cocoon => format!("cocoon #{op} {argv}"),
                crate::cocoon::Binary::CocoonMacos => format!("cocoon #{op} cocoon-macos {argv}"),
            }
        }
        Action::PatchPod {
            op,
            key,
            status: s,
            annotations,
            ..
        } => patch(*op, key, s.as_ref(), annotations),
        Action::ReleaseDhcpLease { op, mac } => format!("release-lease #{op} {mac}"),
        Action::DeletePod {
            op,
            key,
            uid,
            grace_seconds,
        } => {
            let grace = grace_seconds.map_or("default".into(), |g| g.to_string());
            format!("delete-pod #{op} {key} uid={uid} grace={grace}")
        }
        Action::RecordEvent {
            key,
            kind,
            reason,
            message,
            source,
            ..
        } => match source {
            crate::action::EventSource::Vk => {
                format!("event {key} {kind:?} {reason} {}", q(message))
            }
            crate::action::EventSource::PodController => {
                format!(
                    "event[pod-controller] {key} {kind:?} {reason} {}",
                    q(message)
                )
            }
        },
        Action::RunProbe {
            key,
            seq,
            target,
            after_ms,
            standing,
        } => match standing {
            false => format!(
                "probe {key} p{seq} {} after={after_ms}ms",
                probe_target(target)
            ),
            true => format!(
                "probe {key} p{seq} {} every={after_ms}ms",
                probe_target(target)
            ),
        },
        Action::StopProbe { key } => format!("stop-probe {key}"),
        Action::ArmTimer { timer: t, after_ms } => format!("timer {} after={after_ms}ms", timer(t)),
        Action::Count { counter: c } => format!("count {}", counter(c)),
        Action::Observe { histogram, millis } => observe(histogram, *millis),
        Action::ObserveCount { histogram, count } => match histogram {
            CountHistogram::PostCloneRetryAttempts { result } => {
                format!("observe postclone_retry_attempts{{result={result}}} {count}")
            }
        },
        Action::RunSac {
            op,
            key,
            vm_id,
            nic_count,
            nics,
        } => {
            let set: Vec<String> = nics
                .iter()
                .map(|n| format!("nic{}={} {} {}", n.position, n.ip, n.mask, n.gateway))
                .collect();
            format!(
                "sac #{op} {key} vm={vm_id} nics={nic_count} [{}]",
                set.join(", ")
            )
        }
        Action::CallRegistry { op, call, .. } => format!("registry #{op} {}", registry_call(call)),
        Action::Log { level, message } => {
            format!("log {} {}", format!("{level:?}").to_lowercase(), q(message))
        }
        Action::Hold { vm, held: None } => format!("hold {vm} -"),
        Action::Hold { vm, held: Some(h) } => format!(
            "hold {vm} {}/{} uid={} id={}{}{}",
            h.holder.namespace,
            h.holder.pod,
            h.holder.uid,
            h.id.as_deref().unwrap_or("-"),
            h.holder
                .namespace_uid
                .as_ref()
                .map_or(String::new(), |u| format!(" ns-uid={u}")),
            if h.kept { " kept" } else { "" }
        ),
        Action::RegisterNode => "register-node".into(),
        Action::Abort { message } => format!("fatal {}", q(message)),
    }
}

fn observe(histogram: &Histogram, millis: u64) -> String {
    match histogram {
        Histogram::VmBootDuration { mode, backend } => {
            format!("observe vm_boot_duration{{mode={mode},backend={backend}}} {millis}ms")
        }
        Histogram::SnapshotSaveDuration => format!("observe snapshot_save_duration {millis}ms"),
        Histogram::SnapshotPushDuration => format!("observe snapshot_push_duration {millis}ms"),
        Histogram::SnapshotPullDuration => format!("observe snapshot_pull_duration {millis}ms"),
        Histogram::SnapshotPeerRestoreDuration => {
            format!("observe snapshot_peer_restore_duration {millis}ms")
        }
        Histogram::PodStartup { stage } => {
            format!("observe pod_startup{{stage={}}} {millis}ms", stage.as_str())
        }
        Histogram::VmEventToStatus => format!("observe vm_event_status {millis}ms"),
    }
}

fn patch(
    op: crate::action::OpId,
    key: &crate::pod::PodKey,
    s: Option<&crate::status::PodStatus>,
    annotations: &std::collections::BTreeMap<String, Option<String>>,
) -> String {
    let mut line = format!("patch #{op} {key}");
    if let Some(s) = s {
        line += &format!(" status {}", status(s));
    }
    if !annotations.is_empty() {
        let kv: Vec<String> = annotations
            .iter()
            .map(|(k, v)| match v {
                Some(v) => format!("{}={}", short_key(k), v),
                None => format!("{}=null", short_key(k)),
            })
            .collect();
        line += &format!(" annotate {}", kv.join(" "));
    }
    line
}

fn cocoon_ok(ok: &CocoonOk) -> String {
    match ok {
        CocoonOk::Done => "ok".into(),
        CocoonOk::Vm { vm } => format!("ok vm {} {} {} pid={}", vm.id, vm.name, vm.state, vm.pid),
        CocoonOk::Vms { vms } => {
            let ids: Vec<&str> = vms.iter().map(|v| v.id.as_str()).collect();
            format!("ok vms [{}]", ids.join(","))
        }
        CocoonOk::Snapshot { snapshot } if snapshot.description.is_empty() => format!(
            "ok snapshot {} hypervisor={} image={}",
            snapshot.name, snapshot.hypervisor, snapshot.image
        ),
        CocoonOk::Snapshot { snapshot } => format!(
            "ok snapshot {} hypervisor={} image={} description={}",
            snapshot.name,
            snapshot.hypervisor,
            snapshot.image,
            q(&snapshot.description)
        ),
        CocoonOk::StaleCreate { outcome } => format!("ok stale-create {}", outcome.as_str()),
    }
}

pub fn event(e: &Event) -> String {
    match e {
        Event::PodRelistBegin => "relist-begin".into(),
        Event::PodRelistItem { pod } => format!("relist-item {}", pod.key()),
        Event::PodRelistEnd => "relist-end".into(),
        Event::PodApplied { pod } => {
            let del = if pod.deletion_timestamp.is_some() {
                " deleting"
            } else {
                ""
            };
            format!("applied {}{del}", pod.key())
        }
        Event::PodDeleted { pod } => format!("deleted {}", pod.key()),
        Event::VmListed { vms } => {
            let ids: Vec<&str> = vms.iter().map(|v| v.id.as_str()).collect();
            format!("vm-listed [{}]", ids.join(","))
        }
        Event::VmListFailed { error } => format!("vm-list-failed {}", q(&error.message)),
        Event::VmStreamConnected => "stream-connected".into(),
        Event::VmStream { kind, vm } => {
            format!("stream {kind:?} {} {} {}", vm.id, vm.name, vm.state).to_string()
        }
        Event::VmStreamClosed { clean, .. } => format!("stream-closed clean={clean}"),
        Event::ProbeDone { key, seq, ok, .. } => {
            format!(
                "probe-done {key} p{seq} {}",
                if *ok { "ok" } else { "fail" }
            )
        }
        Event::DhcpLeasesChanged { upsert, remove } => {
            let u: Vec<String> = upsert
                .iter()
                .map(|l| format!("{}={}", l.mac, l.ip))
                .collect();
            let r: Vec<&str> = remove.iter().map(|m| m.as_str()).collect();
            format!("leases +[{}] -[{}]", u.join(","), r.join(","))
        }
        Event::TimerFired { timer: t } => format!("timer-fired {}", timer(t)),
        Event::CocoonDone { op, result } => match result {
            Ok(ok) => format!("cocoon-done #{op} {}", cocoon_ok(ok)),
            Err(e) => format!("cocoon-done #{op} err {:?} {}", e.kind, q(&e.message)),
        },
        Event::KubeDone { op, result } => match result {
            Ok(KubeOk::Done) => format!("kube-done #{op} ok"),
            Ok(KubeOk::Status { status: s, .. }) => format!("kube-done #{op} ok {}", status(s)),
            Err(e) => format!("kube-done #{op} err {:?}", e.kind),
        },
        Event::RegistryDone { op, result } => match result {
            Ok(RegistryOk::Inspected { snapshot: None }) => format!("registry-done #{op} absent"),
            Ok(RegistryOk::Inspected { snapshot: Some(r) })
                if r.kind != crate::event::ArtifactKind::Snapshot =>
            {
                format!("registry-done #{op} {:?}", r.kind)
            }
            Ok(RegistryOk::Inspected { snapshot: Some(r) }) => {
                let base = r.base_image.as_deref().unwrap_or("-");
                let from = r.from_node.as_deref().unwrap_or("-");
                let owner = match &r.owner {
                    Some(o) => format!(" owner={o}"),
                    None => String::new(),
                };
                format!(
                    "registry-done #{op} snapshot id={} base={base} from={from}{owner}",
                    r.snapshot_id
                )
            }
            Ok(RegistryOk::Pushed { digest }) => format!("registry-done #{op} pushed {digest}"),
            Ok(RegistryOk::Pulled) => format!("registry-done #{op} pulled"),
            Ok(RegistryOk::Deleted) => format!("registry-done #{op} deleted"),
            Ok(RegistryOk::Staged { dir }) => format!("registry-done #{op} staged {dir}"),
            Err(e) => format!("registry-done #{op} err {:?} {}", e.kind, q(&e.message)),
        },
        Event::DhcpLeaseReleased { op, result } => match result {
            Ok(()) => format!("lease-released #{op} ok"),
            Err(e) => format!("lease-released #{op} err {}", q(e)),
        },
        Event::SacDone { op, result } => match result {
            Ok(()) => format!("sac-done #{op} ok"),
            Err(e) => format!("sac-done #{op} err {:?} {}", e.stage, q(&e.message)),
        },
        Event::NodeRegistered => "node-registered".into(),
        Event::Namespace { name, uid } => format!("namespace {name} uid={uid}"),
        Event::HoldersRestored { holders, problem } => {
            let names: Vec<&str> = holders.iter().map(|(n, _)| n.as_str()).collect();
            match problem {
                None => format!("holders-restored [{}]", names.join(",")),
                Some(p) => format!("holders-restored [{}] problem={}", names.join(","), q(p)),
            }
        }
    }
}
