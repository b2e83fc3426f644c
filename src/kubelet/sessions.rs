//! K3, K4, K13: how many long-running sessions of one kind (log streams; exec and
//! port-forward) run at once, on the node and per namespace. The node's cap bounds what the
//! root daemon spends; the namespace's share keeps one tenant from taking every slot while the
//! others wait.

use std::sync::Arc;

use dashmap::DashMap;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::caps::{Cap, CapCount};

/// The sessions of one kind.
pub struct Sessions {
    /// What a session is, for refusals ("log streams").
    what: &'static str,
    node: Arc<Semaphore>,
    node_cap: usize,
    namespace_cap: usize,
    running: Arc<DashMap<String, usize>>,
    count: CapCount,
}

/// One running session: its node slot and its place in its namespace's share, both given back
/// when it ends.
pub struct SessionPermit {
    _node: OwnedSemaphorePermit,
    namespace: String,
    running: Arc<DashMap<String, usize>>,
}

impl Sessions {
    /// `count` counts the refusals of a namespace over its share (M7).
    pub fn new(
        what: &'static str,
        node_cap: usize,
        namespace_cap: usize,
        count: CapCount,
    ) -> Arc<Sessions> {
        Arc::new(Sessions {
            what,
            node: Arc::new(Semaphore::new(node_cap)),
            node_cap,
            namespace_cap: namespace_cap.min(node_cap),
            running: Arc::new(DashMap::new()),
            count,
        })
    }

    /// A slot for a session of a pod in `namespace`, or why there is none (the words of a 503).
    pub fn try_acquire(&self, namespace: &str) -> Result<SessionPermit, String> {
        let mut mine = self.running.entry(namespace.to_string()).or_insert(0);
        if *mine >= self.namespace_cap {
            drop(mine);
            self.count.refused(Cap::NamespaceSessions);
            return Err(format!(
                "{} {} of namespace {namespace} are running on this node, its share; try again later",
                self.namespace_cap, self.what
            ));
        }
        let Ok(node) = self.node.clone().try_acquire_owned() else {
            if *mine == 0 {
                drop(mine);
                self.running.remove_if(namespace, |_, n| *n == 0);
            }
            return Err(format!(
                "{} {} are running on this node; try again later",
                self.node_cap, self.what
            ));
        };
        *mine += 1;
        Ok(SessionPermit {
            _node: node,
            namespace: namespace.to_string(),
            running: self.running.clone(),
        })
    }

    /// Sessions running for `namespace` now.
    pub fn running(&self, namespace: &str) -> usize {
        self.running.get(namespace).map_or(0, |n| *n)
    }
}

impl Drop for SessionPermit {
    fn drop(&mut self) {
        if let Some(mut n) = self.running.get_mut(&self.namespace) {
            *n = n.saturating_sub(1);
        }
        self.running.remove_if(&self.namespace, |_, n| *n == 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_gets_its_share_and_the_others_still_get_theirs() {
        let s = Sessions::new("exec sessions", 4, 2, CapCount::default());
        let a1 = s.try_acquire("a").unwrap();
        let _a2 = s.try_acquire("a").unwrap();
        let refused = s.try_acquire("a").err().unwrap();
        assert!(refused.contains("namespace a"), "{refused}");
        let _b1 = s.try_acquire("b").unwrap();
        let _b2 = s.try_acquire("b").unwrap();
        // The node is full now: c is refused by the node's cap, not a share.
        let full = s.try_acquire("c").err().unwrap();
        assert!(full.starts_with("4 exec sessions are running"), "{full}");
        assert_eq!(s.running("c"), 0);
        drop(a1);
        assert_eq!(s.running("a"), 1);
        let _c1 = s.try_acquire("c").unwrap();
    }

    #[test]
    fn an_ended_session_gives_its_slots_back() {
        let s = Sessions::new("log streams", 1, 1, CapCount::default());
        for _ in 0..3 {
            let p = s.try_acquire("a").unwrap();
            assert!(s.try_acquire("b").is_err());
            drop(p);
        }
        assert_eq!(s.running("a"), 0);
        assert!(s.running.is_empty());
    }
}
