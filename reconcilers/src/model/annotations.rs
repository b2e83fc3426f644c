//! Runtime and lifecycle annotations (ANN-3, ANN-4), kept declaratively: what vk
//! wants on the pod is derived from state and patched when the pod differs, so a lost write
//! is repaired by the next event instead of by bookkeeping.

use std::collections::BTreeMap;

use crate::entry::PostClone;
use crate::keys;
use crate::phase::{HibernateStep, Phase};
use crate::pod::PodKey;
use crate::state::{PodEntry, State};

const LIFECYCLE_TRIPLE: [&str; 3] = [
    keys::LIFECYCLE_STATE,
    keys::LIFECYCLE_GENERATION,
    keys::LIFECYCLE_MESSAGE,
];

pub fn desired(s: &State, key: &PodKey) -> BTreeMap<String, Option<String>> {
    let mut buf = Decimal::default();
    match s.pods.get(key) {
        Some(e) => Wanted::of(e, &mut buf)
            .entries()
            .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
            .collect(),
        None => BTreeMap::new(),
    }
}

/// What vk wants on the pod, borrowed from its entry. It is compared with the pod after
/// every event that touches it and almost always already holds, so that comparison
/// allocates nothing; only a patch that goes out is built as a map.
struct Wanted<'a> {
    /// `None`: no opinion; `Some(None)`: the key must go; `Some(Some(v))`: it must be `v`.
    vm_id: Option<Option<&'a str>>,
    vm_ip: Option<Option<&'a str>>,
    /// C14/R11: a managed macOS guest's VNC port, while it serves one.
    vnc_port: Option<Option<&'a str>>,
    /// State, generation and message (`None` when empty: L2 writes it as null).
    lifecycle: Option<(&'static str, &'a str, Option<&'a str>)>,
    /// `post-clone-state`, and with `failed` its hint and errors (C13).
    post_clone: Option<Option<&'a str>>,
    post_clone_failure: Option<(Option<&'a str>, &'a str)>,
}

impl<'a> Wanted<'a> {
    fn of(e: &'a PodEntry, generation: &'a mut Decimal) -> Self {
        let vm = e.vm().filter(|v| v.managed());
        // U3 step 5, U5 step 2: while a VM is handed to the registry and until its successor
        // runs, the pod must not name one (the operator's wake gate reads `id`).
        let withdrawn = match &e.phase {
            Phase::Hibernating(h) => matches!(h.step, HibernateStep::Remove),
            Phase::Hibernated => true,
            // A pod being brought up, or whose bring-up failed, has no VM: an `id` or `ip` it
            // still carries names one that is gone (a VM lost while vk was down, a failed
            // attempt). Unmanaged pods' keys are the operator's and stay as written.
            Phase::Creating(_) | Phase::Failed(_) => e.managed(),
            Phase::Waiting
            | Phase::Running(_)
            | Phase::Evicting(_)
            | Phase::Deleting(_)
            | Phase::Terminal(_)
            | Phase::Gone(_) => false,
        };
        let lifecycle = e.lifecycle().map(|(state, stamp, message)| {
            (
                state.as_str(),
                generation.format(stamp),
                message.filter(|m| !m.is_empty()),
            )
        });
        // C13: `failed` is sticky while the VM lives; a withdrawal ends that VM, and the next
        // one starts without a state.
        let failed_on_pod = e.pod.annotation(keys::POST_CLONE_STATE) == Some("failed");
        let (post_clone, post_clone_failure) = match (withdrawn, failed_on_pod, e.post_clone()) {
            (true, _, _) => (Some(None), None),
            (false, true, _) | (false, false, None) => (None, None),
            (false, false, Some(PostClone::Running)) => (Some(Some("running")), None),
            (false, false, Some(PostClone::Done)) => (Some(Some("done")), None),
            (false, false, Some(PostClone::Failed { hint, errors })) => {
                (Some(Some("failed")), Some((hint, errors)))
            }
        };
        Wanted {
            post_clone,
            post_clone_failure,
            vm_id: match withdrawn {
                true => Some(None),
                false => vm.map(|v| Some(v.record.id.as_str())),
            },
            vm_ip: match withdrawn {
                true => Some(None),
                false => vm.and_then(|v| v.ip.as_deref()).map(Some),
            },
            vnc_port: match crate::macos::is_macos(e) {
                true => vm.map(|v| v.record.vnc.and_then(crate::model::macos::port_str)),
                false => None,
            },
            lifecycle,
        }
    }

    /// Every wanted key with its value (`None`: the key must be absent).
    fn entries(&self) -> impl Iterator<Item = (&'static str, Option<&'a str>)> + '_ {
        let vm = [
            self.vm_id.map(|id| (keys::VM_ID, id)),
            self.vm_ip.map(|ip| (keys::VM_IP, ip)),
            self.vnc_port.map(|port| (keys::VNC_PORT, port)),
        ];
        let lifecycle = self.lifecycle.map(|(state, generation, message)| {
            [
                (keys::LIFECYCLE_STATE, Some(state)),
                (keys::LIFECYCLE_GENERATION, Some(generation)),
                (keys::LIFECYCLE_MESSAGE, message),
            ]
        });
        let post_clone = [
            self.post_clone.map(|v| (keys::POST_CLONE_STATE, v)),
            self.post_clone_failure
                .and_then(|(hint, _)| hint)
                .map(|h| (keys::POST_CLONE_HINT, Some(h))),
            self.post_clone_failure
                .map(|(_, errors)| (keys::POST_CLONE_ERRORS, Some(errors))),
        ];
        vm.into_iter()
            .flatten()
            .chain(post_clone.into_iter().flatten())
            .chain(lifecycle.into_iter().flatten())
    }
}

/// An i64 in decimal, on the stack.
#[derive(Default)]
struct Decimal {
    buf: [u8; 20],
}

impl Decimal {
    fn format(&mut self, n: i64) -> &str {
        let mut at = self.buf.len();
        let mut rest = n.unsigned_abs();
        loop {
            at -= 1;
            self.buf[at] = b'0' + (rest % 10) as u8;
            rest /= 10;
            if rest == 0 {
                break;
            }
        }
        if n < 0 {
            at -= 1;
            self.buf[at] = b'-';
        }
        std::str::from_utf8(&self.buf[at..]).expect("ASCII")
    }
}

/// The annotations that differ from what the server holds (empty when all hold).
pub(crate) fn diff(e: &PodEntry) -> BTreeMap<String, Option<String>> {
    let mut generation = Decimal::default();
    let want = Wanted::of(e, &mut generation);
    let differs = |(k, v): &(&str, Option<&str>)| e.pod.annotation(k) != *v;
    let mut diff = BTreeMap::new();
    if !want.entries().any(|kv| differs(&kv)) {
        return diff;
    }
    let mut triple = false;
    for (k, v) in want.entries().filter(differs) {
        triple |= LIFECYCLE_TRIPLE.contains(&k);
        diff.insert(k.to_string(), v.map(str::to_string));
    }
    // L2: the lifecycle triple is written as one unit, message null when empty, even when
    // only one of the three differs from what the server holds.
    if triple {
        for (k, v) in want.entries().filter(|(k, _)| LIFECYCLE_TRIPLE.contains(k)) {
            diff.insert(k.to_string(), v.map(str::to_string));
        }
    }
    diff
}

#[cfg(test)]
mod tests {
    use super::Decimal;

    #[test]
    fn decimal_is_to_string() {
        for n in [0, 1, -1, 9, 10, 42, -1000, i64::MAX, i64::MIN] {
            assert_eq!(Decimal::default().format(n), n.to_string());
        }
    }
}
