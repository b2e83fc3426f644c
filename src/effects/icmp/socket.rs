//! The sockets echo requests leave through and replies come back on: icmp-socket's raw IPv4
//! socket when CAP_NET_RAW allows it, else the kernel's unprivileged ping socket
//! (SOCK_DGRAM/IPPROTO_ICMP, allowed by net.ipv4.ping_group_range). icmp-socket builds and
//! parses the packets on both.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::Mutex;
use std::time::Duration;

use icmp_socket::packet::WithEchoRequest;
use icmp_socket::{IcmpSocket, IcmpSocket4, Icmpv4Message, Icmpv4Packet};
use socket2::{Domain, Protocol, Socket, Type};

use super::demux::Reply;
use super::tune::{self, Reads};

/// icmp-socket parses from the IPv4 header on (that is what a raw socket delivers), and
/// assumes one without options.
const IPV4_HEADER: usize = 20;
/// Our replies carry 9 bytes of payload; anything longer is not one of them.
const RECV_BUF: usize = 512;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Raw,
    Datagram,
}

pub enum Sender {
    /// A second raw socket: icmp-socket's `send_to` takes `&mut self`, and the receive thread
    /// sits inside `rcv_from` on the other one. It is never read, so it filters out all ICMP.
    Raw(Mutex<IcmpSocket4>),
    /// Sends and receives go through `&self`, so the receive thread holds a clone of the fd.
    Datagram(UdpSocket),
}

pub enum Receiver {
    Raw(IcmpSocket4),
    Datagram { socket: UdpSocket, buf: Vec<u8> },
}

pub enum Received {
    Reply(Reply),
    /// Some other ICMP message, or one too short to parse.
    Other,
    /// The poll interval passed with nothing to read.
    Idle,
}

/// `poll` bounds how long `Receiver::recv` blocks, so the thread notices when it is no longer
/// needed.
pub fn open(kind: Kind, poll: Duration) -> io::Result<(Sender, Receiver)> {
    match kind {
        Kind::Raw => {
            let (mut rx, rx_tuned) = tune::raw_socket(Reads::EchoReplies)?;
            rx.bind(Ipv4Addr::UNSPECIFIED)?;
            rx.set_timeout(Some(poll));
            let (mut tx, tx_tuned) = tune::raw_socket(Reads::Nothing)?;
            tx.bind(Ipv4Addr::UNSPECIFIED)?;
            if let Err(why) = rx_tuned.and(tx_tuned) {
                tracing::warn!(%why, "raw ICMP sockets keep icmp-socket's 512-byte receive buffer: \
                    replies will be lost (and resent) under load");
            }
            Ok((Sender::Raw(Mutex::new(tx)), Receiver::Raw(rx)))
        }
        Kind::Datagram => {
            let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::ICMPV4))?;
            // Room for the replies of a burst of probes (capped by net.core.rmem_max).
            socket.set_recv_buffer_size(512 * 1024)?;
            // A ping socket behaves like a UDP socket whose port is the echo identifier.
            let socket: UdpSocket = socket.into();
            socket.set_read_timeout(Some(poll))?;
            let rx = socket.try_clone()?;
            Ok((
                Sender::Datagram(socket),
                Receiver::Datagram {
                    socket: rx,
                    buf: vec![0; IPV4_HEADER + RECV_BUF],
                },
            ))
        }
    }
}

impl Sender {
    pub fn send(
        &self,
        to: Ipv4Addr,
        identifier: u16,
        sequence: u16,
        payload: &[u8],
    ) -> io::Result<()> {
        let packet = Icmpv4Packet::with_echo_request(identifier, sequence, payload.to_vec())?;
        match self {
            Sender::Raw(socket) => socket
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .send_to(to, packet),
            Sender::Datagram(socket) => socket
                .send_to(
                    &packet.with_checksum().get_bytes(true),
                    SocketAddr::from((to, 0)),
                )
                .map(drop),
        }
    }
}

impl Receiver {
    pub fn recv(&mut self) -> io::Result<Received> {
        match self {
            Receiver::Raw(socket) => match socket.rcv_from() {
                Ok((packet, from)) => Ok(classify(packet, from.as_socket())),
                Err(e) if idle(&e) => Ok(Received::Idle),
                // Parse failures come back as errors without an OS code.
                Err(e) if e.raw_os_error().is_none() => Ok(Received::Other),
                Err(e) => Err(e),
            },
            Receiver::Datagram { socket, buf } => {
                let (n, from) = match socket.recv_from(&mut buf[IPV4_HEADER..]) {
                    Ok(got) => got,
                    Err(e) if idle(&e) => return Ok(Received::Idle),
                    Err(e) => return Err(e),
                };
                // A ping socket delivers the ICMP message alone: the zeroed head stands in for
                // the IPv4 header icmp-socket skips.
                Ok(match Icmpv4Packet::parse(&buf[..IPV4_HEADER + n]) {
                    Ok(packet) => classify(packet, Some(from)),
                    Err(_) => Received::Other,
                })
            }
        }
    }
}

fn idle(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

fn classify(packet: Icmpv4Packet, from: Option<SocketAddr>) -> Received {
    match (packet.message, from) {
        (
            Icmpv4Message::EchoReply {
                identifier,
                sequence,
                payload,
            },
            Some(SocketAddr::V4(from)),
        ) => Received::Reply(Reply {
            from: *from.ip(),
            identifier,
            sequence,
            payload,
        }),
        _ => Received::Other,
    }
}
