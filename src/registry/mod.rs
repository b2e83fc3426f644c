//! Snapshot and cloud-image transfer with the OCI registry named by `OCI_REGISTRY`: streaming
//! push of `cocoon snapshot export`, fail-closed pull into `cocoon snapshot import`, cloud-image
//! pull, inspection and tag deletion. The artifact formats are shared with the operator and
//! every other node, so the writer emits exactly them and the reader refuses anything else.

mod auth;
mod blob;
pub mod classify;
pub mod cocoon_pipe;
mod encode;
#[cfg(test)]
mod fake_registry;
pub mod manifest;
pub mod media;
pub mod owner;
mod pull;
mod push;
#[cfg(test)]
mod reader_tests;
pub mod reference;
mod spool;
pub mod tar_stream;
mod upload;

use std::path::PathBuf;
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Reference, RegistryOperation};

pub use classify::{ArtifactKind, Format};
pub use manifest::{ConfigBlob, Descriptor, Manifest};
pub use pull::{valid_snapshot_name, PullOutcome};
pub use push::{PushKnobs, PushOutcome};
pub use reference::{Base, RelativeRef, Target};

use crate::config::SnapshotTransfer;
use reconcilers::vm::CocoonError;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegistryError {
    /// The tag (or repository) does not exist: the registry answered 404.
    Absent(String),
    /// The artifact, or the data fed to a push, breaks the contract: wrong media type,
    /// missing title, a blob whose digest or size does not match, … Never retried blindly.
    Refused(String),
    /// The registry could not be reached or answered something other than the contract's
    /// statuses; the state of the tag is unknown.
    Transport(String),
    /// The local side failed: the export stream, a chunk's temp file, the sink.
    Local(String),
    /// cocoon's export or import failed; classified as every cocoon error is.
    Cocoon(CocoonError),
    /// T7: the tag holds a snapshot another namespace owns; nothing was moved.
    Foreign(String),
}

impl std::fmt::Display for RegistryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RegistryError::Absent(m) => write!(f, "absent from the registry: {m}"),
            RegistryError::Refused(m) => write!(f, "refused: {m}"),
            RegistryError::Transport(m) => write!(f, "registry transport: {m}"),
            RegistryError::Local(m) => write!(f, "local side: {m}"),
            RegistryError::Cocoon(e) => write!(f, "cocoon: {}", e.message),
            RegistryError::Foreign(m) => write!(f, "refused: {m}"),
        }
    }
}

impl std::error::Error for RegistryError {}

/// What a tag holds, read from its manifest and (for snapshots) its config blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteSnapshot {
    /// Digest of the manifest the tag points at (of the index, when it is one).
    pub digest: String,
    pub kind: ArtifactKind,
    /// `Some` for snapshots.
    pub format: Option<Format>,
    /// The identity anchor for wake verification; empty unless a snapshot.
    pub snapshot_id: String,
    pub base_image: Option<String>,
    pub from_node: Option<String>,
    pub created: Option<String>,
    pub hypervisor: String,
    /// The resolved image manifest (the index child when the tag is an index).
    pub manifest: Manifest,
    pub config: Option<ConfigBlob>,
}

/// What `delete_tag` found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deleted {
    Removed,
    WasAbsent,
}

/// One registry base; cheap to clone (the HTTP clients are shared).
#[derive(Clone)]
pub struct Registry {
    base: Base,
    client: oci_client::Client,
    http: reqwest::Client,
    auth: auth::Credentials,
    spool_dir: PathBuf,
    /// Largest zstd window a pulled frame may ask for, from the pull budget.
    window_log_max: u32,
    /// Counts frames refused for inflating past their entry's size.
    caps: crate::caps::CapCount,
    /// T15 (`VK_PUBLIC_SNAPSHOTS`): the repositories whose record-less tags are public bases.
    public_bases: std::sync::Arc<Vec<String>>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("base", &self.base)
            .field("spool_dir", &self.spool_dir)
            .finish_non_exhaustive()
    }
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A registry that sends nothing for this long on an open transfer is treated as gone.
const STALL_TIMEOUT: Duration = Duration::from_secs(120);

impl Registry {
    /// `base` is `OCI_REGISTRY`: `host[:port][/prefix]`. Credentials come from the Docker
    /// config; the transport is HTTPS except for loopback, RFC 1918 and `*.local` hosts.
    pub fn from_config(base: &str) -> Result<Registry, RegistryError> {
        let base = Base::parse(base).map_err(RegistryError::Refused)?;
        // reqwest is built without a default crypto provider; ring is the one the daemon
        // already carries. A provider installed earlier wins.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let protocol = if base.plain_http() {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        };
        let client = oci_client::Client::new(ClientConfig {
            protocol,
            // One streamed PUT per blob: chunked PATCHes would cost a round trip per 4 MiB.
            use_monolithic_push: true,
            platform_resolver: None,
            connect_timeout: Some(CONNECT_TIMEOUT),
            read_timeout: Some(STALL_TIMEOUT),
            ..Default::default()
        });
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(STALL_TIMEOUT)
            .build()
            .map_err(|e| RegistryError::Transport(format!("HTTP client: {e}")))?;
        let auth = auth::Credentials::docker_config(&base.host);
        Ok(Registry {
            base,
            client,
            http,
            auth,
            spool_dir: std::env::temp_dir(),
            window_log_max: window_log_for(2048),
            caps: crate::caps::CapCount::default(),
            public_bases: std::sync::Arc::default(),
        })
    }

    /// T15: the repositories whose tags without an owner record are public bases; every
    /// other record-less tag is nobody's to pull or push over.
    pub fn with_public_bases(mut self, bases: Vec<String>) -> Self {
        self.public_bases = std::sync::Arc::new(bases);
        self
    }

    /// T15: which record-less snapshots are public, for the checks next to each transfer.
    pub fn bases(&self) -> reconcilers::owner::Bases<'_> {
        reconcilers::owner::Bases::Listed(&self.public_bases)
    }

    /// Where refusals of the decode's cap are counted.
    pub fn with_caps(mut self, caps: crate::caps::CapCount) -> Self {
        self.caps = caps;
        self
    }

    /// Where a v2 chunk waits, compressed, for its digest (`VK_STAGING_DIR` in the daemon).
    pub fn with_spool_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.spool_dir = dir.into();
        self
    }

    /// The pull budget (`SNAPSHOT_PULL_BUDGET_MIB`). The reader is sequential — no prefetch,
    /// no parallel decode — so the only memory a pulled artifact can make it take is a zstd
    /// frame's window; frames that would need more than the budget are refused.
    pub fn with_transfer(mut self, t: &SnapshotTransfer) -> Self {
        self.window_log_max = window_log_for(t.pull_budget_mib);
        self
    }

    pub fn with_auth(mut self, auth: RegistryAuth) -> Self {
        self.auth = auth::Credentials::fixed(auth);
        self
    }

    pub fn spool_dir(&self) -> &std::path::Path {
        &self.spool_dir
    }

    pub fn base(&self) -> &Base {
        &self.base
    }

    /// `<base>/<name>` as the registry sees it (without the host).
    pub fn repository(&self, name: &str) -> Result<String, RegistryError> {
        self.base.repository(name).map_err(RegistryError::Refused)
    }

    fn reference(&self, name: &str, target: &Target) -> Result<Reference, RegistryError> {
        let repo = self.repository(name)?;
        Ok(match target {
            Target::Tag(t) => Reference::with_tag(self.base.host.clone(), repo, t.clone()),
            Target::Digest(d) => Reference::with_digest(self.base.host.clone(), repo, d.clone()),
        })
    }

    fn target(tag: &str) -> Result<Target, RegistryError> {
        Target::parse(tag).map_err(RegistryError::Refused)
    }

    fn scheme(&self) -> &'static str {
        if self.base.plain_http() {
            "http"
        } else {
            "https"
        }
    }

    /// GET a manifest; `Absent` only for a genuine not-found answer.
    async fn get_manifest(
        &self,
        r: &Reference,
    ) -> Result<(Manifest, Vec<u8>, String), RegistryError> {
        let (body, digest) = self
            .client
            .pull_manifest_raw(r, &self.auth.get().await, media::MANIFEST_ACCEPT)
            .await
            .map_err(|e| oci_error(&format!("GET manifest {r}"), e))?;
        if body.len() > MAX_MANIFEST_BYTES {
            return Err(RegistryError::Refused(format!(
                "manifest {r} is {} bytes, over the 4 MiB cap",
                body.len()
            )));
        }
        let m: Manifest = serde_json::from_slice(&body)
            .map_err(|e| RegistryError::Refused(format!("manifest {r} does not parse: {e}")))?;
        Ok((m, body.to_vec(), digest))
    }

    /// The tag's manifest; an index resolves to its `linux/amd64` child, else its first child
    /// of a known architecture, fetched by digest from the same repository.
    async fn resolve(
        &self,
        name: &str,
        tag: &str,
        follow_index: bool,
    ) -> Result<Resolved, RegistryError> {
        let r = self.reference(name, &Self::target(tag)?)?;
        let (m, _, digest) = self.get_manifest(&r).await?;
        if !follow_index || classify::classify(&m) != ArtifactKind::Index {
            return Ok(Resolved {
                manifest: m,
                digest,
                via_index: false,
            });
        }
        let child = classify::index_child(&m)
            .ok_or_else(|| {
                RegistryError::Refused(format!("index {r} has no child with a known platform"))
            })?
            .digest
            .clone();
        if !reference::valid_digest(&child) {
            return Err(RegistryError::Refused(format!(
                "index {r} names child {child:?}, not a sha256 digest"
            )));
        }
        let cr = self.reference(name, &Target::Digest(child.clone()))?;
        // oci-client checks the body against the digest asked for.
        let (cm, _, _) = self.get_manifest(&cr).await?;
        if classify::classify(&cm) == ArtifactKind::Index {
            return Err(RegistryError::Refused(format!(
                "index {r} points at another index"
            )));
        }
        Ok(Resolved {
            manifest: cm,
            digest,
            via_index: true,
        })
    }

    /// What `name:tag` holds. `Ok(None)` only when the registry says the tag does not exist.
    pub async fn inspect(
        &self,
        name: &str,
        tag: &str,
    ) -> Result<Option<RemoteSnapshot>, RegistryError> {
        let (m, digest) = match self.resolve(name, tag, true).await {
            Ok(x) => (x.manifest, x.digest),
            Err(RegistryError::Absent(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        let kind = classify::classify(&m);
        let mut out = RemoteSnapshot {
            digest,
            kind,
            format: None,
            snapshot_id: String::new(),
            base_image: m.annotations.get(media::ANN_BASE_IMAGE).cloned(),
            from_node: m.annotations.get(media::ANN_FROM_NODE).cloned(),
            created: m.annotations.get(media::ANN_CREATED).cloned(),
            hypervisor: String::new(),
            manifest: m,
            config: None,
        };
        if kind == ArtifactKind::Snapshot {
            let format =
                classify::check_snapshot_manifest(&out.manifest).map_err(RegistryError::Refused)?;
            let config = self.fetch_config(name, &out.manifest).await?;
            out.format = Some(format);
            out.snapshot_id = config.snapshot_id.clone();
            out.hypervisor = config.hypervisor.clone();
            out.config = Some(config);
        }
        Ok(Some(out))
    }

    /// The config blob, capped at 64 MiB, digest and size verified.
    async fn fetch_config(&self, name: &str, m: &Manifest) -> Result<ConfigBlob, RegistryError> {
        let desc = m
            .config
            .as_ref()
            .ok_or_else(|| RegistryError::Refused("snapshot manifest has no config".into()))?;
        if desc.size > classify::MAX_CONFIG_BYTES {
            return Err(RegistryError::Refused(format!(
                "config blob of {} bytes exceeds the 64 MiB cap",
                desc.size
            )));
        }
        let r = self.reference(name, &Target::Tag("latest".into()))?;
        let mut blob = blob::VerifiedBlob::open(&self.client, &r, desc).await?;
        let mut bytes = Vec::with_capacity(desc.size as usize);
        while let Some(b) = blob.next().await? {
            bytes.extend_from_slice(&b);
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| RegistryError::Refused(format!("config blob does not parse: {e}")))
    }

    /// Removes `name:tag`. 200/202 and 404 are success; a registry that refuses tag deletes
    /// (405 or `UNSUPPORTED`) gets the manifest deleted by the digest the tag resolves to.
    pub async fn delete_tag(&self, name: &str, tag: &str) -> Result<Deleted, RegistryError> {
        let target = Self::target(tag)?;
        let r = self.reference(name, &target)?;
        match self.delete_manifest(&r, target.as_str()).await? {
            DeleteAnswer::Done(d) => Ok(d),
            DeleteAnswer::Unsupported(why) => {
                let auth = self.auth.get().await;
                let digest = match self.client.fetch_manifest_digest(&r, &auth).await {
                    Ok(d) => d,
                    Err(e) => match oci_error(&format!("HEAD manifest {r}"), e) {
                        RegistryError::Absent(_) => return Ok(Deleted::WasAbsent),
                        e => return Err(e),
                    },
                };
                tracing::info!(reference = %r, %digest, "tag delete unsupported ({why}); deleting by digest");
                match self.delete_manifest(&r, &digest).await? {
                    DeleteAnswer::Done(d) => Ok(d),
                    DeleteAnswer::Unsupported(why) => Err(RegistryError::Transport(format!(
                        "registry refuses manifest deletes for {r}: {why}"
                    ))),
                }
            }
        }
    }

    /// `req` with push rights on `r`'s repository: the registry's bearer token when it uses
    /// token auth, else the Basic credentials, else nothing.
    async fn authorized(
        &self,
        mut req: reqwest::RequestBuilder,
        r: &Reference,
        what: &str,
    ) -> Result<reqwest::RequestBuilder, RegistryError> {
        let auth = self.auth.get().await;
        match self
            .client
            .auth(r, &auth, RegistryOperation::Push)
            .await
            .map_err(|e| RegistryError::Transport(format!("auth for {what}: {e}")))?
        {
            Some(token) => req = req.bearer_auth(token),
            None => {
                if let RegistryAuth::Basic(u, p) = &auth {
                    req = req.basic_auth(u, Some(p));
                }
            }
        }
        Ok(req)
    }

    async fn delete_manifest(
        &self,
        r: &Reference,
        what: &str,
    ) -> Result<DeleteAnswer, RegistryError> {
        let url = format!(
            "{}://{}/v2/{}/manifests/{what}",
            self.scheme(),
            self.base.host,
            r.repository()
        );
        let req = self
            .authorized(self.http.delete(&url), r, &format!("DELETE {url}"))
            .await?;
        let res = req
            .send()
            .await
            .map_err(|e| RegistryError::Transport(format!("DELETE {url}: {e}")))?;
        let status = res.status().as_u16();
        let body = res.text().await.unwrap_or_default();
        match status {
            200 | 202 => Ok(DeleteAnswer::Done(Deleted::Removed)),
            404 => Ok(DeleteAnswer::Done(Deleted::WasAbsent)),
            405 => Ok(DeleteAnswer::Unsupported(format!("405 {body}"))),
            _ if body.contains("UNSUPPORTED") => {
                Ok(DeleteAnswer::Unsupported(format!("{status} {body}")))
            }
            _ => Err(RegistryError::Transport(format!(
                "DELETE {url}: HTTP {status} {body}"
            ))),
        }
    }
}

/// A tag's image manifest, after index resolution.
struct Resolved {
    manifest: Manifest,
    /// Digest of what the tag points at (the index, when it is one).
    digest: String,
    via_index: bool,
}

/// log2 of the largest window within `budget_mib`, inside zstd's own limits (1 KiB .. 2 GiB).
fn window_log_for(budget_mib: u64) -> u32 {
    let bytes = budget_mib.saturating_mul(1 << 20).max(1 << 10);
    (63 - bytes.leading_zeros()).clamp(10, 31)
}

enum DeleteAnswer {
    Done(Deleted),
    Unsupported(String),
}

/// The distribution default; a manifest beyond it is not one we wrote.
const MAX_MANIFEST_BYTES: usize = 4 << 20;

/// Maps oci-client's errors: a not-found answer is `Absent`, a digest mismatch `Refused`,
/// everything else `Transport`.
pub(crate) fn oci_error(what: &str, e: OciDistributionError) -> RegistryError {
    let msg = format!("{what}: {e}");
    match &e {
        OciDistributionError::ServerError { code: 404, .. } => RegistryError::Absent(msg),
        OciDistributionError::RegistryError { envelope, .. }
            if !envelope.errors.is_empty()
                && envelope.errors.iter().all(|x| {
                    matches!(
                        x.code,
                        OciErrorCode::ManifestUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::NotFound
                    )
                }) =>
        {
            RegistryError::Absent(msg)
        }
        OciDistributionError::DigestError(_) => RegistryError::Refused(msg),
        _ => RegistryError::Transport(msg),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn pull_budget_caps_the_zstd_window() {
        assert_eq!(super::window_log_for(2048), 31);
        assert_eq!(super::window_log_for(8), 23);
        assert_eq!(super::window_log_for(1), 20);
        assert_eq!(super::window_log_for(1 << 30), 31);
    }
}
