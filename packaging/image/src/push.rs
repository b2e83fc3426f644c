//! Pushes a built image to a registry: its two blobs, then the manifest, byte for byte as in
//! the layout archive, so the digest a runtime pulls is the one `make image` printed.

use crate::layout::{Image, MANIFEST_TYPE};
use anyhow::{Context, Result};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};

/// `insecure`: plain HTTP, for a registry on loopback without TLS.
pub async fn push(image: &Image, reference: &str, insecure: bool) -> Result<String> {
    let target: Reference = reference
        .parse()
        .with_context(|| format!("{reference:?} is not an image reference"))?;
    let client = Client::new(ClientConfig {
        protocol: if insecure {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        },
        ..ClientConfig::default()
    });
    let auth = match (
        std::env::var("REGISTRY_USERNAME"),
        std::env::var("REGISTRY_PASSWORD"),
    ) {
        (Ok(user), Ok(password)) => RegistryAuth::Basic(user, password),
        _ => RegistryAuth::Anonymous,
    };
    client
        .auth(&target, &auth, RegistryOperation::Push)
        .await
        .with_context(|| format!("authenticating to {}", target.resolve_registry()))?;
    for (what, blob) in [("layer", &image.layer), ("config", &image.config)] {
        client
            .push_blob(&target, blob.bytes.clone(), &blob.digest)
            .await
            .with_context(|| format!("pushing the {what} {}", blob.digest))?;
    }
    client
        .push_manifest_raw(
            &target,
            image.manifest.bytes.clone(),
            MANIFEST_TYPE.parse().context("manifest media type")?,
        )
        .await
        .with_context(|| format!("pushing the manifest to {reference}"))
}
