//! Runs of the fake world that tests and benchmarks journal. Shared by `#[path]` so the
//! bench measures the same kind of journal the tests check.

use reconcilers::pod::PodKey;
use reconcilers::testkit::{pod, World};
use reconcilers::Config;

/// The sample journal's story: three pods (run mode, clone mode, run with a TCP probe port)
/// are created and become ready; the clone's VM vanishes behind vk's back, so that pod is
/// evicted; the run pod is deleted.
pub fn demo() -> World {
    let mut w = World::new(Config::default());
    w.cocoon.add_snapshot(
        "acme/agent",
        "cloud-hypervisor",
        "ghcr.io/acme/agent-base:1",
    );
    w.start(vec![], vec![]);
    w.advance(1_000);
    w.apply(
        pod("default", "web")
            .managed()
            .run("ubuntu:24.04")
            .cpu("1", "2")
            .memory("2Gi", "")
            .build(),
    );
    w.run_for(2_000);
    w.apply(
        pod("default", "worker")
            .managed()
            .clone_of("acme/agent:latest")
            .build(),
    );
    w.run_for(2_000);
    w.apply(
        pod("default", "api")
            .managed()
            .run("ubuntu:24.04")
            .probe_port(8080)
            .build(),
    );
    w.run_for(5_000);
    let worker = vm_id(&w, "vk-worker");
    w.vanish(&worker);
    w.run_for(5_000);
    w.delete_pod(&PodKey::new("default", "web"));
    w.run_for(10_000);
    w
}

/// `n` run-mode pods created, made ready, then deleted: the replay benchmark's journal.
pub fn churn(n: usize) -> World {
    let mut w = World::new(Config::default());
    w.start(vec![], vec![]);
    for i in 0..n {
        w.apply(
            pod("bench", &format!("p{i}"))
                .managed()
                .run("ubuntu:24.04")
                .build(),
        );
    }
    w.run_for(5_000);
    for i in 0..n {
        w.delete_pod(&PodKey::new("bench", format!("p{i}")));
    }
    w.run_for(30_000);
    w
}

pub fn vm_id(w: &World, name: &str) -> String {
    w.cocoon
        .vms
        .values()
        .find(|v| v.name == name)
        .map(|v| v.id.clone())
        .unwrap_or_else(|| panic!("no VM named {name}"))
}

/// `waves` rounds of [`churn`]'s story, `per_wave` pods each, in one world: as many events
/// as `churn(waves * per_wave)` without its cost, since the world only ever holds one wave.
pub fn churn_waves(waves: usize, per_wave: usize) -> World {
    let mut w = World::new(Config::default());
    w.start(vec![], vec![]);
    for wave in 0..waves {
        let names: Vec<String> = (0..per_wave)
            .map(|i| format!("p{}", wave * per_wave + i))
            .collect();
        for n in &names {
            w.apply(pod("bench", n).managed().run("ubuntu:24.04").build());
        }
        w.run_for(5_000);
        for n in &names {
            w.delete_pod(&PodKey::new("bench", n));
        }
        w.run_for(30_000);
    }
    w
}
