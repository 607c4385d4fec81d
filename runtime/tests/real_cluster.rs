//! Against a real cluster, read-only, skipped unless `ICHOR_REAL_KUBECONFIG` and
//! `ICHOR_REAL_TALOSCONFIG` point at one (see docs/controller.md): reads the
//! workload, observes every TalosMachine's node through Talos, and plans each TalosOperation
//! without executing anything.

use std::time::Duration;

#[tokio::test]
async fn plans_every_operation_of_a_real_cluster_without_acting() {
    let (Ok(kubeconfig), Ok(talosconfig)) =
        (std::env::var("ICHOR_REAL_KUBECONFIG"), std::env::var("ICHOR_REAL_TALOSCONFIG"))
    else {
        eprintln!("skipped: set ICHOR_REAL_KUBECONFIG and ICHOR_REAL_TALOSCONFIG to run against a real cluster");
        return;
    };
    let namespace = std::env::var("ICHOR_REAL_NAMESPACE").unwrap_or_else(|_| "ichor-system".into());
    let kc = kube_client::config::Kubeconfig::read_from(&kubeconfig).expect("the kubeconfig reads");
    let config = kube_client::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("the kubeconfig has a context");
    let kube = kube_client::Client::try_from(config).expect("a client");
    let text = std::fs::read_to_string(&talosconfig).expect("the talosconfig reads");
    let tc = runtime::talos::config::TalosConfig::parse(&text, &talosconfig).unwrap();
    let (n, ctx) = tc.context(None, &talosconfig).unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let talos = runtime::talos::client::Client::new(
        ctx,
        &ctx.credentials(n, &talosconfig, now).unwrap(),
        Duration::from_secs(15),
    )
    .unwrap();
    let probe = runtime::controller::ProbeResult { answers: true, target: "not probed (a read-only test)".into() };
    let workload =
        runtime::kube::read_workload(&kube, probe, "ichor-real-cluster-test").await.expect("the workload reads");
    eprintln!("workload: {workload:?}");
    let controller = runtime::controller::Controller::new(
        kube.clone(),
        talos,
        runtime::plan::Planner::embedded().unwrap(),
        render::classify::Classifier::new(&render::classify::RuleSet::embedded()).unwrap(),
    );
    let ops: kube_client::Api<render::api::TalosOperation> = kube_client::Api::namespaced(kube, &namespace);
    for op in ops.list(&Default::default()).await.unwrap().items {
        let name = op.metadata.name.unwrap_or_default();
        let read = controller.read(&namespace, &name, &runtime::plan::rfc3339(now)).await.expect("the operation reads");
        let plan = controller.planner.plan(&read.snapshot).expect("it plans");
        eprintln!("{name}: {} ({} action(s), nothing executed)", plan.phase, plan.actions.len());
        for (a, _) in &plan.actions {
            eprintln!("  {a}");
        }
    }
}
