//! The registry round trip the hibernation path depends on: push, pull, delete by tag.

use oci_client::client::{Config, ImageLayer};
use oci_client::manifest::{IMAGE_CONFIG_MEDIA_TYPE, IMAGE_LAYER_MEDIA_TYPE};
use oci_client::secrets::RegistryAuth;
use oci_client::Reference;

use e2e::{Testbed, TestbedOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_pull_delete_round_trip() {
    let tb = Testbed::start(TestbedOptions::default().with_registry())
        .await
        .expect("testbed starts");
    let reg = tb.registry.as_ref().unwrap();
    let client = reg.oci_client();
    let reference: Reference = reg.reference("snapshots/pod-a", "hib-1").parse().unwrap();

    let layer = ImageLayer::oci_v1(b"memory image bytes".to_vec(), None);
    let config = Config::oci_v1(br#"{"architecture":"amd64","os":"linux"}"#.to_vec(), None);
    client
        .push(
            &reference,
            std::slice::from_ref(&layer),
            config,
            &RegistryAuth::Anonymous,
            None,
        )
        .await
        .expect("push");
    assert_eq!(reg.tags("snapshots/pod-a").await.unwrap(), vec!["hib-1"]);

    let pulled = client
        .pull(
            &reference,
            &RegistryAuth::Anonymous,
            vec![IMAGE_LAYER_MEDIA_TYPE, IMAGE_CONFIG_MEDIA_TYPE],
        )
        .await
        .expect("pull");
    assert_eq!(pulled.layers.len(), 1);
    assert_eq!(pulled.layers[0].data, layer.data);

    assert_eq!(
        reg.delete_tag("snapshots/pod-a", "hib-1").await.unwrap(),
        202
    );
    assert!(reg.tags("snapshots/pod-a").await.unwrap().is_empty());
    let gone = client
        .pull(
            &reference,
            &RegistryAuth::Anonymous,
            vec![IMAGE_LAYER_MEDIA_TYPE],
        )
        .await;
    assert!(gone.is_err(), "the deleted tag still pulls");
}
