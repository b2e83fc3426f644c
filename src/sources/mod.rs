//! Sources turn the world into events for the loop. They translate; they never decide.

pub mod cocoon_stream;
pub mod dhcp_leases;
pub mod pod_view;
pub mod pods;

pub type EventTx = tokio::sync::mpsc::UnboundedSender<reconcilers::Event>;
