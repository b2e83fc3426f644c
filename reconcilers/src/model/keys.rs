//! Annotation, label and reason strings of the contract (ANN-1). Exact bytes.

pub const VM_NAME: &str = "vm.cocoonstack.io/name";
pub const VM_ID: &str = "vm.cocoonstack.io/id";
pub const VM_IP: &str = "vm.cocoonstack.io/ip";
pub const VNC_PORT: &str = "vm.cocoonstack.io/vnc-port";
pub const BACKEND: &str = "vm.cocoonstack.io/backend";
pub const NO_DIRECT_IO: &str = "vm.cocoonstack.io/no-direct-io";
pub const FORK_FROM: &str = "vm.cocoonstack.io/fork-from";
pub const CLONE_FROM_DIR: &str = "vm.cocoonstack.io/clone-from-dir";
pub const PROBE_PORT: &str = "vm.cocoonstack.io/probe-port";
pub const HIBERNATE: &str = "vm.cocoonstack.io/hibernate";
pub const RESTORE_FROM_HIBERNATE: &str = "vm.cocoonstack.io/restore-from-hibernate";
pub const KEEP_SNAPSHOT_ON_DELETE: &str = "vm.cocoonstack.io/keep-snapshot-on-delete";
pub const POST_CLONE_STATE: &str = "vm.cocoonstack.io/post-clone-state";
pub const POST_CLONE_HINT: &str = "vm.cocoonstack.io/post-clone-hint";
pub const POST_CLONE_ERRORS: &str = "vm.cocoonstack.io/post-clone-errors";
pub const LIFECYCLE_STATE: &str = "vm.cocoonstack.io/lifecycle-state";
pub const LIFECYCLE_GENERATION: &str = "vm.cocoonstack.io/lifecycle-observed-generation";
pub const LIFECYCLE_MESSAGE: &str = "vm.cocoonstack.io/lifecycle-state-message";

pub const MANAGED: &str = "cocoonset.cocoonstack.io/managed";
pub const MODE: &str = "cocoonset.cocoonstack.io/mode";
pub const IMAGE: &str = "cocoonset.cocoonstack.io/image";
pub const OS: &str = "cocoonset.cocoonstack.io/os";
pub const STORAGE: &str = "cocoonset.cocoonstack.io/storage";
pub const NETWORK: &str = "cocoonset.cocoonstack.io/network";
pub const SNAPSHOT_POLICY: &str = "cocoonset.cocoonstack.io/snapshot-policy";
pub const FORCE_PULL: &str = "cocoonset.cocoonstack.io/force-pull";
pub const GENERATION: &str = "cocoonset.cocoonstack.io/generation";

pub const CPU_CLASS_SELECTOR: &str = "cocoonstack.io/snapshot-cpu-class";

/// Messages are capped so a runaway error text cannot bloat the pod object.
pub const MESSAGE_LIMIT: usize = 4096;
