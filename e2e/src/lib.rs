//! Real-component testbed for vk-cocoon end-to-end tests.
//!
//! A [`Testbed`] runs what a cocoon node talks to in production, on loopback only: etcd,
//! kube-apiserver, kube-scheduler and kube-controller-manager (pods reach a node through the
//! scheduler, by its pool label and the provider taint's toleration; the node lifecycle, garbage
//! collector and ServiceAccount controllers run as in a cluster), a distribution registry,
//! Prometheus, metrics-server and the cocoon simulator, or with `TESTBED_COCOON=real` the real
//! cocoon CLI on the cloud-hypervisor stand-in ([`real_cocoon`]). Everything it starts lives
//! under one run directory in `/tmp/vk-cocoon-testbed/`, so a run that was killed with SIGKILL
//! is swept by the next one (see [`rundir`] and [`procs`]).

pub mod apiserver;
pub mod apiserver_metrics;
pub mod bins;
pub mod certs;
pub mod cni;
pub mod component;
pub mod controller_manager;
pub mod daemon;
pub mod etcd;
pub mod guest_image;
pub mod guest_wire;
pub mod kube;
pub mod kubeconfig;
pub mod log;
pub mod metrics_server;
pub mod null_node;
pub mod operator;
pub mod ports;
pub mod procs;
pub mod prometheus;
pub mod ready;
pub mod real_cocoon;
pub mod registry;
pub mod rundir;
pub mod scheduler;
pub mod sim;
pub mod skip;
pub mod testbed;

pub use testbed::{Testbed, TestbedOptions};
