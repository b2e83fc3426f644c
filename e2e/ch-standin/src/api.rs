//! The REST routes under `/api/v1/`, as cloud-hypervisor's HTTP front end maps them: an
//! unknown path is 404, a known one with the wrong method 400, a request that needs a body
//! and has none (or bad JSON) 400, success 204 or 200 with JSON, errors a JSON array of
//! messages.

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::vmm::{After, Answer, ApiError, Vmm};

pub struct Reply {
    pub status: u16,
    pub body: Option<Vec<u8>>,
    pub after: After,
}

const GET_ENDPOINTS: &[&str] = &["vmm.ping", "vm.info", "vm.counters"];
/// cloud-hypervisor's other endpoints: known (so a wrong method is 400), not simulated.
const UNSIMULATED: &[&str] = &[
    "vm.add-device",
    "vm.add-fs",
    "vm.add-pmem",
    "vm.add-vdpa",
    "vm.add-vsock",
    "vm.add-user-device",
    "vm.add-generic-vhost-user",
    "vm.coredump",
    "vm.nmi",
    "vm.reboot",
    "vm.receive-migration",
    "vm.resize",
    "vm.resize-disk",
    "vm.resize-zone",
    "vm.send-migration",
];

pub fn handle(vmm: &mut Vmm, method: &str, path: &str, body: &[u8]) -> Reply {
    let Some(endpoint) = path.strip_prefix("/api/v1/") else {
        return error(&ApiError {
            status: 404,
            messages: vec!["Not Found".into()],
        });
    };
    let is_get = GET_ENDPOINTS.contains(&endpoint);
    let wanted = if is_get { "GET" } else { "PUT" };
    let known = is_get || UNSIMULATED.contains(&endpoint) || PUT_ENDPOINTS.contains(&endpoint);
    if !known {
        return error(&ApiError {
            status: 404,
            messages: vec!["Not Found".into()],
        });
    }
    if method != wanted {
        return error(&ApiError {
            status: 400,
            messages: vec!["Bad Request".into()],
        });
    }
    match dispatch(vmm, endpoint, body) {
        Ok((answer, after)) => match answer {
            Some(v) => Reply {
                status: 200,
                body: Some(serde_json::to_vec(&v).unwrap_or_default()),
                after,
            },
            None => Reply {
                status: 204,
                body: None,
                after,
            },
        },
        Err(e) => error(&e),
    }
}

const PUT_ENDPOINTS: &[&str] = &[
    "vmm.shutdown",
    "vm.create",
    "vm.boot",
    "vm.delete",
    "vm.pause",
    "vm.resume",
    "vm.shutdown",
    "vm.power-button",
    "vm.snapshot",
    "vm.restore",
    "vm.add-disk",
    "vm.add-net",
    "vm.remove-device",
];

fn dispatch(
    vmm: &mut Vmm,
    endpoint: &str,
    body: &[u8],
) -> Result<(Option<Value>, After), ApiError> {
    let go = |a: Answer| a.map(|v| (v, After::Continue));
    match endpoint {
        "vmm.ping" => Ok((Some(vmm.ping()), After::Continue)),
        "vm.info" => go(vmm.info()),
        "vm.counters" => go(vmm.info().map(|_| Some(Value::Object(Default::default())))),
        "vmm.shutdown" => vmm.delete().map(|_| (None, After::Exit)),
        "vm.create" => go(vmm.create(parse::<Value>(body)?)),
        "vm.boot" => go(vmm.boot()),
        "vm.delete" => go(vmm.delete()),
        "vm.pause" => go(vmm.pause()),
        "vm.resume" => vmm.resume().map(|after| (None, after)),
        "vm.shutdown" => go(vmm.shutdown()),
        "vm.power-button" => vmm.power_button().map(|after| (None, after)),
        "vm.snapshot" => go(vmm.snapshot(parse(body)?)),
        "vm.restore" => go(vmm.restore(parse(body)?)),
        "vm.add-disk" => go(vmm.add_disk(parse_object(body)?)),
        "vm.add-net" => go(vmm.add_net(parse_object(body)?)),
        "vm.remove-device" => {
            #[derive(serde::Deserialize)]
            struct Remove {
                id: String,
            }
            go(vmm.remove_device(&parse::<Remove>(body)?.id))
        }
        other => Err(ApiError::new(
            500,
            &format!("{other} failed"),
            "not simulated by ch-standin",
        )),
    }
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError {
            status: 400,
            messages: vec!["Bad Request".into()],
        });
    }
    serde_json::from_slice(body).map_err(|e| ApiError {
        status: 400,
        messages: vec!["Failed to deserialize JSON".into(), e.to_string()],
    })
}

fn parse_object(body: &[u8]) -> Result<Value, ApiError> {
    let v: Value = parse(body)?;
    if !v.is_object() {
        return Err(ApiError {
            status: 400,
            messages: vec!["Failed to deserialize JSON".into()],
        });
    }
    Ok(v)
}

fn error(e: &ApiError) -> Reply {
    Reply {
        status: e.status,
        body: Some(serde_json::to_vec(&e.messages).unwrap_or_default()),
        after: After::Continue,
    }
}
