//! The one function from observed state to the operation rules' facts.
//!
//! Each relation is documented where it is declared (rules/backbone.rules, upgrade.rules,
//! switch.rules, machine.rules); this file only translates. Times become seconds since 1970.

use crate::state::{ObservedState, epoch};
use engine::{Engine, FactBuilder};

/// Builds the facts of one reconcile. The snapshot was checked by `ObservedState::parse`.
pub fn facts(engine: &Engine, s: &ObservedState) -> FactBuilder {
    let p = &engine.program;
    let rel = |name: &str| p.relation(name).unwrap_or_else(|| panic!("the operation rules declare `{name}`"));
    let mut b = engine.fact_builder();
    let put = |b: &mut FactBuilder, name: &str, row: &[u32]| b.push(rel(name), row);
    let now = epoch(&s.now).unwrap_or(0);
    let n = b.num(now);
    put(&mut b, "now", &[n]);
    // The operation.
    let op = &s.operation;
    let row = [b.sym(&op.name), b.sym(&op.kind), b.sym(&op.phase)];
    put(&mut b, "operation", &row);
    if let Some(r) = &op.paused_reason {
        let id = b.sym(r);
        put(&mut b, "paused_reason", &[id]);
    }
    let mu = b.num(op.max_unavailable);
    put(&mut b, "max_unavailable", &[mu]);
    if let Some(t) = &op.target_kubernetes {
        let id = b.sym(t);
        put(&mut b, "target_kubernetes", &[id]);
    }
    if let Some(t) = &op.target_kube_proxy {
        let id = b.sym(t);
        put(&mut b, "target_kube_proxy", &[id]);
    }
    for (m, pr) in &op.machines {
        let row = [
            b.sym(m),
            b.sym(&pr.phase),
            b.sym(pr.stage.as_deref().unwrap_or("")),
            b.num(epoch(&pr.started_at).unwrap_or(now)),
        ];
        put(&mut b, "progress", &row);
    }
    for (r, t) in &op.waiting_since {
        let row = [b.sym(r), b.num(epoch(t).unwrap_or(now))];
        put(&mut b, "waiting_since", &row);
    }
    for d in &op.done {
        let id = b.sym(d);
        put(&mut b, "step_done", &[id]);
    }
    for o in &s.other_operations {
        let row = [b.sym(&o.name), b.sym(&o.kind), b.sym(&o.phase)];
        put(&mut b, "other_operation", &row);
    }
    // The cluster.
    let c = &s.cluster;
    let id = b.sym(&c.release_set_kubernetes);
    put(&mut b, "release_set_kubernetes", &[id]);
    let row = [b.sym(&c.cni.preset), b.sym(&c.cni.handover)];
    put(&mut b, "cni", &row);
    if c.cni.handover_done {
        put(&mut b, "handover_done", &[]);
    }
    if let Some(pch) = &c.cni.bootstrap_patch {
        let id = b.sym(pch);
        put(&mut b, "bootstrap_patch", &[id]);
    }
    let id = b.sym(&c.cni.kube_proxy);
    put(&mut b, "spec_kube_proxy", &[id]);
    if let Some(k) = &c.status_kube_proxy {
        let id = b.sym(k);
        put(&mut b, "status_kube_proxy", &[id]);
    }
    if let Some(mode) = c.annotations.get("ichor.maesh.dev/confirm-kube-proxy-switch") {
        let id = b.sym(mode);
        put(&mut b, "consent", &[id]);
    }
    // Machines, with their position in name order.
    let mut names: Vec<&str> = s.machines.iter().map(|m| m.name.as_str()).collect();
    names.sort_unstable();
    for m in &s.machines {
        let name = b.sym(&m.name);
        let row = [name, b.sym(&m.role)];
        put(&mut b, "machine", &row);
        let idx = names.iter().position(|x| *x == m.name).unwrap_or(0) as i64;
        let row = [name, b.num(idx)];
        put(&mut b, "machine_order", &row);
        let row = [name, b.sym(&m.talos_version), b.sym(&m.kubelet_version)];
        put(&mut b, "machine_versions", &row);
        if m.ready {
            put(&mut b, "node_ready", &[name]);
        }
        if m.hold {
            put(&mut b, "held", &[name]);
        }
        if m.runs_controller {
            put(&mut b, "runs_controller", &[name]);
        }
        for pp in &m.pending {
            let row = [name, b.sym(&pp.path), b.sym(&pp.class), b.sym(pp.applied_by.as_deref().unwrap_or("none"))];
            put(&mut b, "pending", &row);
            if let Some(v) = &pp.new {
                let row = [name, b.sym(&pp.path), b.sym(v)];
                put(&mut b, "pending_value", &row);
            }
        }
        for (component, pod) in &m.static_pods {
            let row = [name, b.sym(component), b.sym(&pod.image), b.sym(if pod.ready { "true" } else { "false" })];
            put(&mut b, "static_pod", &row);
        }
    }
    for pair in names.windows(2) {
        let row = [b.sym(pair[0]), b.sym(pair[1])];
        put(&mut b, "next_in_order", &row);
    }
    if let Some(last) = names.last() {
        let id = b.sym(last);
        put(&mut b, "last_in_order", &[id]);
    }
    // The workload cluster.
    let w = &s.workload;
    if let Some(v) = &w.cilium_kube_proxy_replacement {
        let id = b.sym(v);
        put(&mut b, "cilium_kpr", &[id]);
    }
    if let Some(d) = &w.cilium_daemon_set {
        let row =
            [b.num(d.desired), b.num(d.updated), b.num(d.ready), b.num(d.generation), b.num(d.observed_generation)];
        put(&mut b, "cilium_ds", &row);
    }
    if let Some(d) = &w.kube_proxy_daemon_set {
        let row = [b.num(d.desired), b.num(d.updated), b.num(d.ready), b.sym(d.image.as_deref().unwrap_or(""))];
        put(&mut b, "kube_proxy_ds", &row);
    }
    for cm in &w.kube_proxy_config_maps {
        let id = b.sym(cm);
        put(&mut b, "kube_proxy_configmap", &[id]);
    }
    if w.kubernetes_service_answers {
        put(&mut b, "service_answers", &[]);
    }
    for api in &w.removed_apis_in_use {
        let row = [b.sym(&api.api), b.sym(&api.removed_in)];
        put(&mut b, "removed_api_in_use", &row);
    }
    b
}
