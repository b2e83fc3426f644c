//! The guest program's TCP services: port 22 greets with the SSH banner, the value port
//! speaks `SET <value>` / `GET`, every other program port answers any request with
//! `HTTP/1.1 200 OK` naming the guest. Each port keeps listening sockets in reserve, so
//! several clients can connect at once.

use std::collections::HashMap;

use smoltcp::iface::{SocketHandle, SocketSet};
use smoltcp::socket::tcp::{self, State};

use crate::console::Console;
use crate::guest::shared::GuestShared;
use crate::program::Program;

const BUF: usize = 64 * 1024;
/// Listening sockets kept per port: SYNs that arrive in one batch each find one.
const SPARE_LISTENERS: usize = 4;
const LINE_MAX: usize = 16 * 1024;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Banner,
    Http,
    Value,
}

struct Conn {
    kind: Kind,
    port: u16,
    input: Vec<u8>,
    greeted: bool,
}

pub struct Services {
    program: Program,
    hostname: String,
    conns: HashMap<SocketHandle, Conn>,
}

impl Services {
    pub fn new(program: Program, hostname: String, sockets: &mut SocketSet<'static>) -> Services {
        let mut s = Services {
            program,
            hostname,
            conns: HashMap::new(),
        };
        s.replenish(sockets);
        s
    }

    fn ports(&self) -> Vec<(u16, Kind)> {
        let mut ports: Vec<(u16, Kind)> = self
            .program
            .tcp_ports
            .iter()
            .map(|&p| (p, if p == 22 { Kind::Banner } else { Kind::Http }))
            .filter(|(p, _)| *p != self.program.value_port)
            .collect();
        ports.push((self.program.value_port, Kind::Value));
        ports
    }

    fn replenish(&mut self, sockets: &mut SocketSet<'static>) {
        for (port, kind) in self.ports() {
            let listening = self
                .conns
                .iter()
                .filter(|(h, c)| {
                    c.port == port && sockets.get::<tcp::Socket>(**h).state() == State::Listen
                })
                .count();
            for _ in listening..SPARE_LISTENERS {
                let mut sock = tcp::Socket::new(
                    tcp::SocketBuffer::new(vec![0; BUF]),
                    tcp::SocketBuffer::new(vec![0; BUF]),
                );
                if sock.listen(port).is_err() {
                    break;
                }
                let h = sockets.add(sock);
                self.conns.insert(
                    h,
                    Conn {
                        kind,
                        port,
                        input: Vec::new(),
                        greeted: false,
                    },
                );
            }
        }
    }

    /// Serves every connection once; returns whether anything was sent.
    pub fn step(
        &mut self,
        sockets: &mut SocketSet<'static>,
        shared: &GuestShared,
        console: &Console,
    ) {
        let mut gone = Vec::new();
        for (&h, conn) in self.conns.iter_mut() {
            let sock = sockets.get_mut::<tcp::Socket>(h);
            match sock.state() {
                State::Listen | State::SynReceived => continue,
                State::Closed | State::TimeWait => {
                    gone.push(h);
                    continue;
                }
                _ => {}
            }
            while sock.can_recv() && conn.input.len() < LINE_MAX {
                let got = sock.recv(|b| (b.len(), b.to_vec())).unwrap_or_default();
                if got.is_empty() {
                    break;
                }
                conn.input.extend(got);
            }
            match conn.kind {
                Kind::Banner => banner(sock, conn, &self.program.banner),
                Kind::Http => http(sock, conn, &self.hostname),
                Kind::Value => value(sock, conn, shared, console),
            }
            if !sock.may_recv() && sock.may_send() {
                sock.close();
            }
        }
        for h in gone {
            self.conns.remove(&h);
            sockets.remove(h);
        }
        self.replenish(sockets);
    }
}

fn banner(sock: &mut tcp::Socket, conn: &mut Conn, banner: &str) {
    if !conn.greeted && sock.may_send() {
        let _ = sock.send_slice(format!("{banner}\r\n").as_bytes());
        conn.greeted = true;
    }
    // Whatever the client says (its own version line, key exchange) goes unanswered.
    conn.input.clear();
}

fn http(sock: &mut tcp::Socket, conn: &mut Conn, hostname: &str) {
    let complete = conn.input.windows(4).any(|w| w == b"\r\n\r\n")
        || conn.input.windows(2).any(|w| w == b"\n\n");
    if conn.greeted || !complete || !sock.may_send() {
        return;
    }
    let body = format!("cocoon-standin {hostname}\n");
    let resp = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = sock.send_slice(resp.as_bytes());
    conn.greeted = true;
    sock.close();
}

fn value(sock: &mut tcp::Socket, conn: &mut Conn, shared: &GuestShared, console: &Console) {
    while let Some(end) = conn.input.iter().position(|b| *b == b'\n') {
        if sock.send_capacity() - sock.send_queue() < LINE_MAX + 8 {
            return;
        }
        let line: Vec<u8> = conn.input.drain(..=end).collect();
        let line = String::from_utf8_lossy(&line)
            .trim_end_matches(['\r', '\n'])
            .to_string();
        let reply = if let Some(v) = line.strip_prefix("SET ") {
            if let Some(m) = shared.lock().memory.as_mut() {
                m.value = v.to_string();
            }
            console.line(&format!("value set ({} bytes)", v.len()));
            "OK\n".to_string()
        } else if line == "GET" {
            let v = shared
                .lock()
                .memory
                .as_ref()
                .map(|m| m.value.clone())
                .unwrap_or_default();
            format!("{v}\n")
        } else {
            "ERR unknown command\n".to_string()
        };
        let _ = sock.send_slice(reply.as_bytes());
    }
}
