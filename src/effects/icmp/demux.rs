//! Which waiting probe an echo reply belongs to. Every probe shares one socket, so a reply is
//! only trusted when it names the target that was pinged, our identifier (raw sockets see the
//! whole host's ICMP, other pingers' included), the sequence the probe was given and our payload.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::oneshot;

/// An echo reply as it came off the socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub from: Ipv4Addr,
    pub identifier: u16,
    pub sequence: u16,
    pub payload: Vec<u8>,
}

type Key = (Ipv4Addr, u16);

struct Slot {
    /// Tells a waiter apart from a later one that was given the same key after it.
    token: u64,
    done: oneshot::Sender<Instant>,
}

#[derive(Default)]
struct Table {
    next_sequence: u16,
    next_token: u64,
    waiting: HashMap<Key, Slot>,
}

pub struct Demux {
    /// `None` on datagram sockets: the kernel writes its own identifier into the request and
    /// hands the socket only the replies that carry it.
    identifier: Option<u16>,
    payload: &'static [u8],
    table: Mutex<Table>,
}

impl Demux {
    pub fn new(identifier: Option<u16>, payload: &'static [u8]) -> Arc<Self> {
        Arc::new(Self {
            identifier,
            payload,
            table: Mutex::new(Table::default()),
        })
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // A panic while holding the lock cannot leave the map half-updated: every change is a
        // single insert or remove.
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Gives the probe of `ip` a sequence no other waiting probe of `ip` holds.
    pub fn register(self: &Arc<Self>, ip: Ipv4Addr) -> Waiter {
        let (done, rx) = oneshot::channel();
        let mut t = self.table();
        // Bounded: a key is free unless 65,536 probes of one address are waiting at once.
        let mut sequence = t.next_sequence;
        for _ in 0..=u16::MAX {
            if !t.waiting.contains_key(&(ip, sequence)) {
                break;
            }
            sequence = sequence.wrapping_add(1);
        }
        t.next_sequence = sequence.wrapping_add(1);
        let token = t.next_token;
        t.next_token += 1;
        t.waiting.insert((ip, sequence), Slot { token, done });
        Waiter {
            demux: Arc::clone(self),
            key: (ip, sequence),
            token,
            rx,
        }
    }

    /// Completes the probe the reply answers; `false` if none is waiting for it (not ours,
    /// a duplicate, or late: its probe already gave up).
    pub fn deliver(&self, reply: &Reply, at: Instant) -> bool {
        if self.identifier.is_some_and(|id| id != reply.identifier) || reply.payload != self.payload
        {
            return false;
        }
        let slot = self.table().waiting.remove(&(reply.from, reply.sequence));
        match slot {
            Some(slot) => slot.done.send(at).is_ok(),
            None => false,
        }
    }

    pub fn waiting(&self) -> usize {
        self.table().waiting.len()
    }
}

/// One probe's claim on a (target, sequence); dropping it (reply, deadline, or the probe task
/// aborted) frees the key, so a late reply finds nobody.
pub struct Waiter {
    demux: Arc<Demux>,
    key: Key,
    token: u64,
    rx: oneshot::Receiver<Instant>,
}

impl Waiter {
    pub fn sequence(&self) -> u16 {
        self.key.1
    }

    /// When the reply arrived. Cancel-safe, so it can be raced against a resend timer and
    /// awaited again.
    pub async fn reply(&mut self) -> Instant {
        match (&mut self.rx).await {
            Ok(at) => at,
            // Unreachable: the sender stays in the table while this waiter holds its key.
            Err(_) => std::future::pending().await,
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut t = self.demux.table();
        if t.waiting
            .get(&self.key)
            .is_some_and(|s| s.token == self.token)
        {
            t.waiting.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: u16 = 0x1234;
    const PAYLOAD: &[u8] = b"vk-cocoon";
    const TARGET: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 7);

    fn reply(w: &Waiter) -> Reply {
        Reply {
            from: TARGET,
            identifier: ID,
            sequence: w.sequence(),
            payload: PAYLOAD.to_vec(),
        }
    }

    fn answered(w: &mut Waiter) -> bool {
        futures::FutureExt::now_or_never(w.reply()).is_some()
    }

    #[test]
    fn the_matching_reply_completes_its_probe_once() {
        let d = Demux::new(Some(ID), PAYLOAD);
        let mut w = d.register(TARGET);
        let r = reply(&w);
        assert!(d.deliver(&r, Instant::now()));
        assert!(answered(&mut w));
        assert!(!d.deliver(&r, Instant::now()), "a duplicate finds nobody");
    }

    #[test]
    fn wrong_identifier_sequence_source_or_payload_complete_nothing() {
        let d = Demux::new(Some(ID), PAYLOAD);
        let mut w = d.register(TARGET);
        let good = reply(&w);
        let bad = [
            Reply {
                identifier: ID ^ 1,
                ..good.clone()
            },
            Reply {
                sequence: good.sequence.wrapping_add(1),
                ..good.clone()
            },
            Reply {
                from: Ipv4Addr::new(10, 0, 0, 8),
                ..good.clone()
            },
            Reply {
                payload: b"ping".to_vec(),
                ..good.clone()
            },
        ];
        for r in &bad {
            assert!(!d.deliver(r, Instant::now()), "{r:?} must not match");
        }
        assert!(!answered(&mut w));
        assert_eq!(d.waiting(), 1, "the probe still waits for its own reply");
        assert!(d.deliver(&good, Instant::now()));
        assert!(answered(&mut w));
    }

    #[test]
    fn a_reply_after_the_probe_gave_up_is_dropped() {
        let d = Demux::new(Some(ID), PAYLOAD);
        let w = d.register(TARGET);
        let late = reply(&w);
        drop(w);
        assert_eq!(d.waiting(), 0, "giving up frees the key");
        assert!(!d.deliver(&late, Instant::now()));
    }

    #[test]
    fn a_late_reply_does_not_complete_the_next_probe_of_the_same_target() {
        let d = Demux::new(Some(ID), PAYLOAD);
        let first = d.register(TARGET);
        let late = reply(&first);
        drop(first);
        let mut second = d.register(TARGET);
        assert_ne!(second.sequence(), late.sequence);
        assert!(!d.deliver(&late, Instant::now()));
        assert!(!answered(&mut second));
    }

    #[test]
    fn probes_of_one_target_get_distinct_sequences_and_their_own_replies() {
        let d = Demux::new(Some(ID), PAYLOAD);
        let mut a = d.register(TARGET);
        let mut b = d.register(TARGET);
        assert_ne!(a.sequence(), b.sequence());
        assert!(d.deliver(&reply(&b), Instant::now()));
        assert!(answered(&mut b));
        assert!(!answered(&mut a));
    }

    #[test]
    fn sequences_wrap_around_past_the_ones_still_waiting() {
        let d = Demux::new(Some(ID), PAYLOAD);
        let held = d.register(TARGET);
        for _ in 0..u16::MAX {
            let w = d.register(TARGET);
            assert_ne!(w.sequence(), held.sequence());
        }
        let next = d.register(TARGET);
        assert_ne!(next.sequence(), held.sequence());
    }

    #[test]
    fn dropping_a_finished_waiter_leaves_a_newer_one_with_the_same_key() {
        let d = Demux::new(Some(ID), PAYLOAD);
        let old = d.register(TARGET);
        let key_seq = old.sequence();
        assert!(d.deliver(&reply(&old), Instant::now()));
        // Wrap the counter back to the freed key, then drop the old claim after the new one.
        let mut newer = None;
        for _ in 0..=u16::MAX {
            let w = d.register(TARGET);
            if w.sequence() == key_seq {
                newer = Some(w);
                break;
            }
        }
        let mut newer = newer.expect("the freed sequence comes round again");
        drop(old);
        assert_eq!(d.waiting(), 1);
        assert!(d.deliver(&reply(&newer), Instant::now()));
        assert!(answered(&mut newer));
    }

    #[test]
    fn datagram_sockets_match_on_sequence_and_source_alone() {
        let d = Demux::new(None, PAYLOAD);
        let mut w = d.register(TARGET);
        let r = Reply {
            identifier: 0xbeef,
            ..reply(&w)
        };
        assert!(d.deliver(&r, Instant::now()));
        assert!(answered(&mut w));
    }
}
