//! `cocoon sim …`: fault injection, cleanup, seeding and introspection for tests.

use serde::Serialize;

use crate::cli::{FaultCmd, LeaseCmd, SimCmd};
use crate::config::Env;
use crate::error::{fail, Result};
use crate::faults::{self, normalize_verb, ExecScript};
use crate::guest;
use crate::leases;
use crate::model::StoredVm;
use crate::output;
use crate::store::Store;
use crate::timefmt::now_ns;
use crate::vm_ops::update_vm;

pub fn dispatch(env: &Env, cmd: SimCmd) -> Result<()> {
    match cmd {
        SimCmd::Fault(f) => fault(env, f),
        SimCmd::Cleanup { all_leftovers } => {
            crate::cleanup::cleanup(env, all_leftovers)?;
            // cocoon-macos guests of this root live under <root>/macos.
            let mac = crate::macos::env_for(env);
            if mac.root.is_dir() {
                crate::cleanup::cleanup(&mac, false)?;
            }
            Ok(())
        }
        SimCmd::SeedSnapshot(a) => crate::snapshot::seed(env, a),
        SimCmd::Lease(l) => lease(env, l),
        SimCmd::Info { args } => info(env, &args),
        SimCmd::NetControl { socket } => crate::net_control::serve(env, &socket),
        SimCmd::Guest { .. } | SimCmd::Hub { .. } => unreachable!("dispatched before env load"),
    }
}

fn lookup(env: &Env, reference: &str) -> Result<StoredVm> {
    Store::new(&env.root).lookup_vm(reference)
}

fn fault(env: &Env, cmd: FaultCmd) -> Result<()> {
    match cmd {
        FaultCmd::Fail {
            verb,
            times,
            message,
        } => faults::update(env, |f| {
            let v = f.verbs.entry(normalize_verb(&verb)).or_default();
            v.fail_times = times;
            v.fail_message = message.unwrap_or_default();
        }),
        FaultCmd::Delay { verb, ms, times } => faults::update(env, |f| {
            let v = f.verbs.entry(normalize_verb(&verb)).or_default();
            v.delay_ms = ms;
            v.delay_times = times;
        }),
        FaultCmd::Garbage { verb, times } => faults::update(env, |f| {
            f.verbs
                .entry(normalize_verb(&verb))
                .or_default()
                .garbage_times = times;
        }),
        FaultCmd::KillStreams => faults::update(env, |f| f.stream_generation += 1),
        FaultCmd::Clear => faults::update(env, |f| {
            f.verbs.clear();
            f.exec.clear();
            f.fixup.clear();
            f.sac.clear();
        }),
        FaultCmd::Fixup {
            vm,
            times,
            always,
            message,
            clear,
        } => {
            let key = vm_key(env, &vm)?;
            if !clear && times.is_none() && !always {
                return fail("want --times N, --always or --clear");
            }
            faults::update(env, |f| {
                if clear {
                    f.fixup.remove(&key);
                } else {
                    f.fixup.insert(
                        key,
                        faults::FixupFault {
                            times: if always { None } else { times },
                            message: message.unwrap_or_default(),
                            used: Default::default(),
                        },
                    );
                }
            })
        }
        FaultCmd::Sac {
            vm,
            no_socket,
            no_prompt,
            refuse_set,
            reset,
        } => {
            let key = vm_key(env, &vm)?;
            faults::update(env, |f| {
                if reset {
                    f.sac.remove(&key);
                } else {
                    let e = f.sac.entry(key.clone()).or_default();
                    e.no_socket |= no_socket;
                    e.no_prompt |= no_prompt;
                    e.refuse_set |= refuse_set;
                }
            })?;
            // A running guest learns of the change through its control file.
            if key != "*" {
                update_vm(env, &key, |_| {})?;
            }
            Ok(())
        }
        FaultCmd::List => output::print_pretty(&faults::read(env)),
        FaultCmd::Crash { vm } => {
            let v = lookup(env, &vm)?;
            guest::kill(v.sim.pid, &v.id, true);
            Ok(())
        }
        FaultCmd::Hold { vm } => {
            let v = lookup(env, &vm)?;
            let Some(_held) = Store::new(&env.root).lock_vm(&v.id)? else {
                return fail(format!("vm {vm}: VM not found"));
            };
            output::emit("held\n")?;
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            Ok(())
        }
        FaultCmd::SetState { vm, state } => {
            if !matches!(
                state.as_str(),
                "error" | "stopped" | "created" | "running" | "creating"
            ) {
                return fail(format!(
                    "state {state:?}: want error, stopped, created, running or creating"
                ));
            }
            let v = lookup(env, &vm)?;
            if state != "running" {
                guest::kill(v.sim.pid, &v.id, true);
            }
            let reason = if state == "error" {
                "error"
            } else {
                "unexpected-exit"
            };
            update_vm(env, &v.id, |r| r.transition(&state, reason, now_ns())).map(|_| ())
        }
        FaultCmd::Vanish { vm } => {
            let v = lookup(env, &vm)?;
            crate::vm::destroy(env, &Store::new(&env.root), &v)
        }
        FaultCmd::Lease {
            vm,
            delay_ms,
            withhold,
            until_renew,
            mac,
            release,
            reset,
        } => {
            let v = lookup(env, &vm)?;
            if release {
                leases::release(&env.leases, &guest::lease_mac(&v))?;
            }
            let mac = match mac {
                Some(m) => Some(crate::ids::normalize_mac(&m).ok_or_else(|| {
                    crate::error::Error::Msg(format!("invalid MAC address {m:?}"))
                })?),
                None => None,
            };
            update_vm(env, &v.id, |r| {
                let l = &mut r.sim.lease;
                if reset {
                    *l = Default::default();
                }
                if delay_ms.is_some() {
                    l.delay_ms = delay_ms;
                }
                if withhold {
                    l.withhold = true;
                }
                if until_renew {
                    l.until_renew = true;
                    l.renewed = false;
                }
                if let Some(m) = mac {
                    l.mac = m;
                }
            })
            .map(|_| ())
        }
        FaultCmd::OpenPort { vm, port } => {
            let v = lookup(env, &vm)?;
            update_vm(env, &v.id, |r| {
                if !r.sim.ports.contains(&port) {
                    r.sim.ports.push(port);
                    r.sim.ports.sort_unstable();
                }
            })
            .map(|_| ())
        }
        FaultCmd::ClosePort { vm, port } => {
            let v = lookup(env, &vm)?;
            update_vm(env, &v.id, |r| r.sim.ports.retain(|p| *p != port)).map(|_| ())
        }
        FaultCmd::Exec {
            vm,
            exit_code,
            stdout,
            stderr,
            times,
            flood,
        } => {
            let v = lookup(env, &vm)?;
            faults::update(env, |f| {
                let q = f.exec.entry(v.id.clone()).or_default();
                for _ in 0..times {
                    q.push(ExecScript {
                        exit_code,
                        stdout: stdout.clone(),
                        stderr: stderr.clone(),
                        flood,
                    });
                }
            })
        }
    }
}

/// `*` stays `*`; anything else must name a VM.
fn vm_key(env: &Env, reference: &str) -> Result<String> {
    if reference == "*" {
        return Ok(reference.to_string());
    }
    Ok(lookup(env, reference)?.id)
}

fn lease(env: &Env, cmd: LeaseCmd) -> Result<()> {
    match cmd {
        LeaseCmd::Put { mac, ip, expiry } => match expiry {
            Some(e) => leases::grant_until(&env.leases, &mac, &ip, &e),
            None => leases::grant(&env.leases, &mac, &ip),
        },
        LeaseCmd::Del { mac } => leases::release(&env.leases, &mac),
        LeaseCmd::List => output::print_pretty(&leases::read(&env.leases)),
    }
}

#[derive(Serialize)]
struct Info {
    id: String,
    name: String,
    state: String,
    pid: i32,
    alive: bool,
    ip: String,
    net_mode: String,
    netns: String,
    veth: String,
    cgroup: String,
    ports: Vec<u16>,
    lease_mac: String,
    leases_path: String,
    run_dir: String,
    log_file: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fixup: Option<crate::model::FixupState>,
    /// The SAC console: path, and what `i` lists now.
    #[serde(skip_serializing_if = "Option::is_none")]
    sac_socket: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    sac: Option<Vec<crate::model::SacNic>>,
}

fn info(env: &Env, args: &[String]) -> Result<()> {
    crate::exact_args(args, 1)?;
    let v = lookup(env, &args[0])?;
    output::print_pretty(&Info {
        id: v.id.clone(),
        name: v.config.name.clone(),
        state: crate::vm::reconciled_state(&v),
        pid: v.sim.pid,
        alive: guest::is_alive(v.sim.pid, &v.id),
        ip: v.sim.ip.clone(),
        net_mode: v.sim.net_mode.clone(),
        netns: v.sim.netns.clone(),
        veth: v.sim.veth.clone(),
        cgroup: v.sim.cgroup.clone(),
        ports: v.sim.ports.clone(),
        lease_mac: guest::lease_mac(&v),
        leases_path: env.leases.display().to_string(),
        run_dir: v.sim.run_dir.clone(),
        log_file: v.log_file(),
        fixup: v.sim.fixup.clone(),
        sac_socket: v
            .sim
            .sac
            .as_ref()
            .map(|_| crate::sac::socket_path(&v).display().to_string()),
        sac: v.sim.sac.as_ref().map(|boot| {
            std::fs::read(env.vm_state_dir(&v.id).join("sac.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<crate::sac::Sac>(&b).ok())
                .unwrap_or_else(|| crate::sac::Sac::new(boot.clone()))
                .shown()
        }),
    })
}
