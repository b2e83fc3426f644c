//! ICMP echo for the readiness probes: one socket and one OS receive thread serve every guest.
//! icmp-socket is blocking, so replies are read on a thread of their own and handed to the
//! waiting probes (async tasks) through the demultiplexer; sends happen on the probe's task.

pub mod demux;
pub mod socket;
mod tune;

use std::fmt;
use std::io;
use std::net::Ipv4Addr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use demux::Demux;
pub use socket::Kind;
use socket::{Received, Sender};

pub const PAYLOAD: &[u8] = b"vk-cocoon";
/// A request or reply lost on the way costs one resend, not the probe.
const RESEND_AFTER: Duration = Duration::from_secs(1);
/// How soon the receive thread notices the pinger is gone.
const RECV_POLL: Duration = Duration::from_millis(500);

pub struct Icmp {
    kind: Kind,
    identifier: u16,
    tx: Sender,
    demux: Arc<Demux>,
}

#[derive(Debug)]
pub enum PingError {
    Send(io::Error),
    Timeout(Duration),
}

impl fmt::Display for PingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PingError::Send(e) => write!(f, "sending the echo request: {e}"),
            PingError::Timeout(d) => write!(f, "no echo reply within {d:?}"),
        }
    }
}

impl Icmp {
    pub fn open(kind: Kind) -> io::Result<Self> {
        let identifier = (std::process::id() & 0xffff) as u16;
        let (tx, rx) = socket::open(kind, RECV_POLL)?;
        let demux = Demux::new((kind == Kind::Raw).then_some(identifier), PAYLOAD);
        let weak = Arc::downgrade(&demux);
        std::thread::Builder::new()
            .name("icmp-rx".into())
            .spawn(move || receive(rx, weak))?;
        Ok(Self {
            kind,
            identifier,
            tx,
            demux,
        })
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Time from the first request to the reply, resending every second until `deadline`.
    pub async fn ping(&self, ip: Ipv4Addr, deadline: Duration) -> Result<Duration, PingError> {
        let started = Instant::now();
        let give_up = started + deadline;
        let mut waiter = self.demux.register(ip);
        loop {
            self.tx
                .send(ip, self.identifier, waiter.sequence(), PAYLOAD)
                .map_err(PingError::Send)?;
            let resend = (Instant::now() + RESEND_AFTER).min(give_up);
            match tokio::time::timeout_at(resend.into(), waiter.reply()).await {
                Ok(at) => return Ok(at.saturating_duration_since(started)),
                Err(_) if Instant::now() >= give_up => return Err(PingError::Timeout(deadline)),
                Err(_) => {}
            }
        }
    }
}

/// The receive thread: lives as long as some `Icmp` or probe still holds the demultiplexer.
fn receive(mut rx: socket::Receiver, demux: Weak<Demux>) {
    loop {
        let got = rx.recv();
        let at = Instant::now();
        let Some(demux) = demux.upgrade() else {
            return;
        };
        match got {
            Ok(Received::Reply(reply)) => {
                demux.deliver(&reply, at);
            }
            Ok(Received::Other | Received::Idle) => {}
            Err(e) => {
                tracing::warn!(error = %e, "reading ICMP replies");
                // Not a spin on a socket that keeps failing.
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}
