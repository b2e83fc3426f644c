//! The userspace guest: one thread running a smoltcp interface on NIC 0's TAP with the MAC
//! of that NIC and the address in the guest's memory (from `ip=` at boot, from the snapshot
//! after a restore; DHCP when the command line gave none). It answers ARP and ICMP echo and
//! runs the guest program's services. While the VM is paused it does not touch the TAP:
//! frames wait in the kernel's queue, as they wait for a paused guest's virtio ring.

pub mod device;
pub mod services;
pub mod shared;

use std::sync::Arc;

use smoltcp::iface::{Config, Interface, PollResult, SocketHandle, SocketSet};
use smoltcp::socket::dhcpv4;
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpCidr, Ipv4Cidr};

use crate::cmdline::IpConfig;
use crate::console::Console;
use device::TapDevice;
use services::Services;
use shared::GuestShared;

pub fn spawn(shared: Arc<GuestShared>, console: Arc<Console>) {
    std::thread::Builder::new()
        .name("guest".into())
        .spawn(move || run(&shared, &console))
        .expect("spawn the guest thread");
}

/// The guest's network stack for one NIC and one memory; rebuilt when either is replaced.
struct Stack {
    device: TapDevice,
    iface: Interface,
    sockets: SocketSet<'static>,
    services: Services,
    dhcp: Option<SocketHandle>,
}

fn run(shared: &GuestShared, console: &Console) {
    let mut generation = u64::MAX;
    let mut stack: Option<Stack> = None;
    loop {
        let (running, exit) = {
            let view = shared.lock();
            if view.generation != generation {
                generation = view.generation;
                stack = match (&view.nic, &view.memory) {
                    (Some(nic), Some(mem)) => Some(build(nic, mem)),
                    _ => None,
                };
            }
            (view.running, view.exit)
        };
        if exit {
            return;
        }
        let mut fds = vec![shared.wake_fd()];
        let mut timeout = -1;
        if let (true, Some(s)) = (running, stack.as_mut()) {
            // Serve, then poll (sending what was served), until a poll changes no socket:
            // a frame taken in by that poll (the ACK that establishes a connection) must
            // reach the services before the thread sleeps.
            s.iface.poll(Instant::now(), &mut s.device, &mut s.sockets);
            loop {
                dhcp_step(s, shared, console);
                s.services.step(&mut s.sockets, shared, console);
                if s.iface.poll(Instant::now(), &mut s.device, &mut s.sockets) == PollResult::None {
                    break;
                }
            }
            timeout = s
                .iface
                .poll_delay(Instant::now(), &s.sockets)
                .map(|d| d.total_micros().div_ceil(1000).min(i32::MAX as u64) as i32)
                .unwrap_or(-1);
            fds.extend(s.device.fds());
        }
        wait(&fds, timeout);
        shared.clear_wake();
    }
}

fn build(nic: &shared::NicLink, mem: &crate::memory::GuestMemory) -> Stack {
    let mut device = TapDevice::new(nic.queues.clone());
    let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(nic.mac)));
    config.random_seed = u64::from_le_bytes([
        nic.mac[0], nic.mac[1], nic.mac[2], nic.mac[3], nic.mac[4], nic.mac[5], 0x5a, 0xa5,
    ]);
    let mut iface = Interface::new(config, &mut device, Instant::now());
    let mut sockets = SocketSet::new(Vec::new());
    let dhcp = match mem.address {
        Some(ip) => {
            configure(&mut iface, ip);
            None
        }
        None => Some(sockets.add(dhcpv4::Socket::new())),
    };
    let services = Services::new(mem.program.clone(), mem.hostname.clone(), &mut sockets);
    Stack {
        device,
        iface,
        sockets,
        services,
        dhcp,
    }
}

fn configure(iface: &mut Interface, ip: IpConfig) {
    iface.update_ip_addrs(|addrs| {
        addrs.clear();
        let _ = addrs.push(IpCidr::Ipv4(Ipv4Cidr::new(ip.address, ip.prefix)));
    });
    iface.routes_mut().remove_default_ipv4_route();
    if let Some(gw) = ip.gateway {
        let _ = iface.routes_mut().add_default_ipv4_route(gw);
    }
}

/// A DHCP lease becomes the guest's address, kept in its memory like a real guest's.
fn dhcp_step(s: &mut Stack, shared: &GuestShared, console: &Console) {
    let Some(h) = s.dhcp else { return };
    let event = s.sockets.get_mut::<dhcpv4::Socket>(h).poll();
    match event {
        Some(dhcpv4::Event::Configured(c)) => {
            let ip = IpConfig {
                address: c.address.address(),
                prefix: c.address.prefix_len(),
                gateway: c.router,
            };
            configure(&mut s.iface, ip);
            if let Some(m) = shared.lock().memory.as_mut() {
                m.address = Some(ip);
            }
            console.line(&format!("dhcp: eth0 {}/{}", ip.address, ip.prefix));
        }
        // The client reports Deconfigured once at start too, with nothing to lose.
        Some(dhcpv4::Event::Deconfigured) if !s.iface.ip_addrs().is_empty() => {
            s.iface.update_ip_addrs(|a| a.clear());
            console.line("dhcp: eth0 lost its lease");
        }
        Some(dhcpv4::Event::Deconfigured) | None => {}
    }
}

fn wait(fds: &[i32], timeout_ms: i32) {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: a live array of pollfds of the given length.
    unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
}
