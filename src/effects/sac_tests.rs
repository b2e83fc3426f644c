//! The SAC dialog against an in-process console: each way a console fails ends the dialog at
//! the step an operator would look at.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use super::sac::{set_static_ips, SacFailure, SacNic, SacStage, SacTimeouts};
use super::sac_console::{distinct_nets, keep_tail, listed_ipv4};
use super::sac_fake::{Behaviour, FakeSac};

/// Small enough that a failing dialog ends quickly; the command limit stays roomy so a busy
/// test machine never turns an answer into a timeout.
fn quick() -> SacTimeouts {
    SacTimeouts {
        dial_retry: Duration::from_millis(10),
        dial_budget: Duration::from_millis(300),
        prompt_budget: Duration::from_millis(300),
        enum_tries: 3,
        enum_interval: Duration::from_millis(10),
        verify_tries: 3,
        verify_interval: Duration::from_millis(10),
        command: Duration::from_secs(5),
    }
}

fn nic(position: usize, ip: [u8; 4]) -> SacNic {
    SacNic {
        position,
        ip: Ipv4Addr::from(ip),
        mask: Ipv4Addr::new(255, 255, 255, 0),
        gateway: Ipv4Addr::new(10, 0, 0, 1),
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    socket: PathBuf,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("console.sock");
    Setup { _dir: dir, socket }
}

async fn run(fake: &FakeSac, nic_count: usize, nics: &[SacNic]) -> Result<(), SacFailure> {
    set_static_ips(&fake.socket, nic_count, nics, &quick()).await
}

fn stage(r: Result<(), SacFailure>) -> (SacStage, String) {
    let f = r.expect_err("the dialog should fail");
    (f.stage, f.message)
}

#[tokio::test]
async fn each_static_nic_is_set_on_the_interface_at_its_position() {
    let s = setup();
    let fake = FakeSac::start(&s.socket, 3, Behaviour::default());
    let nics = [nic(0, [10, 0, 0, 5]), nic(2, [10, 0, 2, 5])];
    run(&fake, 3, &nics).await.unwrap();
    let sets: Vec<String> = fake.lines().into_iter().filter(|l| l.len() > 1).collect();
    assert_eq!(
        sets,
        [
            "i 7 10.0.0.5 255.255.255.0 10.0.0.1",
            "i 17 10.0.2.5 255.255.255.0 10.0.0.1"
        ]
    );
    assert_eq!(
        fake.listing(),
        [
            (7, Ipv4Addr::new(10, 0, 0, 5)),
            (12, Ipv4Addr::new(169, 254, 10, 12)),
            (17, Ipv4Addr::new(10, 0, 2, 5)),
        ]
    );
}

#[tokio::test]
async fn a_socket_that_appears_late_is_dialled_again() {
    let s = setup();
    let late = Behaviour {
        bind_after: Duration::from_millis(50),
        ..Default::default()
    };
    let fake = FakeSac::start(&s.socket, 1, late);
    run(&fake, 1, &[nic(0, [10, 0, 0, 5])]).await.unwrap();
}

#[tokio::test]
async fn no_socket_fails_the_dial() {
    let s = setup();
    let r = set_static_ips(&s.socket, 1, &[nic(0, [10, 0, 0, 5])], &quick()).await;
    let (stage, message) = stage(r);
    assert_eq!(stage, SacStage::Dial);
    assert!(
        message.starts_with(&format!(
            "SAC console {}: cannot connect within 300ms: ",
            s.socket.display()
        )),
        "{message}"
    );
}

#[tokio::test]
async fn no_static_nic_leaves_the_console_alone() {
    let s = setup();
    set_static_ips(&s.socket, 2, &[], &quick()).await.unwrap();
}

#[tokio::test]
async fn a_console_that_never_prompts_fails_the_enumeration() {
    let s = setup();
    let silent = Behaviour {
        silent: true,
        ..Default::default()
    };
    let fake = FakeSac::start(&s.socket, 1, silent);
    let (stage, message) = stage(run(&fake, 1, &[nic(0, [10, 0, 0, 5])]).await);
    assert_eq!(stage, SacStage::Enum);
    assert_eq!(
        message,
        format!(
            "SAC console {}: no SAC> prompt within 300ms",
            s.socket.display()
        )
    );
}

#[tokio::test]
async fn too_few_listed_interfaces_fail_the_enumeration() {
    let s = setup();
    let short = Behaviour {
        lists: Some(1),
        ..Default::default()
    };
    let fake = FakeSac::start(&s.socket, 2, short);
    let (stage, message) = stage(run(&fake, 2, &[nic(0, [10, 0, 0, 5])]).await);
    assert_eq!(stage, SacStage::Enum);
    assert_eq!(
        message,
        "SAC listed 1 of 2 network interfaces after 3 tries"
    );
    assert_eq!(fake.lines().iter().filter(|l| *l == "i").count(), 3);
}

#[tokio::test]
async fn a_refused_address_fails_the_set_with_sacs_words() {
    let s = setup();
    let refuse = Behaviour {
        refuse_set: true,
        ..Default::default()
    };
    let fake = FakeSac::start(&s.socket, 1, refuse);
    let (stage, message) = stage(run(&fake, 1, &[nic(0, [10, 0, 0, 5])]).await);
    assert_eq!(stage, SacStage::Set);
    assert_eq!(
        message,
        "SAC refused `i 7 10.0.0.5 255.255.255.0 10.0.0.1`: SAC failed to set the IP Address."
    );
}

#[tokio::test]
async fn a_nic_beyond_the_listing_fails_the_set() {
    let s = setup();
    let fake = FakeSac::start(&s.socket, 1, Behaviour::default());
    let (stage, message) = stage(run(&fake, 1, &[nic(1, [10, 0, 1, 5])]).await);
    assert_eq!(stage, SacStage::Set);
    assert_eq!(message, "NIC 1 has no SAC interface: SAC listed 1 (Net: 7)");
}

#[tokio::test]
async fn an_address_that_never_shows_fails_the_verification() {
    let s = setup();
    let sticky = Behaviour {
        sticky: true,
        ..Default::default()
    };
    let fake = FakeSac::start(&s.socket, 2, sticky);
    let (stage, message) = stage(run(&fake, 2, &[nic(1, [10, 0, 1, 5])]).await);
    assert_eq!(stage, SacStage::Verify);
    assert_eq!(
        message,
        "SAC does not list Net: 12, Ip=10.0.1.5 (lists 169.254.10.12) after 3 tries"
    );
}

/// Output in single bytes, LF line ends, 100 KiB of noise before the first prompt, a pile of
/// extra prompts and an `EVENT:` notice: none of it changes what the dialog reads.
#[tokio::test]
async fn an_awkward_console_is_read_the_same() {
    let s = setup();
    let awkward = Behaviour {
        trickle: true,
        lf_only: true,
        banner: 100 * 1024,
        extra_prompts: 3,
        event: true,
        ..Default::default()
    };
    let fake = FakeSac::start(&s.socket, 2, awkward);
    run(&fake, 2, &[nic(0, [10, 0, 0, 5]), nic(1, [10, 0, 1, 5])])
        .await
        .unwrap();
    assert_eq!(
        fake.listing(),
        [
            (7, Ipv4Addr::new(10, 0, 0, 5)),
            (12, Ipv4Addr::new(10, 0, 1, 5))
        ]
    );
}

#[test]
fn only_ipv4_entries_count_and_each_interface_once() {
    let answer = "i\r\n\r\nSAC is retrieving IP Addresses...\r\n\r\n\
                  Net: 12, Ip=fe80::100c\r\n\
                  Net: 12, Ip=169.254.1.1  Subnet=255.255.0.0  Gateway=0.0.0.0\n\
                  Net: 7, Ip=10.0.0.5  Subnet=255.255.255.0  Gateway=10.0.0.1\r\
                  Net: 7, Ip=10.0.0.6  Subnet=255.255.255.0  Gateway=10.0.0.1\r\n\
                  Net: 22, Ip=fe80::1016\r\n";
    let listed = listed_ipv4(answer);
    assert_eq!(
        listed,
        [
            (12, Ipv4Addr::new(169, 254, 1, 1)),
            (7, Ipv4Addr::new(10, 0, 0, 5)),
            (7, Ipv4Addr::new(10, 0, 0, 6)),
        ]
    );
    assert_eq!(distinct_nets(&listed), [12, 7]);
}

#[test]
fn the_buffer_keeps_its_tail() {
    let mut buf: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
    assert_eq!(keep_tail(&mut buf, 10), 990);
    assert_eq!(buf, (990..1000).map(|i| i as u8).collect::<Vec<_>>());
    assert_eq!(keep_tail(&mut buf, 64), 0);
    assert_eq!(buf.len(), 10);
}

/// A console that prints far more than is kept before it prompts: the dialog still works on
/// the tail it keeps, and the dialog counts once against the guest-output cap.
#[tokio::test]
async fn a_flooding_console_is_counted_against_the_guest_caps() {
    let s = setup();
    let flood = Behaviour {
        banner: 4 * super::sac_console::MAX_BUFFERED,
        ..Default::default()
    };
    let fake = FakeSac::start(&s.socket, 1, flood);
    let metrics = crate::metrics::Metrics::new();
    let cap = metrics.cap_count();
    let nics = [nic(0, [10, 0, 0, 5])];
    super::sac::set_static_ips_capped(&fake.socket, 1, &nics, &quick(), &cap)
        .await
        .unwrap();
    let refused = metrics
        .cap_refusals
        .with_label_values(&[crate::caps::Cap::GuestOutput.as_str()])
        .get();
    assert_eq!(refused, 1);
}
