//! Running the probes the core schedules (R5, R8–R10). One shared ICMP socket serves every
//! guest (see `effects::icmp`); raw first, then an unprivileged datagram socket, else the
//! degraded mode of R9.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reconcilers::action::{ProbeCheck, ProbeTarget};
use reconcilers::pod::PodKey;
use reconcilers::Event;
use tokio::io::AsyncReadExt;
use tokio::task::JoinHandle;

use crate::effects::icmp::{Icmp, Kind};
use crate::metrics::Metrics;
use crate::sources::EventTx;

const PROBE_DEADLINE: Duration = Duration::from_secs(3);

#[derive(Clone)]
pub enum Pinger {
    Icmp(Arc<Icmp>),
    /// No ICMP socket could be opened: an IP that resolved counts as reachable (R9).
    Degraded,
}

impl Pinger {
    pub fn open() -> Self {
        let raw = match Icmp::open(Kind::Raw) {
            Ok(icmp) => return Self::opened(icmp),
            Err(e) => e,
        };
        let datagram = match Icmp::open(Kind::Datagram) {
            Ok(icmp) => {
                tracing::info!(error = %raw, "no raw ICMP socket; probing through an unprivileged one");
                return Self::opened(icmp);
            }
            Err(e) => e,
        };
        tracing::warn!(raw = %raw, datagram = %datagram, "no ICMP socket (CAP_NET_RAW missing and unprivileged ICMP disabled): \
            ICMP probes degrade to 'an IP resolved = ready'; TCP and SSH probes stay real");
        Pinger::Degraded
    }

    fn opened(icmp: Icmp) -> Self {
        tracing::info!(kind = ?icmp.kind(), "ICMP probe socket open");
        Pinger::Icmp(Arc::new(icmp))
    }

    pub fn degraded(&self) -> bool {
        matches!(self, Pinger::Degraded)
    }
}

/// Per-pod probe tasks; a new probe or a stop replaces the pending one.
pub struct Probes {
    pinger: Pinger,
    tasks: HashMap<PodKey, JoinHandle<()>>,
    tx: EventTx,
    metrics: Metrics,
}

impl Probes {
    pub fn new(pinger: Pinger, tx: EventTx, metrics: Metrics) -> Self {
        Self {
            pinger,
            tasks: HashMap::new(),
            tx,
            metrics,
        }
    }

    /// Runs probe `probe` after `after_ms`. A standing probe runs again every `after_ms` while
    /// it succeeds and reports only its first failure; any other probe reports its result.
    pub fn schedule(
        &mut self,
        key: PodKey,
        probe: u64,
        target: ProbeTarget,
        after_ms: u64,
        standing: bool,
    ) {
        let pinger = self.pinger.clone();
        let tx = self.tx.clone();
        let metrics = self.metrics.clone();
        let task_key = key.clone();
        let handle = tokio::spawn(async move {
            let (ok, detail) = loop {
                tokio::time::sleep(Duration::from_millis(after_ms)).await;
                let started = Instant::now();
                let result = tokio::time::timeout(PROBE_DEADLINE, check(&pinger, &target)).await;
                metrics
                    .probe_duration
                    .observe(started.elapsed().as_secs_f64());
                match result {
                    Ok(Ok(())) if standing => continue,
                    Ok(Ok(())) => break (true, String::new()),
                    Ok(Err(e)) => break (false, e),
                    Err(_) => break (false, "probe deadline (3s) exceeded".to_string()),
                }
            };
            let _ = tx
                .send(Event::ProbeDone {
                    key: task_key,
                    seq: probe,
                    ok,
                    detail,
                })
                .await;
        });
        if let Some(old) = self.tasks.insert(key, handle) {
            old.abort();
        }
    }

    pub fn stop(&mut self, key: &PodKey) {
        if let Some(h) = self.tasks.remove(key) {
            h.abort();
        }
    }

    pub fn stop_all(&mut self) {
        for (_, h) in self.tasks.drain() {
            h.abort();
        }
    }
}

async fn check(pinger: &Pinger, target: &ProbeTarget) -> Result<(), String> {
    let ip: IpAddr = match &target.ip {
        None => return Err("waiting for dhcp lease".into()),
        Some(ip) => ip
            .parse()
            .map_err(|_| format!("{ip:?} is not an IP address"))?,
    };
    match target.check {
        ProbeCheck::Tcp { port } => tokio::net::TcpStream::connect(SocketAddr::new(ip, port))
            .await
            .map(drop)
            .map_err(|e| format!("tcp {ip}:{port}: {e}")),
        ProbeCheck::SshBanner => {
            let mut s = tokio::net::TcpStream::connect(SocketAddr::new(ip, 22))
                .await
                .map_err(|e| format!("ssh {ip}:22: {e}"))?;
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf)
                .await
                .map_err(|e| format!("ssh banner from {ip}: {e}"))?;
            if &buf == b"SSH-" {
                Ok(())
            } else {
                Err(format!("{ip}:22 answered without an SSH- banner"))
            }
        }
        ProbeCheck::Icmp => match pinger {
            Pinger::Degraded => Ok(()),
            Pinger::Icmp(icmp) => match ip {
                IpAddr::V4(v4) => icmp
                    .ping(v4, PROBE_DEADLINE)
                    .await
                    .map(drop)
                    .map_err(|e| format!("ping {ip}: {e}")),
                IpAddr::V6(_) => Err(format!("ping {ip}: ICMP probes are IPv4 only")),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(port: u16) -> ProbeTarget {
        ProbeTarget {
            ip: Some("127.0.0.1".into()),
            check: ProbeCheck::Tcp { port },
        }
    }

    /// A standing probe says nothing while the guest answers, however often it runs, and
    /// reports the first failure; a plain probe reports its success.
    #[tokio::test]
    async fn a_standing_probe_reports_only_its_first_failure() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let metrics = Metrics::new();
        let mut probes = Probes::new(Pinger::Degraded, tx, metrics.clone());
        let key = PodKey::new("default", "a");

        probes.schedule(key.clone(), 1, target(port), 1, false);
        match rx.recv().await {
            Some(Event::ProbeDone {
                seq: 1, ok: true, ..
            }) => {}
            other => panic!("a plain probe reports its success: {other:?}"),
        }

        probes.schedule(key.clone(), 2, target(port), 1, true);
        let before = metrics.probe_duration.get_sample_count();
        while metrics.probe_duration.get_sample_count() < before + 5 {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert!(rx.try_recv().is_err(), "five answered probes, no event");

        drop(listener);
        match rx.recv().await {
            Some(Event::ProbeDone {
                seq: 2, ok: false, ..
            }) => {}
            other => panic!("the first failure is reported: {other:?}"),
        }
        probes.stop_all();
    }
}
