//! The testbed: every component a test asked for, under one run directory, torn down on drop.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::apiserver::ApiServer;
use crate::certs::Pki;
use crate::controller_manager::ControllerManager;
use crate::etcd::Etcd;
use crate::metrics_server::MetricsServer;
use crate::operator::Operator;
use crate::procs::Proc;
use crate::prometheus::{Prometheus, ScrapeJob};
use crate::real_cocoon::RealCocoon;
use crate::registry::Registry;
use crate::rundir::RunDir;
use crate::scheduler::{ClientConnection, Scheduler};
use crate::sim::CocoonSim;
use crate::step;

/// What to start. Components start concurrently; only the control plane's etcd → apiserver →
/// scheduler and controller-manager order is sequential.
#[derive(Clone, Debug, Default)]
pub struct TestbedOptions {
    /// etcd, kube-apiserver, kube-scheduler and kube-controller-manager.
    pub control_plane: bool,
    /// The control plane without kube-scheduler and kube-controller-manager: nothing schedules,
    /// garbage-collects or watches node health, and the harness creates each namespace's
    /// `default` ServiceAccount itself.
    pub apiserver_only: bool,
    pub registry: bool,
    /// Start Prometheus scraping these jobs (it always scrapes itself too).
    pub prometheus: Option<Vec<ScrapeJob>>,
    /// A cocoon host: the simulator, or the real cocoon when `TESTBED_COCOON=real`.
    pub sim: bool,
    /// The real cocoon CLI on the cloud-hypervisor stand-in, whatever `TESTBED_COCOON` says.
    pub real_cocoon: bool,
    /// Start metrics-server as the `metrics.k8s.io` API, scraping every this often (at least
    /// 10 s, its floor); implies the control plane.
    pub metrics_server: Option<std::time::Duration>,
    /// The real cocoon-operator with its CRDs; implies the control plane and the registry.
    pub operator: bool,
    /// Namespaces to create, each with its `default` ServiceAccount ("default" always is).
    pub namespaces: Vec<String>,
    /// kube-scheduler's API client rate limit; `None` leaves its defaults, as a stock cluster
    /// has them (see [`crate::scheduler::DEFAULT_CLIENT`]).
    pub scheduler_client: Option<ClientConnection>,
}

impl TestbedOptions {
    pub fn control_plane() -> Self {
        TestbedOptions {
            control_plane: true,
            ..Default::default()
        }
    }

    /// Everything: control plane, registry, Prometheus (no extra jobs yet) and the simulator.
    pub fn all() -> Self {
        TestbedOptions {
            control_plane: true,
            apiserver_only: false,
            registry: true,
            prometheus: Some(Vec::new()),
            sim: true,
            real_cocoon: false,
            metrics_server: None,
            operator: false,
            namespaces: Vec::new(),
            scheduler_client: None,
        }
    }

    /// See [`TestbedOptions::apiserver_only`].
    pub fn apiserver_only(mut self) -> Self {
        self.control_plane = true;
        self.apiserver_only = true;
        self
    }

    pub fn with_registry(mut self) -> Self {
        self.registry = true;
        self
    }

    pub fn with_prometheus(mut self, jobs: Vec<ScrapeJob>) -> Self {
        self.prometheus = Some(jobs);
        self
    }

    pub fn with_sim(mut self) -> Self {
        self.sim = true;
        self
    }

    /// The real cocoon instead of the simulator (see [`crate::real_cocoon`]).
    pub fn with_real_cocoon(mut self) -> Self {
        self.real_cocoon = true;
        self
    }

    /// metrics-server behind the apiserver, for `kubectl top` (see [`crate::metrics_server`]).
    /// Opt-in: it costs a build (`build-deps.sh metrics-server`) and ~1 s of start.
    pub fn with_metrics_server(mut self) -> Self {
        self.control_plane = true;
        self.metrics_server = Some(std::time::Duration::from_secs(10));
        self
    }

    /// cocoon-operator behind the apiserver, watching CocoonSets and CocoonHibernations (see
    /// [`crate::operator`]). Opt-in: it costs a build (`build-deps.sh cocoon-operator`).
    pub fn with_operator(mut self) -> Self {
        self.control_plane = true;
        self.registry = true;
        self.operator = true;
        self
    }

    pub fn with_namespace(mut self, ns: &str) -> Self {
        self.namespaces.push(ns.to_string());
        self
    }

    /// See [`TestbedOptions::scheduler_client`].
    pub fn with_scheduler_client(mut self, client: Option<ClientConnection>) -> Self {
        self.scheduler_client = client;
        self
    }
}

/// A running testbed. Dropping it (also while a test panics) stops every process it started,
/// runs `cocoon sim cleanup` (or removes the real cocoon's VMs and network) and removes the run
/// directory.
pub struct Testbed {
    // Teardown order: consumers before what they consume, the run directory last.
    pub operator: Option<Operator>,
    pub metrics_server: Option<MetricsServer>,
    pub prometheus: Option<Prometheus>,
    pub registry: Option<Registry>,
    pub controller_manager: Option<ControllerManager>,
    pub scheduler: Option<Scheduler>,
    pub apiserver: Option<ApiServer>,
    pub etcd: Option<Etcd>,
    pub sim: Option<CocoonSim>,
    /// The real cocoon, when the options or `TESTBED_COCOON=real` asked for it; then `sim` is
    /// `None`.
    pub real_cocoon: Option<RealCocoon>,
    /// With the real cocoon and the registry: the stand-in's guest image, pushed there
    /// (`crate::guest_image`, the default program), for `cocoon image pull` and pods.
    pub guest_image: Option<String>,
    /// More cocoon hosts, for tests with more than one node (`add_host`).
    pub hosts: Vec<CocoonSim>,
    /// More real cocoon hosts, by name (`add_real_host`).
    pub real_hosts: Vec<(String, RealCocoon)>,
    pub pki: Option<Pki>,
    client: Option<kube::Client>,
    run: RunDir,
}

impl Testbed {
    pub async fn start(opts: TestbedOptions) -> Result<Testbed> {
        if opts.control_plane {
            crate::bins::built("kube-apiserver")?;
            crate::bins::built("etcd")?;
            crate::bins::built("kubectl")?;
            if !opts.apiserver_only {
                crate::bins::built("kube-scheduler")?;
                crate::bins::built("kube-controller-manager")?;
            }
        }
        if opts.registry {
            crate::bins::built("registry")?;
        }
        if opts.metrics_server.is_some() {
            crate::bins::built("metrics-server")?;
        }
        if opts.operator {
            crate::bins::built("cocoon-operator")?;
            crate::operator::manifests_dir()?;
        }
        if opts.prometheus.is_some() {
            crate::bins::prometheus()?;
        }
        let mut tb = Testbed {
            operator: None,
            metrics_server: None,
            prometheus: None,
            registry: None,
            controller_manager: None,
            scheduler: None,
            apiserver: None,
            etcd: None,
            sim: None,
            real_cocoon: None,
            guest_image: None,
            hosts: Vec::new(),
            real_hosts: Vec::new(),
            pki: None,
            client: None,
            run: RunDir::create()?,
        };
        if opts.real_cocoon || (opts.sim && crate::real_cocoon::requested()?) {
            tb.real_cocoon = Some(RealCocoon::start(&tb.run)?);
        } else if opts.sim {
            tb.sim = Some(CocoonSim::new(&tb.run)?);
        }
        let run = &tb.run;
        let control_plane = async {
            if !opts.control_plane {
                return Ok(None);
            }
            let pki = Pki::generate(&run.subdir("pki")?)?;
            let etcd = Etcd::start(run).await?;
            let api = ApiServer::start(run, &pki, &etcd).await?;
            if opts.apiserver_only {
                return anyhow::Ok(Some((pki, etcd, api, None)));
            }
            let (sched, cm) = tokio::join!(
                Scheduler::start(run, &pki, &api, opts.scheduler_client),
                ControllerManager::start(run, &pki, &api)
            );
            // Both kept (or dropped, which stops them) together with the apiserver.
            let controllers = match (sched, cm) {
                (Ok(s), Ok(c)) => Ok((s, c)),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
            anyhow::Ok(Some((pki, etcd, api, Some(controllers?))))
        };
        let registry = async {
            match opts.registry {
                true => Registry::start(run).await.map(Some),
                false => Ok(None),
            }
        };
        let prometheus = async {
            match &opts.prometheus {
                Some(jobs) => Prometheus::start(run, jobs).await.map(Some),
                None => Ok(None),
            }
        };
        let (cp, reg, prom) = tokio::join!(control_plane, registry, prometheus);
        // Keep whatever started, so a failure below still tears it down on drop.
        let cp_err = match cp {
            Ok(Some((pki, etcd, api, controllers))) => {
                tb.pki = Some(pki);
                tb.etcd = Some(etcd);
                tb.apiserver = Some(api);
                if let Some((s, c)) = controllers {
                    tb.scheduler = Some(s);
                    tb.controller_manager = Some(c);
                }
                None
            }
            Ok(None) => None,
            Err(e) => Some(e),
        };
        let reg_err = reg.map(|r| tb.registry = r).err();
        let prom_err = prom.map(|p| tb.prometheus = p).err();
        if let Some(e) = cp_err.or(reg_err).or(prom_err) {
            return Err(e);
        }
        if let (Some(_), Some(registry)) = (&tb.real_cocoon, &tb.registry) {
            let program = crate::guest_image::GuestProgram::default();
            tb.guest_image =
                Some(crate::guest_image::push(registry, "vk/guest", "standin", &program).await?);
        }
        if opts.control_plane {
            tb.client = Some(crate::kube::client(tb.kubeconfig()?).await?);
            let mut nss = vec!["default".to_string()];
            nss.extend(opts.namespaces.iter().cloned());
            for ns in &nss {
                tb.ensure_namespace(ns).await?;
            }
        }
        if let (Some(resolution), Some(pki), Some(api), Some(client)) = (
            opts.metrics_server,
            tb.pki.as_ref(),
            tb.apiserver.as_ref(),
            tb.client.as_ref(),
        ) {
            tb.metrics_server =
                Some(MetricsServer::start(&tb.run, pki, api, client, resolution).await?);
        }
        if let (true, Some(pki), Some(api), Some(client), Some(registry)) = (
            opts.operator,
            tb.pki.as_ref(),
            tb.apiserver.as_ref(),
            tb.client.as_ref(),
            tb.registry.as_ref(),
        ) {
            tb.operator = Some(Operator::start(&tb.run, pki, api, client, registry).await?);
        }
        step!("testbed up in {}", tb.run.path().display());
        Ok(tb)
    }

    /// Stops and restarts kube-apiserver on the same URL (etcd keeps the data).
    pub async fn restart_apiserver(&mut self) -> Result<()> {
        let (Some(api), Some(pki), Some(etcd)) = (
            self.apiserver.as_mut(),
            self.pki.as_ref(),
            self.etcd.as_ref(),
        ) else {
            anyhow::bail!("this testbed has no control plane");
        };
        api.restart(&self.run, pki, etcd).await
    }

    pub fn run_dir(&self) -> &Path {
        self.run.path()
    }

    pub fn kubeconfig(&self) -> Result<&Path> {
        Ok(&self
            .apiserver
            .as_ref()
            .context("testbed started without a control plane")?
            .kubeconfig)
    }

    /// A kube-rs client with admin rights.
    pub fn client(&self) -> Result<kube::Client> {
        self.client
            .clone()
            .context("testbed started without a control plane")
    }

    /// Runs the built kubectl (v1.37) against the testbed and returns its stdout.
    pub async fn kubectl(&self, args: &[&str]) -> Result<String> {
        crate::kube::kubectl(self.kubeconfig()?, args).await
    }

    /// Creates a namespace (unless it exists) and returns once it has its `default`
    /// ServiceAccount, which the ServiceAccount admission plugin requires of every pod: the
    /// controller-manager's creates it, or, on an apiserver-only testbed, the harness does.
    pub async fn ensure_namespace(&self, ns: &str) -> Result<()> {
        let client = self.client()?;
        match self.controller_manager {
            Some(_) => crate::kube::ensure_namespace(&client, ns).await,
            None => crate::kube::ensure_namespace_with_account(&client, ns).await,
        }
    }

    /// Starts a process (typically the daemon under test) as part of this run: its own process
    /// group, its log in the run directory, swept with the rest if the test is killed.
    pub fn spawn(&self, name: &str, cmd: Command) -> Result<Proc> {
        self.run.spawn(name, cmd)
    }

    pub fn logs_dir(&self) -> PathBuf {
        self.run.logs_dir()
    }

    /// Processes still carrying this run's marker.
    pub fn processes(&self) -> Vec<(i32, String)> {
        crate::procs::processes_of(self.run.path())
    }

    /// `KEY=value` pairs describing the testbed, for `testbed up` and humans.
    pub fn summary(&self) -> Vec<(String, String)> {
        // Not the marker variable: a shell that evals these exports would otherwise mark itself,
        // and every command run from it, as part of the run, and `testbed down` would kill them.
        let mut v = vec![(
            "TESTBED_RUN_DIR".to_string(),
            self.run_dir().display().to_string(),
        )];
        if let Ok(k) = self.kubeconfig() {
            v.push(("KUBECONFIG".into(), k.display().to_string()));
        }
        if let Some(a) = &self.apiserver {
            v.push(("TESTBED_APISERVER".into(), a.url.clone()));
        }
        if let Some(s) = &self.scheduler {
            v.push((
                "TESTBED_SCHEDULER".into(),
                format!("https://127.0.0.1:{}", s.port),
            ));
        }
        if let Some(c) = &self.controller_manager {
            v.push((
                "TESTBED_CONTROLLER_MANAGER".into(),
                format!("https://127.0.0.1:{}", c.port),
            ));
        }
        if let Some(r) = &self.registry {
            v.push(("TESTBED_REGISTRY".into(), r.addr.clone()));
        }
        if let Some(p) = &self.prometheus {
            v.push(("TESTBED_PROMETHEUS".into(), p.url.clone()));
        }
        if let Some(o) = &self.operator {
            v.push((
                "TESTBED_OPERATOR_METRICS".into(),
                format!("http://127.0.0.1:{}", o.metrics_port),
            ));
            v.push(("TESTBED_OCI_REGISTRY".into(), o.oci_registry.clone()));
        }
        if let Some(m) = &self.metrics_server {
            v.push((
                "TESTBED_METRICS_SERVER".into(),
                format!("https://127.0.0.1:{}", m.port),
            ));
        }
        if let Some(s) = &self.sim {
            v.push(("COCOON_SIM_BIN".into(), s.bin.display().to_string()));
            v.extend(s.env().into_iter().filter(|(k, _)| k != "PATH"));
        }
        if let Some(r) = &self.real_cocoon {
            v.push(("TESTBED_COCOON".into(), "real".into()));
            v.push(("TESTBED_COCOON_BIN".into(), r.bin.display().to_string()));
            v.extend(r.env().into_iter().filter(|(k, _)| k != "PATH"));
        }
        if let Some(image) = &self.guest_image {
            v.push(("TESTBED_GUEST_IMAGE".into(), image.clone()));
        }
        if let Some(p) = &self.pki {
            v.push(("TESTBED_CA".into(), p.ca.cert.display().to_string()));
        }
        v
    }

    /// Prints the last `n` lines of every component log to stderr.
    pub fn print_log_tails(&self, n: usize) {
        let Ok(rd) = std::fs::read_dir(self.logs_dir()) else {
            return;
        };
        for e in rd.flatten() {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!("----- {} (last {n} lines)", e.path().display());
            for l in &lines[lines.len().saturating_sub(n)..] {
                eprintln!("{l}");
            }
        }
    }

    /// Another cocoon host (simulator root) in this run, named `name`; the daemon of a second
    /// node runs against it (`DaemonOptions::host`).
    pub fn add_host(&mut self, name: &str) -> Result<&CocoonSim> {
        let sim = CocoonSim::host(&self.run, name)?;
        self.hosts.push(sim);
        Ok(self.hosts.last().expect("just pushed"))
    }

    /// A second node's real cocoon: its own root, run and log directories and CNI network.
    pub fn add_real_host(&mut self, name: &str) -> Result<&RealCocoon> {
        let real = RealCocoon::host(&self.run, name)?;
        self.real_hosts.push((name.to_string(), real));
        Ok(&self.real_hosts.last().expect("just pushed").1)
    }

    /// The real cocoon named `name` by `add_real_host`, or the testbed's own for `None`.
    pub fn real_host(&self, name: Option<&str>) -> Result<&RealCocoon> {
        match name {
            None => self
                .real_cocoon
                .as_ref()
                .context("testbed without the real cocoon"),
            Some(n) => self
                .real_hosts
                .iter()
                .find(|(h, _)| h == n)
                .map(|(_, r)| r)
                .with_context(|| format!("no real cocoon host {n:?} (Testbed::add_real_host)")),
        }
    }

    /// The simulator named `name` by `add_host`, or the testbed's own for `None`.
    pub fn host(&self, name: Option<&str>) -> Result<&CocoonSim> {
        match name {
            None => self.sim.as_ref().context("testbed without the simulator"),
            Some(n) => self
                .hosts
                .iter()
                .find(|h| h.root.parent().and_then(|d| d.file_name()) == Some(n.as_ref()))
                .with_context(|| format!("no cocoon host {n:?} (Testbed::add_host)")),
        }
    }

    /// Leaves everything running for `testbed down` and returns the run directory.
    pub fn detach(mut self) -> Result<PathBuf> {
        self.run.detach()?;
        for p in [
            self.operator.as_mut().map(|c| &mut c.proc),
            self.metrics_server.as_mut().map(|c| &mut c.proc),
            self.prometheus.as_mut().map(|c| &mut c.proc),
            self.registry.as_mut().map(|c| &mut c.proc),
            self.controller_manager.as_mut().map(|c| &mut c.proc),
            self.scheduler.as_mut().map(|c| &mut c.proc),
            self.apiserver.as_mut().map(|c| &mut c.proc),
            self.etcd.as_mut().map(|c| &mut c.proc),
        ]
        .into_iter()
        .flatten()
        {
            p.disarm();
        }
        if let Some(s) = self.sim.take() {
            // Its cleanup is recorded in the run directory; `testbed down` runs it.
            std::mem::forget(s);
        }
        // Nothing of it runs until a VM does; `testbed down` removes those and its network.
        drop(self.real_cocoon.take());
        self.real_hosts.clear();
        for h in self.hosts.drain(..) {
            std::mem::forget(h);
        }
        Ok(self.run_dir().to_path_buf())
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if !self.run.armed() {
            return;
        }
        if std::thread::panicking() {
            // The run directory goes away with the teardown; the tails are what explains the
            // failure, and the test harness shows them with the panic.
            self.print_log_tails(20);
        }
        drop(self.operator.take());
        drop(self.metrics_server.take());
        drop(self.prometheus.take());
        drop(self.registry.take());
        drop(self.controller_manager.take());
        drop(self.scheduler.take());
        drop(self.apiserver.take());
        drop(self.etcd.take());
        self.hosts.clear();
        drop(self.sim.take());
        self.run.teardown();
    }
}
