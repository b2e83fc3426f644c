//! SIGTERM and SIGINT (N18), listened for once for the life of the loop.
//!
//! Once a handler is installed the signal no longer kills the process, and a listener only
//! hears signals that arrive after it was made. A listener made anew on every loop turn
//! therefore lost any signal that came while the loop was busy between turns, and the daemon
//! ran on until systemd's final SIGKILL.

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};

pub struct Shutdown {
    term: Signal,
    int: Signal,
}

impl Shutdown {
    pub fn listen() -> Result<Shutdown> {
        Ok(Shutdown {
            term: signal(SignalKind::terminate()).context("installing the SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("installing the SIGINT handler")?,
        })
    }

    /// Resolves with the signal's name once one has arrived since [`Shutdown::listen`].
    pub async fn requested(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The loop awaits `requested` only between events; a SIGTERM that arrives while it
    /// reduces one must still end it at the next turn.
    #[tokio::test]
    async fn a_signal_that_arrives_between_turns_is_not_lost() {
        let mut shutdown = Shutdown::listen().unwrap();
        // A turn that is not waiting on the listener.
        let turn = tokio::time::timeout(Duration::from_millis(50), shutdown.requested()).await;
        assert!(turn.is_err(), "no signal yet");
        // SAFETY: sends SIGTERM to this process, whose handler is installed above.
        assert_eq!(unsafe { libc::kill(libc::getpid(), libc::SIGTERM) }, 0);
        // The runtime takes the signal in while the loop is still busy with its turn.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let next = tokio::time::timeout(Duration::from_secs(5), shutdown.requested()).await;
        assert_eq!(next.ok(), Some("SIGTERM"));
    }
}
