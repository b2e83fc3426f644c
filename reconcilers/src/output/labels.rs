//! The label values of the counters the core moves (M3), one enum per vocabulary. Each value's
//! text is a contract twice over: with the dashboards and alerts that select on it, and with
//! the journal, which stores a `Counter` as JSON with these very strings (`serde(rename)`), so
//! an old journal replays to the same actions. `ALL` lists every value, from which the shell
//! creates the series that exist at 0 before anything happened.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::event::StaleOutcome;
use crate::phase::FixupKind;

macro_rules! label {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        pub enum $name {
            $($(#[$vdoc])* #[serde(rename = $text)] $variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

label! {
    /// `result` of the operations whose dashboards rate failures against successes.
    Outcome { Ok => "ok", Failed => "failed" }
}

label! {
    /// `op` of `cocoon_vk_pod_lifecycle_total`: what the outcome was for.
    LifecycleOp {
        Create => "create",
        /// A wake: the pod's update that asked for its VM back.
        Wake => "wake",
        Update => "update",
        Delete => "delete",
    }
}

label! {
    /// `result` of `cocoon_vk_pod_lifecycle_total`: `skipped` when there was nothing to do.
    LifecycleResult { Ok => "ok", Failed => "failed", Skipped => "skipped" }
}

label! {
    /// `reason` of `cocoon_vk_pod_lifecycle_total`; empty for the plain case of an op.
    LifecycleReason {
        None => "",
        MissingVmName => "missing_vmname",
        InvalidVmName => "invalid_vmname",
        SnapshotCpuClassMismatch => "snapshot_cpu_class_mismatch",
        InvalidSpec => "invalid_spec",
        BringUp => "bring_up",
        Adopted => "adopted",
        Unmanaged => "unmanaged",
        Hibernate => "hibernate",
        Snapshot => "snapshot",
        VmRm => "vm_rm",
        NoVm => "no_vm",
        SeatRelease => "seat_release",
        /// D10: deleted by an eviction the tenant did not ask for; the VM is kept.
        Evicted => "evicted",
        Noop => "noop",
    }
}

label! {
    /// `outcome` of `cocoon_vk_stale_create_reconcile_total`: the verb's answer (hyphenated as
    /// cocoon prints it), or `error` when there was none to read.
    StaleCreateOutcome {
        Collected => "collected",
        Busy => "busy",
        NotCreating => "not-creating",
        NotFound => "not-found",
        Error => "error",
    }
}

label! {
    /// `result` of `cocoon_vk_wake_ip_wait_total` (C16).
    IpWaitResult { Ok => "ok", Timeout => "timeout" }
}

label! {
    /// `result` of `cocoon_vk_snapshot_verify_total`: the local snapshot is the tag's, is not,
    /// or could not be compared.
    VerifyResult { Ok => "ok", Stale => "stale", Error => "error" }
}

label! {
    /// `result` of `cocoon_vk_lease_release_total` (D6).
    LeaseReleaseResult { Ok => "ok", Error => "error" }
}

label! {
    /// `phase` of `cocoon_vk_hibernate_total`: the hibernate steps the core counts.
    HibernatePhase {
        DhcpRelease => "dhcp_release",
        Netresize => "netresize",
        Snapshot => "snapshot",
        Push => "push",
        Remove => "remove",
    }
}

label! {
    /// `kind` of `cocoon_vk_postclone_total`: a fix-up's kind, or the SAC dialog (C13, C15).
    PostCloneKind {
        Windows => "windows",
        LinuxFc => "linux_fc",
        LinuxStatic => "linux_static",
        Sac => "sac",
    }
}

label! {
    /// `verdict` of `cocoon_vk_hibernate_evidence_total`.
    EvidenceVerdict {
        Restored => "restored",
        ImageConflict => "image_conflict",
        SourceConflict => "source_conflict",
        Unavailable => "unavailable",
        Predates => "predates_pod",
    }
}

label! {
    /// `op` of `cocoon_vk_startup_resume_total` (B9): the owed work re-dispatched.
    ResumeOp {
        Hibernate => "hibernate",
        PostClone => "post_clone",
        ReadyWait => "ready_wait",
        ClassifyDropNic => "classify_drop_nic",
    }
}

impl From<FixupKind> for PostCloneKind {
    fn from(kind: FixupKind) -> Self {
        match kind {
            FixupKind::Windows => PostCloneKind::Windows,
            FixupKind::LinuxFc => PostCloneKind::LinuxFc,
            FixupKind::LinuxStatic => PostCloneKind::LinuxStatic,
        }
    }
}

impl From<StaleOutcome> for StaleCreateOutcome {
    fn from(outcome: StaleOutcome) -> Self {
        match outcome {
            StaleOutcome::Collected => StaleCreateOutcome::Collected,
            StaleOutcome::Busy => StaleCreateOutcome::Busy,
            StaleOutcome::NotCreating => StaleCreateOutcome::NotCreating,
            StaleOutcome::NotFound => StaleCreateOutcome::NotFound,
        }
    }
}

impl From<bool> for Outcome {
    fn from(ok: bool) -> Self {
        if ok {
            Outcome::Ok
        } else {
            Outcome::Failed
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::action::{CountHistogram, Counter};

    #[test]
    fn each_value_serializes_as_its_label_text() {
        fn check<T: Serialize + for<'a> Deserialize<'a> + PartialEq + fmt::Debug + Copy>(
            all: &[T],
            text: fn(T) -> &'static str,
        ) {
            for v in all {
                let json = serde_json::to_string(v).unwrap();
                assert_eq!(json, format!("{:?}", text(*v)));
                assert_eq!(serde_json::from_str::<T>(&json).unwrap(), *v);
            }
        }
        check(Outcome::ALL, Outcome::as_str);
        check(LifecycleOp::ALL, LifecycleOp::as_str);
        check(LifecycleResult::ALL, LifecycleResult::as_str);
        check(LifecycleReason::ALL, LifecycleReason::as_str);
        check(StaleCreateOutcome::ALL, StaleCreateOutcome::as_str);
        check(IpWaitResult::ALL, IpWaitResult::as_str);
        check(VerifyResult::ALL, VerifyResult::as_str);
        check(LeaseReleaseResult::ALL, LeaseReleaseResult::as_str);
        check(HibernatePhase::ALL, HibernatePhase::as_str);
        check(PostCloneKind::ALL, PostCloneKind::as_str);
        check(EvidenceVerdict::ALL, EvidenceVerdict::as_str);
        check(ResumeOp::ALL, ResumeOp::as_str);
    }

    #[test]
    fn the_names_of_the_neighbouring_enums_agree() {
        for k in [
            FixupKind::Windows,
            FixupKind::LinuxFc,
            FixupKind::LinuxStatic,
        ] {
            assert_eq!(PostCloneKind::from(k).as_str(), k.as_str());
        }
        for o in [
            StaleOutcome::Collected,
            StaleOutcome::Busy,
            StaleOutcome::NotCreating,
            StaleOutcome::NotFound,
        ] {
            assert_eq!(StaleCreateOutcome::from(o).as_str(), o.as_str());
        }
    }

    /// Journal lines written when the labels were plain strings decode to typed counters and
    /// encode back to the same bytes, so a recorded journal replays unchanged.
    #[test]
    fn journaled_counters_round_trip_byte_for_byte() {
        let lines = [
            // The counters `packaging/sample/demo.journal` holds.
            r#"{"name":"pod_lifecycle","op":"create","result":"ok","reason":""}"#,
            r#"{"name":"pod_lifecycle","op":"delete","result":"ok","reason":""}"#,
            r#"{"name":"snapshot_pull","result":"ok"}"#,
            r#"{"name":"wake_ip_wait","result":"ok"}"#,
            // And one of every other kind of label.
            r#"{"name":"pod_lifecycle","op":"delete","result":"skipped","reason":"seat_release"}"#,
            r#"{"name":"pod_lifecycle","op":"create","result":"failed","reason":"missing_vmname"}"#,
            r#"{"name":"stale_create_reconcile","outcome":"not-creating"}"#,
            r#"{"name":"stale_create_reconcile","outcome":"not-found"}"#,
            r#"{"name":"wake_ip_wait","result":"timeout"}"#,
            r#"{"name":"snapshot_verify","result":"stale"}"#,
            r#"{"name":"lease_release","result":"error"}"#,
            r#"{"name":"hibernate","phase":"netresize","result":"failed"}"#,
            r#"{"name":"hibernate_evidence","verdict":"image_conflict"}"#,
            r#"{"name":"startup_resume","op":"classify_drop_nic"}"#,
            r#"{"name":"post_clone","kind":"linux_fc","result":"ok"}"#,
            r#"{"name":"orphan_vm"}"#,
        ];
        for line in lines {
            let c: Counter = serde_json::from_str(line).unwrap();
            assert_eq!(serde_json::to_string(&c).unwrap(), line);
        }
        let h = r#"{"name":"post_clone_retry_attempts","result":"failed"}"#;
        let c: CountHistogram = serde_json::from_str(h).unwrap();
        assert_eq!(serde_json::to_string(&c).unwrap(), h);
        assert!(serde_json::from_str::<Counter>(r#"{"name":"wake","result":"maybe"}"#).is_err());
    }
}
