//! An in-process SAC console for the dialog's tests. It answers as the simulator's does (echo,
//! CR, LF and CRLF each end a line, `i` lists an IPv4 and an IPv6 line per NIC, interface
//! numbers 7, 12, 17, …) and can misbehave the ways a guest's console does.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio::task::JoinHandle;

#[derive(Clone, Copy, Debug, Default)]
pub struct Behaviour {
    /// Reads and never writes: no echo, no prompt.
    pub silent: bool,
    /// `i N …` is answered with `SAC failed to set the IP Address.`
    pub refuse_set: bool,
    /// `i` lists only this many NICs.
    pub lists: Option<usize>,
    /// `i N …` is accepted but the listing keeps the old address.
    pub sticky: bool,
    /// Output goes out one byte per write.
    pub trickle: bool,
    /// Line ends are LF alone.
    pub lf_only: bool,
    /// Bytes of console noise (without a prompt) sent on connect.
    pub banner: usize,
    /// The first empty line earns this many extra prompts, as several CRLFs answered late do.
    pub extra_prompts: usize,
    /// The first prompt is followed by an `EVENT:` notice and a prompt of its own.
    pub event: bool,
    /// The socket appears only after this long.
    pub bind_after: Duration,
}

struct State {
    /// (interface number, IPv4 address) per NIC position.
    nics: Vec<(u32, Ipv4Addr)>,
    b: Behaviour,
    lines: Vec<String>,
    prompted: bool,
}

pub struct FakeSac {
    pub socket: PathBuf,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Drop for FakeSac {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeSac {
    pub fn start(socket: &Path, nic_count: usize, b: Behaviour) -> FakeSac {
        let nics = (0..nic_count)
            .map(|i| (7 + 5 * i as u32, Ipv4Addr::new(169, 254, 10, 11 + i as u8)))
            .collect();
        let state = Arc::new(Mutex::new(State {
            nics,
            b,
            lines: Vec::new(),
            prompted: false,
        }));
        let (path, shared) = (socket.to_path_buf(), state.clone());
        let task = tokio::spawn(async move {
            tokio::time::sleep(b.bind_after).await;
            let listener = UnixListener::bind(&path).expect("bind the fake SAC socket");
            let mut conns = Vec::new();
            while let Ok((conn, _)) = listener.accept().await {
                conns.push(AbortOnDrop(tokio::spawn(serve(conn, shared.clone()))));
            }
        });
        FakeSac {
            socket: socket.to_path_buf(),
            state,
            task,
        }
    }

    /// Every line the console received, in order.
    pub fn lines(&self) -> Vec<String> {
        self.state.lock().unwrap().lines.clone()
    }

    /// What `i` would list now, IPv4 entries only.
    pub fn listing(&self) -> Vec<(u32, Ipv4Addr)> {
        self.state.lock().unwrap().nics.clone()
    }
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn serve(mut conn: UnixStream, state: Arc<Mutex<State>>) {
    let b = state.lock().unwrap().b;
    if b.banner > 0 {
        let noise: Vec<u8> = b"boot: all is well\r\n"
            .iter()
            .copied()
            .cycle()
            .take(b.banner)
            .collect();
        if conn.write_all(&noise).await.is_err() {
            return;
        }
    }
    let (mut line, mut after_cr) = (Vec::new(), false);
    let mut chunk = [0u8; 1024];
    loop {
        let n = match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if b.silent {
            continue;
        }
        let mut out = chunk[..n].to_vec();
        for &c in &chunk[..n] {
            let was_cr = std::mem::replace(&mut after_cr, c == b'\r');
            match c {
                b'\n' if was_cr => {}
                b'\r' | b'\n' => {
                    let text = String::from_utf8_lossy(&line).into_owned();
                    line.clear();
                    out.extend_from_slice(answer(&state, &text).as_bytes());
                }
                _ => line.push(c),
            }
        }
        if b.lf_only {
            out = String::from_utf8_lossy(&out)
                .replace("\r\n", "\n")
                .into_bytes();
        }
        let sent = match b.trickle {
            true => trickle(&mut conn, &out).await,
            false => conn.write_all(&out).await,
        };
        if sent.is_err() {
            return;
        }
    }
}

async fn trickle(conn: &mut UnixStream, out: &[u8]) -> std::io::Result<()> {
    for byte in out {
        conn.write_all(std::slice::from_ref(byte)).await?;
        tokio::task::yield_now().await;
    }
    Ok(())
}

/// The simulator's answer to one line, prompt included.
fn answer(state: &Mutex<State>, line: &str) -> String {
    let mut s = state.lock().unwrap();
    s.lines.push(line.to_string());
    let words: Vec<&str> = line.split_whitespace().collect();
    let body = match words.as_slice() {
        [] => {
            let mut out = "\r\nSAC>".to_string();
            if !std::mem::replace(&mut s.prompted, true) {
                out.push_str(&"\r\nSAC>".repeat(s.b.extra_prompts));
                if s.b.event {
                    out.push_str("\r\nEVENT: The CMD command is now available.\r\nSAC>");
                }
            }
            return out;
        }
        ["i"] => {
            let shown = s.b.lists.unwrap_or(s.nics.len());
            let mut out = String::from("SAC is retrieving IP Addresses...\r\n\r\n");
            for (net, ip) in s.nics.iter().take(shown) {
                out.push_str(&format!(
                    "Net: {net}, Ip={ip}  Subnet=255.255.0.0  Gateway=0.0.0.0\r\n"
                ));
                out.push_str(&format!("Net: {net}, Ip=fe80::{:x}\r\n", 0x1000 + net));
            }
            out
        }
        ["i", net, ip, mask, gw] => set(&mut s, net, ip, mask, gw),
        ["i", ..] => "Usage: i [<#> <ip> <subnet> <gateway>]\r\n".into(),
        _ => "Unrecognized command.  Try \"?\" for help.\r\n".into(),
    };
    format!("\r\n{body}\r\nSAC>")
}

fn set(s: &mut State, net: &str, ip: &str, mask: &str, gw: &str) -> String {
    let Some(idx) = net
        .parse::<u32>()
        .ok()
        .and_then(|n| s.nics.iter().position(|(m, _)| *m == n))
    else {
        return format!("SAC could not find network interface {net}.\r\n");
    };
    let (Ok(ip), Ok(_), Ok(_)) = (
        ip.parse::<Ipv4Addr>(),
        mask.parse::<Ipv4Addr>(),
        gw.parse::<Ipv4Addr>(),
    ) else {
        return "SAC could not set the IP Address: the parameters are not valid.\r\n".into();
    };
    if s.b.refuse_set {
        return "SAC failed to set the IP Address.\r\n".into();
    }
    if !s.b.sticky {
        s.nics[idx].1 = ip;
    }
    "SAC successfully set the IP Address.\r\n".into()
}
