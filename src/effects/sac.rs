//! Static IPv4 addresses for a Windows guest through SAC (C15), the Special Administration Console:
//! Windows' text console on the serial port, which cloud-hypervisor exposes as the VM's
//! `console.sock`. It needs no network in the guest, which is the point: a Windows clone with a
//! static NIC has no usable address until one is set, so nothing network-borne can set it.
//!
//! The dialog follows the console's pace, each step with its own patience:
//! - dial, retrying: the socket exists only once the VM process is up;
//! - empty lines until `SAC>`: SAC says nothing until spoken to, and starts late in boot;
//! - `i` until every NIC is listed: SAC's `Net: N` numbers are interface indices, not NIC
//!   positions, so they are mapped from the listing's order, and only a complete listing
//!   (taken once every adapter is up) has the right order;
//! - `i <N> <ip> <mask> <gw>` per static NIC, which SAC answers with one line;
//! - `i` until each address shows: what the listing says is what the guest carries.
//!
//! A failure names the step it stopped at, for the caller's per-step Warning.

use std::fmt;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use super::sac_console::{distinct_nets, listed_ipv4, Console, ConsoleError};

const SET_OK: &str = "SAC successfully set the IP Address.";

/// A NIC to make static. `position` is its index in the VM's NIC list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SacNic {
    pub position: usize,
    pub ip: Ipv4Addr,
    pub mask: Ipv4Addr,
    pub gateway: Ipv4Addr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SacStage {
    Dial,
    Enum,
    Set,
    Verify,
}

impl fmt::Display for SacStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SacStage::Dial => "dial",
            SacStage::Enum => "enum",
            SacStage::Set => "set",
            SacStage::Verify => "verify",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SacFailure {
    pub stage: SacStage,
    /// For an operator: the socket or command, and what the console did.
    pub message: String,
}

impl SacFailure {
    fn new(stage: SacStage, message: impl Into<String>) -> Self {
        Self {
            stage,
            message: message.into(),
        }
    }
}

impl fmt::Display for SacFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SAC {}: {}", self.stage, self.message)
    }
}

impl std::error::Error for SacFailure {}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SacTimeouts {
    pub dial_retry: Duration,
    pub dial_budget: Duration,
    pub prompt_budget: Duration,
    pub enum_tries: u32,
    pub enum_interval: Duration,
    pub verify_tries: u32,
    pub verify_interval: Duration,
    /// For one command's answer; an empty line sent for the prompt is a command too.
    pub command: Duration,
}

impl Default for SacTimeouts {
    fn default() -> Self {
        Self {
            dial_retry: Duration::from_secs(2),
            dial_budget: Duration::from_secs(60),
            prompt_budget: Duration::from_secs(60),
            enum_tries: 60,
            enum_interval: Duration::from_secs(2),
            verify_tries: 10,
            verify_interval: Duration::from_secs(2),
            command: Duration::from_secs(5),
        }
    }
}

/// Sets each of `nics` on the guest whose SAC console is `socket`; the guest has `nic_count`
/// NICs in all. With no NIC to set the console is not touched.
pub async fn set_static_ips(
    socket: &Path,
    nic_count: usize,
    nics: &[SacNic],
    t: &SacTimeouts,
) -> Result<(), SacFailure> {
    set_static_ips_capped(
        socket,
        nic_count,
        nics,
        t,
        &crate::caps::CapCount::default(),
    )
    .await
}

/// `set_static_ips`, counting on `cap` a dialog whose console printed more than is kept.
pub async fn set_static_ips_capped(
    socket: &Path,
    nic_count: usize,
    nics: &[SacNic],
    t: &SacTimeouts,
    cap: &crate::caps::CapCount,
) -> Result<(), SacFailure> {
    if nics.is_empty() {
        return Ok(());
    }
    let mut console = dial(socket, t).await?;
    let result = dialog(&mut console, socket, nic_count, nics, t).await;
    if console.trimmed {
        cap.refused(crate::caps::Cap::GuestOutput);
    }
    result
}

async fn dialog(
    console: &mut Console,
    socket: &Path,
    nic_count: usize,
    nics: &[SacNic],
    t: &SacTimeouts,
) -> Result<(), SacFailure> {
    await_prompt(console, socket, t).await?;
    let nets = enumerate(console, socket, nic_count, t).await?;
    let targets = targets(&nets, nics)?;
    for (net, nic) in &targets {
        set(console, socket, *net, nic, t).await?;
    }
    verify(console, socket, &targets, t).await
}

async fn dial(socket: &Path, t: &SacTimeouts) -> Result<Console, SacFailure> {
    let deadline = Instant::now() + t.dial_budget;
    loop {
        let err = match Console::connect(socket).await {
            Ok(c) => return Ok(c),
            Err(e) => e,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(SacFailure::new(
                SacStage::Dial,
                format!(
                    "SAC console {}: cannot connect within {:?}: {err}",
                    socket.display(),
                    t.dial_budget
                ),
            ));
        }
        tokio::time::sleep(t.dial_retry.min(deadline - now)).await;
    }
}

/// A console that connects but never prompts counts as a failed enumeration, not a failed
/// dial: the socket is there (the VM runs), it is SAC inside the guest that is not answering,
/// and enumeration is the first step that needs SAC itself.
async fn await_prompt(
    console: &mut Console,
    socket: &Path,
    t: &SacTimeouts,
) -> Result<(), SacFailure> {
    let deadline = Instant::now() + t.prompt_budget;
    loop {
        let by = deadline.min(Instant::now() + t.command);
        match console.prompt(by).await {
            Ok(()) => return Ok(()),
            Err(ConsoleError::TimedOut) if Instant::now() < deadline => {}
            Err(ConsoleError::TimedOut) => {
                return Err(SacFailure::new(
                    SacStage::Enum,
                    format!(
                        "SAC console {}: no SAC> prompt within {:?}",
                        socket.display(),
                        t.prompt_budget
                    ),
                ))
            }
            Err(e) => {
                return Err(SacFailure::new(
                    SacStage::Enum,
                    format!(
                        "SAC console {} while waiting for SAC>: {e}",
                        socket.display()
                    ),
                ))
            }
        }
    }
}

/// SAC's interface numbers, in listing order, once at least `nic_count` have an IPv4 entry.
async fn enumerate(
    console: &mut Console,
    socket: &Path,
    nic_count: usize,
    t: &SacTimeouts,
) -> Result<Vec<u32>, SacFailure> {
    let tries = t.enum_tries.max(1);
    let mut listed = 0;
    let mut silent = false;
    for attempt in 1..=tries {
        match console.command("i", t.command).await {
            Ok(answer) => {
                let nets = distinct_nets(&listed_ipv4(&answer));
                if nets.len() >= nic_count {
                    return Ok(nets);
                }
                (listed, silent) = (nets.len(), false);
            }
            // A busy console may answer late; the next try reads the late answer first.
            Err(ConsoleError::TimedOut) => silent = true,
            Err(e) => {
                return Err(SacFailure::new(
                    SacStage::Enum,
                    format!("SAC console {} during `i`: {e}", socket.display()),
                ))
            }
        }
        if attempt < tries {
            tokio::time::sleep(t.enum_interval).await;
        }
    }
    let last = match silent {
        true => format!("; the last `i` got no answer within {:?}", t.command),
        false => String::new(),
    };
    Err(SacFailure::new(
        SacStage::Enum,
        format!("SAC listed {listed} of {nic_count} network interfaces after {tries} tries{last}"),
    ))
}

/// Each NIC with the SAC interface number at its position.
fn targets(nets: &[u32], nics: &[SacNic]) -> Result<Vec<(u32, SacNic)>, SacFailure> {
    nics.iter()
        .map(|nic| match nets.get(nic.position) {
            Some(net) => Ok((*net, *nic)),
            None => Err(SacFailure::new(
                SacStage::Set,
                format!(
                    "NIC {} has no SAC interface: SAC listed {} ({})",
                    nic.position,
                    nets.len(),
                    nets.iter()
                        .map(|n| format!("Net: {n}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        })
        .collect()
}

async fn set(
    console: &mut Console,
    socket: &Path,
    net: u32,
    nic: &SacNic,
    t: &SacTimeouts,
) -> Result<(), SacFailure> {
    let cmd = format!("i {net} {} {} {}", nic.ip, nic.mask, nic.gateway);
    let fail = |m: String| Err(SacFailure::new(SacStage::Set, m));
    match console.command(&cmd, t.command).await {
        Ok(answer) if answer.contains(SET_OK) => Ok(()),
        Ok(answer) => fail(format!("SAC refused `{cmd}`: {}", reply(&answer, &cmd))),
        Err(ConsoleError::TimedOut) => {
            fail(format!("SAC did not answer `{cmd}` within {:?}", t.command))
        }
        Err(e) => fail(format!(
            "SAC console {} during `{cmd}`: {e}",
            socket.display()
        )),
    }
}

/// What SAC said, without the echo of the command: its lines joined by ` / `.
fn reply(answer: &str, cmd: &str) -> String {
    let lines: Vec<&str> = answer
        .split(['\r', '\n'])
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != cmd)
        .collect();
    match lines.is_empty() {
        true => "an empty answer".into(),
        false => lines.join(" / "),
    }
}

async fn verify(
    console: &mut Console,
    socket: &Path,
    targets: &[(u32, SacNic)],
    t: &SacTimeouts,
) -> Result<(), SacFailure> {
    let tries = t.verify_tries.max(1);
    let mut seen = None;
    for attempt in 1..=tries {
        match console.command("i", t.command).await {
            Ok(answer) => {
                let listed = listed_ipv4(&answer);
                if targets
                    .iter()
                    .all(|(n, nic)| listed.contains(&(*n, nic.ip)))
                {
                    return Ok(());
                }
                seen = Some(listed);
            }
            Err(ConsoleError::TimedOut) => {}
            Err(e) => {
                return Err(SacFailure::new(
                    SacStage::Verify,
                    format!("SAC console {} during `i`: {e}", socket.display()),
                ))
            }
        }
        if attempt < tries {
            tokio::time::sleep(t.verify_interval).await;
        }
    }
    let Some(listed) = seen else {
        return Err(SacFailure::new(
            SacStage::Verify,
            format!(
                "SAC answered no `i` within {:?} in {tries} tries",
                t.command
            ),
        ));
    };
    let missing: Vec<String> = targets
        .iter()
        .filter(|(n, nic)| !listed.contains(&(*n, nic.ip)))
        .map(|(n, nic)| {
            let shown: Vec<String> = listed
                .iter()
                .filter(|(m, _)| m == n)
                .map(|(_, ip)| ip.to_string())
                .collect();
            match shown.is_empty() {
                true => format!("Net: {n}, Ip={} (not listed)", nic.ip),
                false => format!("Net: {n}, Ip={} (lists {})", nic.ip, shown.join(", ")),
            }
        })
        .collect();
    Err(SacFailure::new(
        SacStage::Verify,
        format!(
            "SAC does not list {} after {tries} tries",
            missing.join("; ")
        ),
    ))
}
