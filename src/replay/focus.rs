//! `--pod NS/NAME`: which events and actions concern one pod. Outcomes name only their op,
//! so the ops the pod's actions started are remembered until their outcome arrives.

use std::collections::BTreeSet;

use reconcilers::pod::PodKey;
use reconcilers::{Action, Event, OpId, State, Timer};

pub struct Focus {
    key: PodKey,
    text: String,
    /// From the pod's `vm.cocoonstack.io/name`: stream events can precede the VM's indexing.
    vm_name: Option<String>,
    ops: BTreeSet<OpId>,
}

pub(super) fn timer_key(t: &Timer) -> Option<&PodKey> {
    match t {
        Timer::CreateRetry { key, .. }
        | Timer::Recheck { key, .. }
        | Timer::IpWait { key, .. }
        | Timer::RenewNudge { key, .. }
        | Timer::PostCloneRetry { key, .. }
        | Timer::KubeRetry { key, .. }
        | Timer::DeleteRetry { key, .. }
        | Timer::EvictRetry { key, .. }
        | Timer::HibernateRetry { key, .. } => Some(key),
        Timer::StaleCreate { .. } | Timer::Sweep => None,
    }
}

impl Focus {
    pub fn new(key: PodKey) -> Self {
        let text = key.to_string();
        Self {
            key,
            text,
            vm_name: None,
            ops: BTreeSet::new(),
        }
    }

    /// Judged before the event is reduced, against the state it meets.
    pub fn event(&mut self, e: &Event, before: &State) -> bool {
        match e {
            Event::PodRelistItem { pod }
            | Event::PodApplied { pod }
            | Event::PodDeleted { pod } => {
                let mine = pod.key() == self.key;
                if mine {
                    if let Some(n) = pod.annotation(reconcilers::keys::VM_NAME) {
                        self.vm_name = Some(n.to_string());
                    }
                }
                mine
            }
            Event::ProbeDone { key, .. } => *key == self.key,
            Event::TimerFired {
                timer: Timer::StaleCreate { name, .. },
            } => self.vm_name.as_deref() == Some(name.as_str()),
            Event::TimerFired { timer } => timer_key(timer) == Some(&self.key),
            Event::CocoonDone { op, .. }
            | Event::KubeDone { op, .. }
            | Event::RegistryDone { op, .. } => self.ops.remove(op),
            Event::VmStream { vm, .. } => {
                before.vm_ids.get(&vm.id) == Some(&self.key)
                    || before.vm_names.get(&vm.name) == Some(&self.key)
                    || self.vm_name.as_deref() == Some(vm.name.as_str())
            }
            _ => false,
        }
    }

    pub fn action(&mut self, a: &Action) -> bool {
        let (key, op) = match a {
            Action::RunCocoon { op, key, .. } | Action::CallRegistry { op, key, .. } => {
                (key.as_ref(), Some(*op))
            }
            Action::PatchPod { op, key, .. } | Action::DeletePod { op, key, .. } => {
                (Some(key), Some(*op))
            }
            Action::RecordEvent { key, .. }
            | Action::RunProbe { key, .. }
            | Action::StopProbe { key } => (Some(key), None),
            Action::ArmTimer { timer, .. } => (timer_key(timer), None),
            Action::Log { message, .. } => return names(message, &self.text),
            _ => (None, None),
        };
        let mine = key == Some(&self.key);
        if let (true, Some(op)) = (mine, op) {
            self.ops.insert(op);
        }
        mine
    }
}

/// The core's log lines name a pod as `ns/name`; `default/web` must not match `default/web-2`.
fn names(message: &str, key: &str) -> bool {
    message.match_indices(key).any(|(i, _)| {
        let next = message[i + key.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_key_in_a_log_line_matches_whole() {
        assert!(super::names("pod default/web: rejected", "default/web"));
        assert!(super::names("pod default/web", "default/web"));
        assert!(!super::names("pod default/web-2: rejected", "default/web"));
    }
}
