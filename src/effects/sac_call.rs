//! `Action::RunSac` in the shell: finds the VM's serial console and runs the SAC dialog.
//! Only an id that passes the VM-id rule becomes part of the path, so a pod can only ever
//! reach its own VM's console.

use std::net::Ipv4Addr;
use std::path::Path;

use reconcilers::action::SacNic;
use reconcilers::event::{SacError, SacStage};
use reconcilers::names::valid_vm_id;

use super::sac;

/// C15: `<COCOON_ROOT_DIR>/run/cloudhypervisor/<id>/console.sock`.
pub async fn run(
    root: &Path,
    vm_id: &str,
    nic_count: u32,
    nics: &[SacNic],
    cap: &crate::caps::CapCount,
) -> Result<(), SacError> {
    let fail = |stage, message: String| SacError { stage, message };
    if !valid_vm_id(vm_id) {
        return Err(fail(
            SacStage::Dial,
            format!("VM id {vm_id:?} is not a cocoon VM id"),
        ));
    }
    let socket = root
        .join("run")
        .join("cloudhypervisor")
        .join(vm_id)
        .join("console.sock");
    let mut set = Vec::with_capacity(nics.len());
    for n in nics {
        let addr = |what: &str, text: &str| {
            text.parse::<Ipv4Addr>().map_err(|_| {
                fail(
                    SacStage::Set,
                    format!("NIC {}: {what} {text:?} is not an IPv4 address", n.position),
                )
            })
        };
        set.push(sac::SacNic {
            position: n.position as usize,
            ip: addr("address", &n.ip)?,
            mask: addr("mask", &n.mask)?,
            gateway: addr("gateway", &n.gateway)?,
        });
    }
    sac::set_static_ips_capped(
        &socket,
        nic_count as usize,
        &set,
        &sac::SacTimeouts::default(),
        cap,
    )
    .await
    .map_err(|f| SacError {
        stage: match f.stage {
            sac::SacStage::Dial => SacStage::Dial,
            sac::SacStage::Enum => SacStage::Enum,
            sac::SacStage::Set => SacStage::Set,
            sac::SacStage::Verify => SacStage::Verify,
        },
        message: f.message,
    })
}
