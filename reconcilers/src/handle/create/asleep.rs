//! T1, T6: a pod that asks to be hibernated without a VM here holds its VM name from then on,
//! so it takes the name only when the name's hibernated state is not another namespace's:
//! with a registry, `<vm>:hibernate` is inspected first. Otherwise a pod of another namespace
//! could wait for the owner of a hibernated VM to delete and remake its pod, take the name in
//! between, and have the owner's new pod refused.

use super::failure::fail_as;
use crate::action::RegistryCall;
use crate::event::{RegistryError, RegistryOk};
use crate::owner::Record;
use crate::phase::{CreateStep, Retry};
use crate::pod::PodKey;
use crate::spec::VmSpec;
use crate::state::{RegistryOwner, State};

/// Asks the registry whose `<vm>:hibernate` is before the pod is taken in as hibernated; with
/// no registry there is nothing to ask and it is taken in at once.
pub(crate) fn begin(s: &mut State, key: &PodKey, spec: &VmSpec) {
    if s.config.registry.is_none() {
        return crate::intake::enter_hibernated(s, key);
    }
    let call = RegistryCall::Inspect {
        name: spec.vm_name.clone(),
        tag: "hibernate".into(),
    };
    let owner = RegistryOwner::Pod { key: key.clone() };
    let op = s.call_registry(owner, Some(key.clone()), call);
    super::enter(s, key, CreateStep::CheckHibernated, op);
}

/// The registry's answer: the pod is hibernated under the name unless another namespace's
/// hibernated state holds it; a registry that cannot answer gets the pod retried, never
/// taken in blind.
pub(super) fn evidence(
    s: &mut State,
    key: &PodKey,
    spec: &VmSpec,
    result: Result<RegistryOk, RegistryError>,
) {
    let name = &spec.vm_name;
    let refused = match &result {
        Ok(RegistryOk::Inspected { snapshot: Some(r) }) => {
            Record::from_annotation(r.owner.as_deref(), name, s.config.bases())
                .usable_by(s.tenant(key), &format!("VM name {name:?}"))
                .err()
        }
        Ok(RegistryOk::Inspected { snapshot: None }) => None,
        Ok(other) => Some(format!("the registry client answered {other:?}")),
        Err(err) => Some(format!("cannot tell whose it is: {}", err.message)),
    };
    match refused {
        // The hibernate key may have been withdrawn meanwhile: then it is a wake (U5).
        None if !spec.hibernate => {
            crate::intake::enter_hibernated(s, key);
            super::wake(s, key)
        }
        None => crate::intake::enter_hibernated(s, key),
        Some(why) => {
            let msg = format!(
                "{name}:hibernate: {why}, so this pod is not taken in as hibernated under that name"
            );
            fail_as(s, key, Some("HibernateEvidenceFailed"), msg, Retry::Timer)
        }
    }
}
