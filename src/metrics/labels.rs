//! The label values of the daemon's metrics, one enum per label. What the shell counts itself
//! takes one of these, never a string; the series that exist at 0 from the start
//! (`Metrics::zeroed`) are derived from each enum's `ALL`, so a new value gets its series with
//! no second list to update. The core's `Counter` carries its labels as strings, which
//! `Metrics::count` passes through unchanged. The strings are a contract with dashboards and
//! alerts.

macro_rules! label {
    ($(#[$doc:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $($variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }
    };
}

label! {
    /// `result` of the operations whose dashboards rate failures against successes.
    Outcome { Ok => "ok", Failed => "failed" }
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
    /// `kind` of `cocoon_vk_postclone_total`: a fix-up's kind, or the SAC dialog.
    PostCloneKind {
        Windows => "windows",
        LinuxFc => "linux_fc",
        LinuxStatic => "linux_static",
        Sac => "sac",
    }
}

label! {
    /// `reason` of `cocoon_vk_events_dropped_total` (F4).
    DropReason {
        LaneFull => "lane_full",
        Timeout => "timeout",
        Rejected => "rejected",
    }
}

label! {
    /// `kind` of `cocoon_vk_api_writes_total`: what a write to the Kubernetes API was for.
    ApiWrite {
        Pod => "pod",
        Delete => "delete",
        Event => "event",
    }
}

label! {
    /// `kind` of `cocoon_vk_action_queue_wait_seconds`: the slot an action waited for.
    ActionSlot {
        Cocoon => "cocoon",
        Kube => "kube",
        Registry => "registry",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_is_a_distinct_prometheus_label() {
        let all: Vec<&str> = [
            Outcome::ALL.iter().map(|v| v.as_str()).collect::<Vec<_>>(),
            HibernatePhase::ALL.iter().map(|v| v.as_str()).collect(),
            PostCloneKind::ALL.iter().map(|v| v.as_str()).collect(),
            DropReason::ALL.iter().map(|v| v.as_str()).collect(),
            ApiWrite::ALL.iter().map(|v| v.as_str()).collect(),
            ActionSlot::ALL.iter().map(|v| v.as_str()).collect(),
        ]
        .concat();
        for v in &all {
            assert!(
                !v.is_empty() && v.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{v}"
            );
        }
        assert_eq!(HibernatePhase::ALL.len(), 5);
    }
}
