//! kube-rs and kubectl against the testbed's apiserver.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::bins;
use crate::step;

/// A kube-rs client for a kubeconfig file.
pub async fn client(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let mut cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    // Loopback only: never hand testbed traffic to a proxy from the environment.
    cfg.proxy_url = None;
    Ok(Client::try_from(cfg)?)
}

/// GET of a raw path such as `/readyz`.
pub async fn get_text(client: &Client, path: &str) -> Result<String> {
    let req = http::Request::get(path).body(Vec::new())?;
    Ok(client.request_text(req).await?)
}

/// Creates the namespace (unless it exists) and returns once the controller-manager's
/// ServiceAccount controller has given it its `default` ServiceAccount: until then the
/// ServiceAccount admission plugin rejects every pod there (`serviceaccount "default" not found`).
pub async fn ensure_namespace(client: &Client, ns: &str) -> Result<()> {
    create_namespace(client, ns).await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if sas.get_opt("default").await?.is_some() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("namespace {ns} got no `default` ServiceAccount within 60 s: is kube-controller-manager's serviceaccount controller running?");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The same on a testbed without kube-controller-manager: the harness creates the account.
pub async fn ensure_namespace_with_account(client: &Client, ns: &str) -> Result<()> {
    create_namespace(client, ns).await?;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let sa: ServiceAccount = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "default" }
    }))?;
    // The apiserver creates the `default` namespace itself, a moment after /readyz.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match create_or_exists(sas.create(&PostParams::default(), &sa).await) {
            Ok(()) => return Ok(()),
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e.context(format!("creating serviceaccount {ns}/default"))),
        }
    }
}

async fn create_namespace(client: &Client, ns: &str) -> Result<()> {
    let nss: Api<Namespace> = Api::all(client.clone());
    if nss.get_opt(ns).await?.is_none() {
        let obj: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": ns }
        }))?;
        create_or_exists(nss.create(&PostParams::default(), &obj).await)?;
    }
    Ok(())
}

fn create_or_exists<T>(r: kube::Result<T>) -> Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Runs the built kubectl (never the image's older /usr/bin/kubectl) against `kubeconfig` and
/// returns its stdout; a non-zero exit is an error carrying stderr.
pub async fn kubectl(kubeconfig: &Path, args: &[&str]) -> Result<String> {
    let bin = bins::built("kubectl")?;
    step!("kubectl {}", args.join(" "));
    let out = tokio::process::Command::new(&bin)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("PATH", bins::path_env())
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "kubectl {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}
