//! The SM limit on the simulated node: the device's busy fraction (the
//! simulated utilization) of a workload that would use the whole GPU stays
//! within ±10 points of a 30 % limit, through every launch API, and for the
//! container as a whole when two processes share the limit.
//!
//! Each run gets a node of its own (its own simulated device), so the runs
//! go in parallel and the test takes about as long as one run.

mod common;

use common::{Limit, Node, artefacts};

/// Seconds each workload runs.
const SECONDS: &str = "2";

fn launch(node: &Node, limits: Option<&std::path::Path>, api: &str) -> common::Probe {
    launch_via(node, limits, api, "proc")
}

fn launch_via(
    node: &Node,
    limits: Option<&std::path::Path>,
    api: &str,
    route: &str,
) -> common::Probe {
    node.probe(limits).args([
        "--route",
        route,
        "launch",
        "--api",
        api,
        "--kernels",
        "10",
        "--blocks",
        "100",
        "--seconds",
        SECONDS,
    ])
}

fn thirty_percent(node: &Node) -> std::path::PathBuf {
    node.limits(
        "vgpu.json",
        &[Limit {
            gpu: 0,
            memory_mib: 0,
            sm_percent: 30,
        }],
        "",
    )
}

#[test]
fn a_30_percent_limit_holds_on_every_launch_api() {
    let Some(a) = artefacts() else { return };
    // Through cuGetProcAddress (every API), and through dlsym.
    let runs: Vec<_> = [
        ("launch", "proc"),
        ("launch_ex", "proc"),
        ("cooperative", "proc"),
        ("graph", "proc"),
        ("launch", "dlsym"),
    ]
    .into_iter()
    .map(|(api, route)| {
        let node = Node::create(a.clone(), "h100-80gb");
        let limits = thirty_percent(&node);
        let child = std::thread::spawn({
            let probe = launch_via(&node, Some(&limits), api, route);
            move || probe.run()
        });
        (format!("{api} via {route}"), node, child)
    })
    .collect();
    for (api, _node, child) in runs {
        let out = child.join().expect("probe thread");
        out.expect_success();
        let busy = out.float("busy_fraction") * 100.0;
        assert!(
            (20.0..=40.0).contains(&busy),
            "{api}: the device was busy {busy:.1} % of the time, the limit is 30 % (±10): {}",
            out.describe()
        );
    }
}

#[test]
fn without_an_sm_limit_the_workload_uses_the_whole_device() {
    let Some(a) = artefacts() else { return };
    let node = Node::create(a, "h100-80gb");
    let limits = node.limits(
        "vgpu.json",
        &[Limit {
            gpu: 0,
            memory_mib: 1024,
            sm_percent: 0,
        }],
        "",
    );
    let out = launch(&node, Some(&limits), "launch").run();
    out.expect_success();
    let busy = out.float("busy_fraction") * 100.0;
    assert!(busy > 90.0, "busy {busy:.1} %: {}", out.describe());
}

#[test]
fn two_processes_share_the_containers_30_percent() {
    let Some(a) = artefacts() else { return };
    let node = Node::create(a, "h100-80gb");
    let limits = thirty_percent(&node);
    let children: Vec<_> = (0..2)
        .map(|_| {
            let probe = launch(&node, Some(&limits), "launch");
            std::thread::spawn(move || probe.run())
        })
        .collect();
    let outs: Vec<_> = children
        .into_iter()
        .map(|c| c.join().expect("probe thread"))
        .collect();
    let mut total = 0.0;
    for out in &outs {
        out.expect_success();
        total += out.float("busy_fraction") * 100.0;
    }
    assert!(
        (20.0..=40.0).contains(&total),
        "the two processes kept the device busy {total:.1} % together, the limit is 30 % (±10): {}\n{}",
        outs[0].describe(),
        outs[1].describe()
    );
}
