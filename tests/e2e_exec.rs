//! `kubectl exec`, `port-forward` and `attach` through the real apiserver (K4), once with the
//! Node declaring `ExtendWebSocketsToKubelet` (kubectl's WebSockets reach the daemon) and once
//! without (the apiserver speaks SPDY to it), and a caller without `nodes/proxy` refused at
//! the port (K9).

use e2e::daemon;

use std::process::Stdio;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use e2e::daemon::{annotation, create_pod, curl_status, pod_ip, until, wait_ready, DaemonOptions};
use e2e::testbed::{Testbed, TestbedOptions};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

const NS: &str = "default";
const NODE: &str = "node-a";
const LIMIT: Duration = Duration::from_secs(60);

struct Ran {
    code: i32,
    stdout: String,
    stderr: String,
}

fn kubectl_command(tb: &Testbed, program: &str) -> Result<tokio::process::Command> {
    let mut c = tokio::process::Command::new(program);
    c.env("KUBECONFIG", tb.kubeconfig()?)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .kill_on_drop(true);
    Ok(c)
}

/// The testbed's kubectl with `input` on its stdin (none: /dev/null).
async fn kubectl(tb: &Testbed, args: &[&str], input: Option<&[u8]>) -> Result<Ran> {
    let mut c = kubectl_command(tb, &e2e::bins::built("kubectl")?.display().to_string())?;
    c.args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn()?;
    if let (Some(data), Some(mut w)) = (input, child.stdin.take()) {
        w.write_all(data).await?;
    }
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .with_context(|| format!("kubectl {} did not finish in 60 s", args.join(" ")))??;
    Ok(Ran {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// `cocoon vm exec` children still running.
fn exec_children() -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    dir.flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| {
            let args: Vec<&[u8]> = c.split(|b| *b == 0).collect();
            args.windows(2).any(|w| w == [b"vm".as_slice(), b"exec"])
        })
        .count()
}

async fn scenario(websocket: bool) -> Result<()> {
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let journal = tb.run_dir().join("journal").join("events.journal");
    let kubelet_port = e2e::ports::free_port()?;
    // The simulator runs guest commands for real (in the guest's network namespace when it
    // has one), so a command reads its stdin as it comes and ends when it likes.
    let opts = DaemonOptions {
        env: vec![
            ("VK_KUBELET_WEBSOCKET".into(), websocket.to_string()),
            ("COCOON_SIM_EXEC".into(), "host".into()),
            // Shorter than the 5 s between kubectl's pings, so a quiet session ends on it.
            ("VK_EXEC_IDLE_TIMEOUT".into(), "2s".into()),
        ],
        ..DaemonOptions::default()
    };
    let d = daemon::start(&tb, &opts, &journal, e2e::ports::free_port()?, kubelet_port)?;
    daemon::node_registered(&tb, &d, NODE, LIMIT).await?;
    let declared = tb
        .kubectl(&[
            "get",
            "node",
            NODE,
            "-o",
            "jsonpath={.status.declaredFeatures}",
        ])
        .await?;
    ensure!(
        declared.contains("ExtendWebSocketsToKubelet") == websocket,
        "VK_KUBELET_WEBSOCKET={websocket}, and the Node declares {declared:?}"
    );

    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    let pod = daemon::run_pod(NS, "exec-a", NODE)?;
    create_pod(&pods, &pod).await?;
    let p = wait_ready(&pods, "exec-a", LIMIT)
        .await
        .with_context(|| d.proc.log_tail(60))?;
    let ip = pod_ip(&p).context("pod IP")?;
    annotation(&p, "vm.cocoonstack.io/id").context("vm id")?;

    // A pod the cluster sees Ready is served by the node at once (INV-7): no retry.
    let hi = kubectl(&tb, &["exec", "exec-a", "--", "echo", "hi"], None).await?;
    ensure!(
        hi.code == 0 && hi.stdout == "hi\n",
        "kubectl exec echo: code {}, stdout {:?}, stderr {:?}",
        hi.code,
        hi.stdout,
        hi.stderr
    );
    e2e::step!("kubectl exec -- echo hi: {:?}", hi.stdout);

    let input = b"line one\nline two\n";
    let cat = kubectl(&tb, &["exec", "-i", "exec-a", "--", "cat"], Some(input)).await?;
    ensure!(
        cat.code == 0 && cat.stdout.as_bytes() == input,
        "kubectl exec -i cat: code {}, stdout {:?}, stderr {:?}",
        cat.code,
        cat.stdout,
        cat.stderr
    );

    // An interactive session: each line comes back while stdin is still open; then, left
    // quiet with stdin still open, it ends on the idle limit with the daemon's word for why.
    let mut quiet = kubectl_command(&tb, &e2e::bins::built("kubectl")?.display().to_string())?;
    quiet
        .args(["exec", "-i", "exec-a", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut quiet = quiet.spawn()?;
    let mut quiet_in = quiet.stdin.take().context("stdin")?;
    let mut quiet_out = quiet.stdout.take().context("stdout")?;
    quiet_in.write_all(b"first\n").await?;
    let mut first = [0u8; 6];
    tokio::time::timeout(Duration::from_secs(20), async {
        use tokio::io::AsyncReadExt;
        quiet_out.read_exact(&mut first).await
    })
    .await
    .context("a line typed into kubectl exec -i did not come back while stdin was open")??;
    ensure!(&first == b"first\n", "kubectl exec -i echoed {first:?}");
    let ended = tokio::time::timeout(LIMIT, quiet.wait_with_output())
        .await
        .with_context(|| {
            format!(
                "a quiet kubectl exec -i did not end on the 2 s idle limit; daemon log:\n{}",
                d.proc.log_tail(40)
            )
        })??;
    drop(quiet_in);
    let said = String::from_utf8_lossy(&ended.stderr);
    ensure!(
        !ended.status.success() && said.contains("saw no traffic for 2s"),
        "a quiet kubectl exec -i ended {:?}: {said:?}",
        ended.status
    );
    e2e::step!(
        "a quiet kubectl exec -i ended on the idle limit: {}",
        said.trim()
    );

    // A client that goes away takes its command with it.
    let mut gone = kubectl_command(&tb, &e2e::bins::built("kubectl")?.display().to_string())?;
    gone.args(["exec", "-i", "exec-a", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut gone = gone.spawn()?;
    until("a cocoon vm exec for the open session", LIMIT, || async {
        Ok((exec_children() == 1).then_some(()))
    })
    .await?;
    gone.kill().await?;
    until(
        "the cocoon vm exec of a killed kubectl gone",
        LIMIT,
        || async { Ok((exec_children() == 0).then_some(())) },
    )
    .await?;

    let exit = kubectl(&tb, &["exec", "exec-a", "--", "sh", "-c", "exit 3"], None).await?;
    ensure!(
        exit.code == 3,
        "a command exiting 3 made kubectl exit {} ({:?})",
        exit.code,
        exit.stderr
    );

    // -it: `script` gives kubectl the terminal it insists on; the command runs without one.
    let kubectl_bin = e2e::bins::built("kubectl")?.display().to_string();
    let mut tty = kubectl_command(&tb, "script")?;
    tty.args([
        "-qec",
        &format!("{kubectl_bin} exec -it exec-a -- echo from-a-tty"),
        "/dev/null",
    ])
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let tty = tokio::time::timeout(Duration::from_secs(60), tty.spawn()?.wait_with_output())
        .await
        .context("kubectl exec -it did not finish")??;
    let tty_out = String::from_utf8_lossy(&tty.stdout);
    ensure!(
        tty.status.success() && tty_out.contains("from-a-tty"),
        "kubectl exec -it: {:?} {tty_out:?} {:?}",
        tty.status,
        String::from_utf8_lossy(&tty.stderr)
    );

    // port-forward: two connections through one forward, to the guest's HTTP port.
    let mut pf = kubectl_command(&tb, &kubectl_bin)?;
    pf.args(["port-forward", "pod/exec-a", ":8080"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut pf = pf.spawn()?;
    let mut lines = tokio::io::BufReader::new(pf.stdout.take().context("stdout")?).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .context("kubectl port-forward printed nothing")??
        .context("kubectl port-forward ended")?;
    let local = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .with_context(|| format!("no local port in {line:?}"))?
        .to_string();
    for i in 0..2 {
        let out = tokio::process::Command::new("curl")
            .args([
                "-s",
                "--max-time",
                "10",
                &format!("http://127.0.0.1:{local}/"),
            ])
            .env_remove("HTTP_PROXY")
            .env_remove("http_proxy")
            .output()
            .await?;
        let body = String::from_utf8_lossy(&out.stdout);
        ensure!(
            body.starts_with("cocoon-sim "),
            "connection {i} through kubectl port-forward got {body:?}"
        );
    }
    e2e::step!("kubectl port-forward to {ip}:8080 answered twice");
    pf.kill().await?;

    let attach = kubectl(&tb, &["attach", "exec-a"], None).await?;
    ensure!(
        attach.code != 0 && attach.stderr.contains("attach is not supported"),
        "kubectl attach: code {}, {:?}",
        attach.code,
        attach.stderr
    );

    for _ in 0..50 {
        if exec_children() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ensure!(
        exec_children() == 0,
        "a cocoon vm exec outlived its session"
    );

    // The transport the apiserver chose, as the daemon logged it.
    let log = d.proc.log_tail(400);
    let named = |l: &str, t: &str| {
        l.contains(&format!("transport={t}")) || l.contains(&format!("transport=\"{t}\""))
    };
    let (want, other) = match websocket {
        true => ("websocket", "spdy"),
        false => ("spdy", "websocket"),
    };
    for what in ["exec", "port-forward"] {
        let used: Vec<&str> = log
            .lines()
            .filter(|l| l.contains(&format!(": {what} ")) && l.contains("transport="))
            .collect();
        ensure!(
            !used.is_empty() && used.iter().all(|l| named(l, want) && !named(l, other)),
            "{what} sessions should all have come as {want}: {used:?}"
        );
    }

    // Straight at the port: a token without nodes/proxy may not exec.
    tb.kubectl(&["create", "serviceaccount", "reader", "-n", NS])
        .await?;
    let reader = tb.kubectl(&["create", "token", "reader", "-n", NS]).await?;
    let url = format!(
        "https://127.0.0.1:{kubelet_port}/exec/{NS}/exec-a/agent?command=echo&command=x&stdout=1"
    );
    let denied = curl_status(
        &url,
        &[
            "-X",
            "POST",
            "-H",
            &format!("Authorization: Bearer {}", reader.trim()),
        ],
    )
    .await?;
    ensure!(
        denied == "403",
        "exec with a token without nodes/proxy: {denied}"
    );
    daemon::replay_verify(&journal)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_port_forward_and_attach_over_websockets() -> Result<()> {
    scenario(true).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_port_forward_and_attach_over_spdy() -> Result<()> {
    scenario(false).await
}

/// INV-7: nothing the cluster is told goes out before the node's own API can serve the pod.
/// Ten pods are created at once, and each, the instant the API shows it Ready, is reached with
/// `kubectl exec` and `kubectl logs` through the apiserver, once, with no retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_is_served_the_instant_it_is_ready() -> Result<()> {
    const PODS: usize = 10;
    let tb = Testbed::start(TestbedOptions::control_plane().with_sim()).await?;
    let journal = tb.run_dir().join("journal").join("events.journal");
    let opts = DaemonOptions {
        env: vec![("COCOON_SIM_EXEC".into(), "host".into())],
        ..DaemonOptions::default()
    };
    let d = daemon::start(
        &tb,
        &opts,
        &journal,
        e2e::ports::free_port()?,
        e2e::ports::free_port()?,
    )?;
    daemon::node_registered(&tb, &d, NODE, LIMIT).await?;
    let pods: Api<Pod> = Api::namespaced(tb.client()?, NS);
    let names: Vec<String> = (0..PODS).map(|i| format!("ready-{i}")).collect();
    let mut seen = Vec::new();
    for name in &names {
        seen.push(daemon::watch_for(pods.clone(), name, daemon::is_ready));
        create_pod(&pods, &daemon::run_pod(NS, name, NODE)?).await?;
    }
    let checks = names.iter().zip(seen).map(|(name, ready)| {
        let tb = &tb;
        async move {
            ready.wait(&format!("pod {name} Ready"), LIMIT).await?;
            let exec = kubectl(tb, &["exec", name, "--", "true"], None).await?;
            let logs = kubectl(tb, &["logs", name, "--tail=1"], None).await?;
            let mut failures = Vec::new();
            if exec.code != 0 {
                failures.push(format!(
                    "{name}: kubectl exec -- true exited {}: {}",
                    exec.code,
                    exec.stderr.trim()
                ));
            }
            let said = format!("{}{}", logs.stdout, logs.stderr);
            if logs.code != 0 || said.contains("no live VM") || said.contains("not on this node") {
                failures.push(format!(
                    "{name}: kubectl logs exited {}: {}",
                    logs.code,
                    said.trim()
                ));
            }
            anyhow::Ok(failures)
        }
    });
    let mut failures = Vec::new();
    for result in futures::future::join_all(checks).await {
        failures.extend(result.with_context(|| d.proc.log_tail(40))?);
    }
    ensure!(
        failures.is_empty(),
        "{} of {} checks failed right after Ready:\n{}",
        failures.len(),
        2 * PODS,
        failures.join("\n")
    );
    e2e::step!(
        "{PODS} pods: kubectl exec and kubectl logs each succeeded the instant it was Ready"
    );
    daemon::replay_verify(&journal)?;
    Ok(())
}
