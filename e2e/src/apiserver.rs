//! kube-apiserver on loopback, backed by the run's etcd.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::Result;

use crate::bins;
use crate::certs::Pki;
use crate::etcd::Etcd;
use crate::ports::free_port;
use crate::procs::Proc;
use crate::ready::wait_ready;
use crate::rundir::RunDir;
use crate::step;

pub struct ApiServer {
    pub proc: Proc,
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    pub kubeconfig: PathBuf,
}

impl ApiServer {
    pub async fn start(run: &RunDir, pki: &Pki, etcd: &Etcd) -> Result<ApiServer> {
        Self::start_on(run, pki, etcd, free_port()?).await
    }

    /// Stops the apiserver and starts it again on the same port, as an outage clients must
    /// ride out (the daemon's watch and writes reconnect to the same URL).
    pub async fn restart(&mut self, run: &RunDir, pki: &Pki, etcd: &Etcd) -> Result<()> {
        let port: u16 = self
            .url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_default();
        step!("restarting kube-apiserver on port {port}");
        self.proc.stop();
        *self = Self::start_on(run, pki, etcd, port).await?;
        Ok(())
    }

    async fn start_on(run: &RunDir, pki: &Pki, etcd: &Etcd, port: u16) -> Result<ApiServer> {
        let bin = bins::built("kube-apiserver")?;
        let url = format!("https://127.0.0.1:{port}");
        let kubeconfig = run.path().join("kubeconfig");
        crate::kubeconfig::write(&kubeconfig, &url, pki)?;
        step!("starting kube-apiserver on {url} (ready in ~4 s)");
        let p = |p: &PathBuf| p.display().to_string();
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--etcd-servers={}", etcd.url))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={port}"))
            .arg("--advertise-address=127.0.0.1")
            // v1.37 refuses a loopback advertise address unless nothing reconciles the
            // `kubernetes` service endpoints; with no in-cluster clients nobody needs them.
            .arg("--endpoint-reconciler-type=none")
            .arg(format!(
                "--cert-dir={}",
                run.subdir("apiserver-certs")?.display()
            ))
            .arg(format!("--tls-cert-file={}", p(&pki.apiserver.cert)))
            .arg(format!("--tls-private-key-file={}", p(&pki.apiserver.key)))
            .arg(format!("--client-ca-file={}", p(&pki.ca.cert)))
            .arg(format!(
                "--kubelet-client-certificate={}",
                p(&pki.kubelet_client.cert)
            ))
            .arg(format!(
                "--kubelet-client-key={}",
                p(&pki.kubelet_client.key)
            ))
            // No --kubelet-certificate-authority, as with kubeadm's defaults: the daemon may
            // serve a self-signed certificate. A test that wants the stricter check can sign
            // one with Pki::issue_serving.
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg(format!(
                "--service-account-signing-key-file={}",
                p(&pki.sa_key)
            ))
            .arg(format!("--service-account-key-file={}", p(&pki.sa_pub)))
            .arg("--service-cluster-ip-range=10.96.0.0/16")
            // Dial kubelets (our daemon) at their InternalIP (127.0.0.1 here): the default
            // prefers the Hostname address, which would send a DNS query off the machine.
            .arg("--kubelet-preferred-address-types=InternalIP")
            // The aggregation layer, for an aggregated API server such as metrics-server: the
            // apiserver forwards with the front-proxy client certificate and names the caller
            // in these headers.
            .arg(format!(
                "--requestheader-client-ca-file={}",
                p(&pki.front_proxy_ca.cert)
            ))
            .arg(format!(
                "--requestheader-allowed-names={}",
                crate::certs::FRONT_PROXY_CLIENT
            ))
            .arg("--requestheader-username-headers=X-Remote-User")
            .arg("--requestheader-group-headers=X-Remote-Group")
            .arg("--requestheader-extra-headers-prefix=X-Remote-Extra-")
            .arg(format!(
                "--proxy-client-cert-file={}",
                p(&pki.front_proxy_client.cert)
            ))
            .arg(format!(
                "--proxy-client-key-file={}",
                p(&pki.front_proxy_client.key)
            ))
            // An APIService is reached through its Service's cluster address; only this
            // routing follows an ExternalName Service, the one kind that can name loopback
            // (Endpoints and EndpointSlices refuse 127.0.0.0/8). See metrics_server.rs.
            .arg("--enable-aggregator-routing=false")
            .arg("--authorization-mode=Node,RBAC")
            .arg("--allow-privileged=true")
            .arg("--profiling=false")
            .arg("--v=1");
        let mut proc = run.spawn("kube-apiserver", cmd)?;
        let client = crate::kube::client(&kubeconfig).await?;
        wait_ready(
            &mut proc,
            "kube-apiserver",
            Duration::from_secs(120),
            || {
                let client = client.clone();
                async move {
                    crate::kube::get_text(&client, "/readyz")
                        .await
                        .is_ok_and(|t| t.trim() == "ok")
                }
            },
        )
        .await?;
        step!("kube-apiserver ready");
        Ok(ApiServer {
            proc,
            url,
            kubeconfig,
        })
    }
}
