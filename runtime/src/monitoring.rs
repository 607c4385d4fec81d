//! What `ichor install --monitoring` adds (issue 53): a Service over the controller's metrics
//! port, a ServiceMonitor for the Prometheus Operator, a PrometheusRule with the alerts an
//! operator of a Talos fleet expects, and a Grafana dashboard as a ConfigMap (the Grafana
//! sidecar's `grafana_dashboard` label). Pure: text in, text out.
//!
//! Start at `alerts` (each alert with its expression, what it means and what to do) and
//! `manifests`. Every metric an expression or a panel reads is one `crate::metrics` exports; a
//! test parses the expressions and checks each name against a running controller's `/metrics`.

use serde_json::{Value as Json, json};

/// One alert of the PrometheusRule.
#[derive(Clone, Debug)]
pub struct Alert {
    pub name: &'static str,
    pub expr: String,
    /// How long the expression must hold (Prometheus's `for`).
    pub for_: &'static str,
    /// `critical`, `warning` or `info`.
    pub severity: &'static str,
    pub summary: &'static str,
    /// What it means and what to do next (Prometheus templates `{{ $labels.x }}`).
    pub description: &'static str,
}

/// The alerts: an operation paused, a step stuck past its clock, a machine failed, a drain
/// blocked, a health check failing, changes waiting for a reboot, the controller absent or
/// without its Lease, reconciles failing, a cluster behind the release set.
pub fn alerts() -> Vec<Alert> {
    use render::api::{MachinePhase, Phase};
    vec![
        Alert {
            name: "IchorOperationPaused",
            expr: format!(r#"ichor_operation_info{{phase="{}"}} == 1"#, Phase::Paused.name()),
            for_: "1m",
            severity: "warning",
            summary: "TalosOperation {{ $labels.operation }} of cluster {{ $labels.cluster }} is paused",
            description: "A paused operation does nothing until someone decides: `ichor describe operation {{ $labels.operation }}` says why (status.pausedReason); fix it and `ichor operation resume {{ $labels.operation }}`, or `ichor operation abort {{ $labels.operation }}`.",
        },
        Alert {
            name: "IchorStepStuck",
            expr: "time() - ichor_operation_step_started_timestamp_seconds > 1800".into(),
            for_: "5m",
            severity: "warning",
            summary: "Machine {{ $labels.machine }}'s step ({{ $labels.stage }}) in {{ $labels.operation }} runs past its clock",
            description: "A step's clock is 20 minutes (a reboot's); after it the controller fails the step and pauses. A step older than 30 minutes means the controller is not acting on it: check that a replica holds the Lease (ichor_leader) and its logs.",
        },
        Alert {
            name: "IchorMachineFailed",
            expr: format!(r#"ichor_operation_machines{{phase="{}"}} > 0"#, MachinePhase::Failed.name()),
            for_: "0m",
            severity: "warning",
            summary: "A machine's step failed in TalosOperation {{ $labels.operation }}",
            description: "The operation paused and is never retried by itself: `ichor describe operation {{ $labels.operation }}` names the machine and why; fix the node, then `ichor operation resume {{ $labels.operation }}`.",
        },
        Alert {
            name: "IchorDrainBlocked",
            expr: r#"ichor_operation_waits{wait="DrainBlocked"} == 1"#.into(),
            for_: "10m",
            severity: "warning",
            summary: "A PodDisruptionBudget blocks the next drain of TalosOperation {{ $labels.operation }}",
            description: "The machine whose turn came is not cordoned until the budget allows an eviction; past the controller's --drain-timeout the operation pauses. `ichor status` names the budget and the pods: relax the budget or move the pods.",
        },
        Alert {
            name: "IchorHealthCheckFailing",
            expr: r#"ichor_operation_waits{wait=~"health/.+"} == 1"#.into(),
            for_: "5m",
            severity: "warning",
            summary: "Health check {{ $labels.wait }} holds TalosOperation {{ $labels.operation }}",
            description: "A check of spec.healthChecks fails: no machine's step starts and a verified step does not count as done until it passes; past its timeoutSeconds the operation pauses naming the object and the result.",
        },
        Alert {
            name: "IchorRebootPending",
            expr: "ichor_machine_reboot_paths > 0".into(),
            for_: "24h",
            severity: "info",
            summary: "Machine {{ $labels.machine }} of cluster {{ $labels.cluster }} has changes only a reboot applies",
            description: "`ichor config diff --machine {{ $labels.machine }}` lists them with the rule that decides each; `ichor config apply --cluster {{ $labels.cluster }}` rolls them out, a machine at a time.",
        },
        Alert {
            name: "IchorAppliedAwaitingReboot",
            expr: "ichor_machine_applied_awaiting_reboot_paths > 0".into(),
            for_: "24h",
            severity: "info",
            summary: "Machine {{ $labels.machine }} of cluster {{ $labels.cluster }} runs changes that take effect only at its next boot",
            description: "They were applied (Talos 1.14 and later take them into the running config) but the node still behaves as before: the next reboot puts them into effect. `ichor status --cluster {{ $labels.cluster }}` lists them.",
        },
        Alert {
            name: "IchorControllerAbsent",
            expr: "absent(ichor_build_info)".into(),
            for_: "10m",
            severity: "critical",
            summary: "No Ichor controller is scraped",
            description: "No replica of the controller exports metrics: operations do not move and machines are not reconciled. `kubectl -n ichor-system get pods,deploy` shows why.",
        },
        Alert {
            name: "IchorNoLeader",
            expr: "max(ichor_leader) < 1".into(),
            for_: "5m",
            severity: "critical",
            summary: "No Ichor controller replica holds its Lease",
            description: "Replicas run but none acts (a replica acts only while it holds the Lease ichor-system/ichor-controller): check the Lease (`kubectl -n ichor-system get lease ichor-controller -o yaml`) and the replicas' logs.",
        },
        Alert {
            name: "IchorReconcileErrors",
            expr: "rate(ichor_reconcile_errors_total[10m]) > 0".into(),
            for_: "30m",
            severity: "warning",
            summary: "Ichor's reconciles keep ending in errors",
            description: "The controller's logs name each error (an API it cannot reach, a node's Talos API down): reconciles retry with backoff.",
        },
        Alert {
            name: "IchorReleaseBehind",
            expr: "ichor_cluster_release_behind == 1".into(),
            for_: "7d",
            severity: "info",
            summary: "Cluster {{ $labels.cluster }} runs {{ $labels.component }} {{ $labels.version }}, behind the release set's {{ $labels.release_set }}",
            description: "The installed Ichor ships {{ $labels.release_set }}: `ichor upgrade cluster --cluster {{ $labels.cluster }} --dry-run` shows the path (Talos, then configs, then Kubernetes a minor at a time, then Cilium).",
        },
    ]
}

/// A dashboard panel: its title, its unit, and its queries (expression, legend).
pub type Panel = (&'static str, &'static str, &'static [(&'static str, &'static str)]);

/// The dashboard's panels.
pub const PANELS: &[Panel] = &[
    ("Operations by phase", "short", &[("sum by (kind, phase) (ichor_operations)", "{{kind}} {{phase}}")]),
    (
        "Machines in operations by step",
        "short",
        &[("sum by (operation, phase, stage) (ichor_operation_machines)", "{{operation}} {{phase}} {{stage}}")],
    ),
    ("Operations waiting", "short", &[("sum by (operation, wait) (ichor_operation_waits)", "{{operation}} {{wait}}")]),
    ("Machines by Ready", "short", &[("sum by (cluster, ready, reason) (ichor_machines)", "{{cluster}} {{reason}}")]),
    (
        "Changes waiting for a reboot",
        "short",
        &[
            ("sum by (cluster) (ichor_machine_reboot_paths)", "{{cluster}} reboot needed"),
            ("sum by (cluster) (ichor_machine_applied_awaiting_reboot_paths)", "{{cluster}} applied, awaiting reboot"),
        ],
    ),
    (
        "Reconcile time (p95)",
        "s",
        &[
            ("histogram_quantile(0.95, sum by (le) (rate(ichor_reconcile_seconds_bucket[5m])))", "whole reconcile"),
            ("histogram_quantile(0.95, sum by (le) (rate(ichor_reconcile_decide_seconds_bucket[5m])))", "deciding"),
        ],
    ),
    ("Actions", "ops", &[("sum by (kind, outcome) (rate(ichor_actions_total[5m]))", "{{kind}} {{outcome}}")]),
    ("Reconcile errors", "ops", &[("rate(ichor_reconcile_errors_total[5m])", "errors")]),
    ("Replica holding the Lease", "short", &[("ichor_leader", "{{pod}}")]),
    (
        "Clusters behind the release set",
        "short",
        &[("ichor_cluster_release_behind", "{{cluster}} {{component}} {{version}} -> {{release_set}}")],
    ),
];

/// The Grafana dashboard (JSON model, a Prometheus data source chosen by a variable).
pub fn dashboard() -> Json {
    let panels: Vec<Json> = PANELS
        .iter()
        .enumerate()
        .map(|(i, (title, unit, queries))| {
            json!({
                "id": i + 1,
                "type": "timeseries",
                "title": title,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i / 2) * 8},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": queries.iter().enumerate().map(|(j, (expr, legend))| json!({
                    "refId": ((b'A' + j as u8) as char).to_string(),
                    "expr": expr,
                    "legendFormat": legend,
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "uid": "ichor",
        "title": "Ichor",
        "tags": ["ichor", "talos"],
        "schemaVersion": 39,
        "editable": false,
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source"}]},
        "panels": panels,
    })
}

/// Every query the manifests hold: the alerts' expressions, then the dashboard's.
pub fn queries() -> Vec<String> {
    alerts()
        .into_iter()
        .map(|a| a.expr)
        .chain(PANELS.iter().flat_map(|(_, _, q)| q.iter().map(|(e, _)| e.to_string())))
        .collect()
}

/// The four documents, as YAML, for the controller's namespace.
pub fn manifests(namespace: &str) -> Vec<String> {
    let labels = json!({"app.kubernetes.io/name": "ichor-controller", "app.kubernetes.io/part-of": "ichor"});
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "ichor-controller-metrics", "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {"app.kubernetes.io/name": "ichor-controller"},
            "ports": [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}],
        },
    });
    let monitor = json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "ichor-controller", "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"app.kubernetes.io/name": "ichor-controller"}},
            "namespaceSelector": {"matchNames": [namespace]},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "30s"}],
        },
    });
    let rules: Vec<Json> = alerts()
        .iter()
        .map(|a| {
            json!({
                "alert": a.name,
                "expr": a.expr,
                "for": a.for_,
                "labels": {"severity": a.severity},
                "annotations": {"summary": a.summary, "description": a.description},
            })
        })
        .collect();
    let rule = json!({
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {"name": "ichor", "namespace": namespace, "labels": labels},
        "spec": {"groups": [{"name": "ichor", "rules": rules}]},
    });
    let dashboard = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "ichor-dashboard",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/part-of": "ichor", "grafana_dashboard": "1"},
        },
        "data": {"ichor.json": serde_json::to_string_pretty(&dashboard()).expect("JSON")},
    });
    let yaml = |v: &Json| serde_yaml::to_string(v).expect("YAML");
    vec![
        format!(
            "# Monitoring (--monitoring): the controller's metrics port as a Service, scraped by the\n\
             # Prometheus Operator (ServiceMonitor), its alerts (PrometheusRule) and a Grafana\n\
             # dashboard (a ConfigMap the Grafana sidecar loads: label grafana_dashboard).\n{}",
            yaml(&service)
        ),
        yaml(&monitor),
        yaml(&rule),
        yaml(&dashboard),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_alert_says_what_to_do_and_every_panel_has_a_query() {
        let alerts = alerts();
        let mut names: Vec<&str> = alerts.iter().map(|a| a.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), alerts.len(), "alert names are unique");
        for a in &alerts {
            assert!(["critical", "warning", "info"].contains(&a.severity), "{}", a.name);
            assert!(!a.description.is_empty() && !a.summary.is_empty(), "{}", a.name);
        }
        assert!(PANELS.iter().all(|(_, _, q)| !q.is_empty()));
        let text = manifests("ichor-system").join("---\n");
        for kind in ["kind: Service\n", "kind: ServiceMonitor\n", "kind: PrometheusRule\n", "kind: ConfigMap\n"] {
            assert!(text.contains(kind), "{kind}");
        }
    }
}
