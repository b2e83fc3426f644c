//! Injected failures, kept in `<root>/faults.json` so a test can set them with
//! `cocoon sim fault …` (or by writing the file) and every later invocation obeys.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::Env;
use crate::error::{Error, Result};
use crate::lock;

#[derive(Serialize, Deserialize, Default, Clone, Debug)]
pub struct VerbFault {
    #[serde(default)]
    pub fail_times: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub fail_message: String,
    #[serde(default)]
    pub delay_ms: u64,
    /// `None` = every call until cleared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_times: Option<u32>,
    #[serde(default)]
    pub garbage_times: u32,
}

#[derive(Serialize, Deserialize, Default, Clone, Debug)]
pub struct ExecScript {
    #[serde(default)]
    pub exit_code: i32,
    #[serde(default)]
    pub stdout: String,
    #[serde(default)]
    pub stderr: String,
    /// `stdout` is printed again and again until the reader goes away.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flood: bool,
}

#[derive(Serialize, Deserialize, Default, Clone, Debug)]
pub struct Faults {
    #[serde(default)]
    pub verbs: BTreeMap<String, VerbFault>,
    /// Bumped by `sim fault kill-streams`; a stream that sees it change exits non-zero.
    #[serde(default)]
    pub stream_generation: u64,
    /// Scripted results for the next `vm exec` calls, per VM ID.
    #[serde(default)]
    pub exec: BTreeMap<String, Vec<ExecScript>>,
    /// Post-clone fixup failures, per VM ID or `*` for every VM.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fixup: BTreeMap<String, FixupFault>,
    /// SAC console misbehaviour, per VM ID or `*` for every VM.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sac: BTreeMap<String, SacFault>,
}

#[derive(Serialize, Deserialize, Default, Clone, Debug)]
pub struct FixupFault {
    /// How many attempts per VM fail; `None` = every attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u32>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Attempts already failed, per VM ID.
    #[serde(default)]
    pub used: BTreeMap<String, u32>,
}

#[derive(Serialize, Deserialize, Default, Clone, Copy, Debug, PartialEq)]
pub struct SacFault {
    #[serde(default)]
    pub no_socket: bool,
    #[serde(default)]
    pub no_prompt: bool,
    #[serde(default)]
    pub refuse_set: bool,
}

#[derive(Default, Debug, Clone, Copy)]
pub struct Effects {
    pub delay_ms: u64,
    pub garbage: bool,
}

impl Effects {
    pub fn sleep(&self) {
        if self.delay_ms > 0 {
            std::thread::sleep(Duration::from_millis(self.delay_ms));
        }
    }
}

/// "vm.run", "vm run" and "VM  run" all name the same verb.
pub fn normalize_verb(v: &str) -> String {
    v.split(|c: char| c.is_whitespace() || c == '.')
        .filter(|s| !s.is_empty())
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

fn paths(env: &Env) -> (PathBuf, PathBuf) {
    (env.root.join("faults.json"), env.root.join(".faults.lock"))
}

pub fn read(env: &Env) -> Faults {
    let (file, _) = paths(env);
    std::fs::read(&file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

pub fn update<T>(env: &Env, f: impl FnOnce(&mut Faults) -> T) -> Result<T> {
    let (file, lock_path) = paths(env);
    let _l = lock::exclusive(&lock_path)?;
    let mut faults = read(env);
    let out = f(&mut faults);
    faults
        .verbs
        .retain(|_, v| v.fail_times > 0 || v.delay_ms > 0 || v.garbage_times > 0);
    lock::write_atomic(&file, &serde_json::to_vec_pretty(&faults)?)?;
    Ok(out)
}

/// Consumes this call's share of the verb's faults. A pending failure wins over the rest.
pub fn on_verb(env: &Env, verb: &str) -> Result<Effects> {
    let verb = normalize_verb(verb);
    // Cheap unlocked peek first: the event stream asks every 200 ms.
    if !read(env).verbs.contains_key(&verb) {
        return Ok(Effects::default());
    }
    let outcome = update(env, |f| {
        let Some(v) = f.verbs.get_mut(&verb) else {
            return Ok(Effects::default());
        };
        if v.fail_times > 0 {
            v.fail_times -= 1;
            let msg = if v.fail_message.is_empty() {
                format!("injected failure ({verb})")
            } else {
                v.fail_message.clone()
            };
            return Err(msg);
        }
        let mut fx = Effects::default();
        if v.delay_ms > 0 {
            fx.delay_ms = v.delay_ms;
            if let Some(n) = v.delay_times.as_mut() {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    v.delay_ms = 0;
                    v.delay_times = None;
                }
            }
        }
        if v.garbage_times > 0 {
            v.garbage_times -= 1;
            fx.garbage = true;
        }
        Ok(fx)
    })?;
    outcome.map_err(Error::Msg)
}

pub fn take_exec(env: &Env, vm_id: &str) -> Result<Option<ExecScript>> {
    if !read(env).exec.contains_key(vm_id) {
        return Ok(None);
    }
    update(env, |f| {
        let q = f.exec.get_mut(vm_id)?;
        let s = if q.is_empty() {
            None
        } else {
            Some(q.remove(0))
        };
        if q.is_empty() {
            f.exec.remove(vm_id);
        }
        s
    })
}

/// The fixup failure owed to this attempt, if any: the VM's own entry first, then `*`.
pub fn take_fixup_failure(env: &Env, vm_id: &str) -> Result<Option<String>> {
    if read(env).fixup.is_empty() {
        return Ok(None);
    }
    update(env, |f| {
        let key = if f.fixup.contains_key(vm_id) {
            vm_id
        } else {
            "*"
        };
        let ff = f.fixup.get_mut(key)?;
        let used = ff.used.entry(vm_id.to_string()).or_default();
        if ff.times.is_some_and(|t| *used >= t) {
            return None;
        }
        *used += 1;
        Some(if ff.message.is_empty() {
            format!("injected fixup failure (attempt {used})")
        } else {
            ff.message.clone()
        })
    })
}

pub fn sac_fault(env: &Env, vm_id: &str) -> SacFault {
    let f = read(env);
    f.sac
        .get(vm_id)
        .or_else(|| f.sac.get("*"))
        .copied()
        .unwrap_or_default()
}

/// Truncated JSON that no decoder accepts, for the "garbage output" fault.
pub const GARBAGE: &str = "{\"id\": \"GARBAGE\", \"state\": [\u{1}\n";
