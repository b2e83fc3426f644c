//! Media types, artifact types and annotation keys of the snapshot and cloud-image artifacts.

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
/// What a manifest GET accepts: the snapshot reader resolves indexes itself.
pub const MANIFEST_ACCEPT: &[&str] = &[OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST];

pub const SNAPSHOT_V1: &str = "application/vnd.cocoonstack.snapshot.v1+json";
pub const SNAPSHOT_V2: &str = "application/vnd.cocoonstack.snapshot.v2+json";
pub const SNAPSHOT_CONFIG: &str = "application/vnd.cocoonstack.snapshot.config.v1+json";
pub const OS_IMAGE: &str = "application/vnd.cocoonstack.os-image.v1+json";
pub const WINDOWS_IMAGE: &str = "application/vnd.cocoonstack.windows-image.v1+json";
pub const OCI_IMAGE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_IMAGE_CONFIG: &str = "application/vnd.docker.container.image.v1+json";

pub const VM_CONFIG: &str = "application/vnd.cocoonstack.vm.config+json";
pub const VM_STATE: &str = "application/vnd.cocoonstack.vm.state+json";
pub const VM_MEMORY: &str = "application/vnd.cocoonstack.vm.memory";
pub const VM_CIDATA: &str = "application/vnd.cocoonstack.vm.cidata";
pub const DISK_QCOW2: &str = "application/vnd.cocoonstack.disk.qcow2";
pub const DISK_RAW: &str = "application/vnd.cocoonstack.disk.raw";
pub const OCTET_STREAM: &str = "application/octet-stream";
pub const ZSTD_SUFFIX: &str = "+zstd";

/// Layer media types a snapshot may carry (after `+zstd` is stripped). The `.part` and
/// Windows disk types belong to cloud images only.
pub const SNAPSHOT_LAYER_TYPES: &[&str] = &[
    VM_CONFIG,
    VM_STATE,
    VM_MEMORY,
    VM_CIDATA,
    DISK_QCOW2,
    DISK_RAW,
    OCTET_STREAM,
];

/// Disk layers of a cloud image; anything else in it (checksums, …) is ignored.
pub const CLOUD_DISK_TYPES: &[&str] = &[
    DISK_QCOW2,
    DISK_RAW,
    "application/vnd.cocoonstack.disk.qcow2.part",
    "application/vnd.cocoonstack.disk.raw.part",
    "application/vnd.cocoonstack.windows.disk.qcow2",
    "application/vnd.cocoonstack.windows.disk.raw",
    "application/vnd.cocoonstack.windows.disk.qcow2.part",
    "application/vnd.cocoonstack.windows.disk.raw.part",
];

pub const ANN_TITLE: &str = "org.opencontainers.image.title";
pub const ANN_CREATED: &str = "org.opencontainers.image.created";
pub const ANN_BASE_IMAGE: &str = "cocoonstack.snapshot.baseimage";
pub const ANN_FROM_NODE: &str = "cocoonstack.snapshot.from-node";
/// The owner record `<namespace>/<pod>` of a snapshot the daemon pushed (T5).
pub const ANN_OWNER: &str = reconcilers::owner::ANNOTATION;
pub const ANN_CHUNK_INDEX: &str = "cocoonstack.chunk.index";
pub const ANN_CHUNK_COUNT: &str = "cocoonstack.chunk.count";
/// K7.3: on every layer of a snapshot file, `sha256:<hex>` of the file's body in the export
/// (the data segments of a sparse file, in order): what a peer's copy is checked against.
pub const ANN_FILE_SHA256: &str = "cocoonstack.snapshot.file.sha256";

/// The layer media type of a snapshot file, by its name.
pub fn layer_type(file: &str) -> &'static str {
    match file {
        "config.json" => VM_CONFIG,
        "state.json" => VM_STATE,
        "memory-ranges" => VM_MEMORY,
        "cidata.img" => VM_CIDATA,
        f if f.ends_with(".qcow2") => DISK_QCOW2,
        f if f.ends_with(".raw") => DISK_RAW,
        _ => OCTET_STREAM,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_types_by_file_name() {
        assert_eq!(layer_type("config.json"), VM_CONFIG);
        assert_eq!(layer_type("state.json"), VM_STATE);
        assert_eq!(layer_type("memory-ranges"), VM_MEMORY);
        assert_eq!(layer_type("cidata.img"), VM_CIDATA);
        assert_eq!(layer_type("overlay.qcow2"), DISK_QCOW2);
        assert_eq!(layer_type("data.qcow2"), DISK_QCOW2);
        assert_eq!(layer_type("cow.raw"), DISK_RAW);
        assert_eq!(layer_type("cocoon.json"), OCTET_STREAM);
        assert_eq!(layer_type("mem"), OCTET_STREAM);
    }
}
