//! How long each cocoon verb may run before it is killed (F5). One figure for every verb was
//! either too short for a multi-gigabyte image pull or far too long for an inspect that hangs:
//! a hung read held its pod's only operation slot (INV-3) for five minutes.

use std::time::Duration;

/// Per-verb limits, by the class of work a verb does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Reads of cocoon's own records: `vm inspect`, `vm list`, `vm logs`,
    /// `vm reconcile-stale-create`, `snapshot inspect`, `image inspect`.
    pub read: Duration,
    /// Changes to one VM or snapshot that move no guest data: `vm start`, `vm rm`, `vm net`,
    /// `snapshot rm`.
    pub change: Duration,
    /// Work that writes guest memory or disks: `vm run`, `vm clone`, `snapshot save`.
    pub guest_data: Duration,
    /// A command in the guest (`vm exec`): the hibernate's lease release has 20 s (U3), and
    /// no guest command vk sends runs longer.
    pub guest_command: Duration,
    /// Images the host fetches for a run-mode pod, `image pull` and `image import`
    /// (`VK_IMAGE_PULL_TIMEOUT`): a tenant names the image, so a slow source holds a slot of
    /// the shared cocoon lane until this ends (T12, T13).
    pub image: Duration,
    /// Snapshots moving through cocoon: `snapshot import`, `snapshot export`.
    pub transfer: Duration,
    /// Any verb not named above.
    pub other: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            read: Duration::from_secs(30),
            change: Duration::from_secs(60),
            guest_data: Duration::from_secs(10 * 60),
            guest_command: Duration::from_secs(20),
            image: IMAGE_PULL,
            transfer: Duration::from_secs(30 * 60),
            other: Duration::from_secs(5 * 60),
        }
    }
}

/// `VK_IMAGE_PULL_TIMEOUT`'s default: a multi-gigabyte image on a slow link.
pub const IMAGE_PULL: Duration = Duration::from_secs(30 * 60);

impl Timeouts {
    /// Every verb gets `d` (tests).
    pub fn all(d: Duration) -> Self {
        Self {
            read: d,
            change: d,
            guest_data: d,
            guest_command: d,
            image: d,
            transfer: d,
            other: d,
        }
    }

    /// The limit for `cocoon <argv…>`, chosen by its first two words (noun and verb).
    pub fn for_argv<S: AsRef<str>>(&self, argv: &[S]) -> Duration {
        let word = |i: usize| argv.get(i).map(AsRef::as_ref).unwrap_or("");
        match (word(0), word(1)) {
            ("vm", "inspect" | "list" | "logs" | "reconcile-stale-create")
            | ("snapshot", "inspect")
            | ("image", "inspect") => self.read,
            ("vm", "start" | "rm" | "net") | ("snapshot", "rm") => self.change,
            ("vm", "run" | "clone") | ("snapshot", "save") => self.guest_data,
            ("vm", "exec") => self.guest_command,
            ("image", "pull" | "import") => self.image,
            ("snapshot", "import" | "export") => self.transfer,
            _ => self.other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reconcilers::cocoon::{CloneSource, CocoonCmd};
    use reconcilers::spec::CpuPolicy;

    const POLICY: CpuPolicy = CpuPolicy {
        weight: 100,
        quota_us: None,
        period_us: None,
    };

    fn secs(argv: &[&str]) -> u64 {
        Timeouts::default().for_argv(argv).as_secs()
    }

    /// The table of F5, verb by verb.
    #[test]
    fn each_verb_has_the_limit_of_its_class() {
        for (argv, want) in [
            (&["vm", "inspect", "x"][..], 30),
            (&["vm", "list", "-o", "json"], 30),
            (&["vm", "logs", "--tail", "5", "x"], 30),
            (&["vm", "reconcile-stale-create", "x", "-o", "json"], 30),
            (&["snapshot", "inspect", "x"], 30),
            (&["image", "inspect", "x"], 30),
            (&["vm", "start", "x"], 60),
            (&["vm", "rm", "--force", "x"], 60),
            (&["vm", "net", "--nics", "2", "x"], 60),
            (&["snapshot", "rm", "--", "x"], 60),
            (&["vm", "run", "--output", "json", "img"], 600),
            (&["vm", "clone", "--output", "json", "snap"], 600),
            (&["snapshot", "save", "--name", "n", "x"], 600),
            (&["image", "pull", "img"], 1800),
            (&["image", "import", "--", "img"], 1800),
            (&["snapshot", "import", "--name", "n"], 1800),
            (&["snapshot", "export", "-o", "-", "--", "n"], 1800),
            (&["vm", "exec", "x", "--", "true"], 20),
            (&[], 300),
        ] {
            assert_eq!(secs(argv), want, "cocoon {}", argv.join(" "));
        }
        // VK_IMAGE_PULL_TIMEOUT moves the image fetches alone.
        let t = Timeouts {
            image: Duration::from_secs(120),
            ..Timeouts::default()
        };
        assert_eq!(t.for_argv(&["image", "pull", "img"]).as_secs(), 120);
        assert_eq!(t.for_argv(&["image", "import", "--", "img"]).as_secs(), 120);
        assert_eq!(
            t.for_argv(&["snapshot", "import", "--name", "n"]).as_secs(),
            1800
        );
    }

    /// Every command the core can ask for is classified by the argv it really produces, so a
    /// change of argv shape cannot silently move a verb to the fallback.
    #[test]
    fn the_cores_commands_are_never_left_to_the_fallback() {
        let cmds = [
            CocoonCmd::ImagePull {
                image: "i".into(),
                force: true,
            },
            CocoonCmd::VmRun {
                name: "n".into(),
                image: "i".into(),
                cpu: Some(2),
                cpu_policy: Some(POLICY),
                memory: None,
                storage: None,
                network: None,
                windows: false,
                fc: false,
                no_direct_io: false,
            },
            CocoonCmd::VmClone {
                name: "n".into(),
                source: CloneSource::Snapshot("s".into()),
                network: None,
                no_direct_io: false,
                pull: true,
                restore_mode: None,
                on_demand: false,
                cpu_policy: Some(POLICY),
                nics: Some(1),
            },
            CocoonCmd::VmInspect { vm: "v".into() },
            CocoonCmd::VmList,
            CocoonCmd::VmRm { id: "v".into() },
            CocoonCmd::VmStart { id: "v".into() },
            CocoonCmd::VmExec {
                id: "v".into(),
                argv: vec!["ipconfig".into(), "/renew".into()],
            },
            CocoonCmd::VmNet {
                id: "v".into(),
                nics: 0,
            },
            CocoonCmd::SnapshotInspect { name: "s".into() },
            CocoonCmd::SnapshotRm { name: "s".into() },
            CocoonCmd::SnapshotSave {
                name: "s".into(),
                vm: "v".into(),
                description: "vk-cocoon owner=ns/p".into(),
            },
            CocoonCmd::ReconcileStaleCreate { id: "v".into() },
        ];
        let t = Timeouts::default();
        for cmd in cmds {
            let argv = cmd.argv();
            assert_ne!(t.for_argv(&argv), t.other, "cocoon {}", argv.join(" "));
        }
    }
}
