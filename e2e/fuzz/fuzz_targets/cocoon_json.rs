//! cocoon's stdout (`src/cocoon/json.rs`: a VM record, a VM list, a snapshot record,
//! a stale-create outcome) and one line of its event stream (`stream_line`, which
//! `src/sources/cocoon_stream.rs` feeds every line). The input is tried as each.
//!
//! Whatever decodes becomes an event the loop journals, so it must read back from the
//! journal's JSON unchanged; a VM that decodes alone decodes the same inside a list.

#![no_main]

use libfuzzer_sys::fuzz_target;
use reconcilers::event::{CocoonOk, Event};
use reconcilers::vm::{CocoonErrorKind, VmRecord};
use vk_cocoon::cocoon::json as cocoon_json;

fuzz_target!(|data: &[u8]| {
    // The shell reads cocoon's stdout lossily (`cocoon::CocoonCli::run`).
    let text = String::from_utf8_lossy(data);
    let text = text.as_ref();

    match cocoon_json::vm(text) {
        Ok(vm) => {
            check_record(&vm);
            journals(CocoonOk::Vm { vm: vm.clone() });
            if !vm.id.is_empty() {
                let listed = cocoon_json::vms(&format!("[{text}]")).expect("a VM is a list item");
                assert_eq!(listed, vec![vm]);
            }
        }
        Err(e) => assert_eq!(e.kind, CocoonErrorKind::BadOutput),
    }
    match cocoon_json::vms(text) {
        Ok(vms) => {
            for vm in &vms {
                assert!(!vm.id.is_empty(), "a listed VM without an id: {vm:?}");
                check_record(vm);
            }
            journals(CocoonOk::Vms { vms });
        }
        Err(e) => assert_eq!(e.kind, CocoonErrorKind::BadOutput),
    }
    match cocoon_json::snapshot(text) {
        Ok(snapshot) => journals(CocoonOk::Snapshot { snapshot }),
        Err(e) => assert_eq!(e.kind, CocoonErrorKind::BadOutput),
    }
    match cocoon_json::stale_create(text) {
        Ok(ok) => journals(ok),
        Err(e) => assert_eq!(e.kind, CocoonErrorKind::BadOutput),
    }
    for line in text.lines() {
        if let Ok((kind, vm)) = cocoon_json::stream_line(line) {
            check_record(&vm);
            round_trips(&Event::VmStream { kind, vm });
        }
    }
});

fn check_record(vm: &VmRecord) {
    if let Some(mac) = &vm.mac {
        assert!(
            !mac.is_empty() && *mac == mac.to_ascii_lowercase(),
            "{vm:?}"
        );
    }
    assert_ne!(vm.static_ip.as_deref(), Some(""));
    assert_ne!(vm.cow.as_deref(), Some(""));
    assert!(vm.taps.iter().all(|t| !t.is_empty()), "{vm:?}");
}

fn journals(ok: CocoonOk) {
    round_trips(&Event::CocoonDone {
        op: 1,
        result: Ok(ok),
    });
}

fn round_trips(event: &Event) {
    let text = serde_json::to_string(event).expect("an event serializes");
    let back: Event = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("the journal cannot read back {text}: {e}"));
    assert_eq!(&back, event);
}
