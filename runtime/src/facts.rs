//! The operations host: the relations it fills and reads, bound once at load, and the one
//! function from observed state to facts.
//!
//! Start at `Rels::bind` (every relation of `rules/programs/operations.rules` and the outputs
//! the planner decodes, checked against the program: a mismatch is a load error) and `facts`
//! (the snapshot translated, nothing decided). Each input is documented, column by column, in
//! `rules/programs/operations.rules`. Times become seconds since 1970.

use crate::state::{ObservedState, epoch};
use engine::Type::{Number as N, Symbol as S};
use engine::{BindError, Binder, Engine, FactBuilder, Input, Output, Program};

/// The operations program's relations, as this host uses them.
#[derive(Clone, Copy, Debug)]
pub struct Rels {
    pub now: Input<1>,
    pub operation: Input<3>,
    pub paused_reason: Input<1>,
    pub max_unavailable: Input<1>,
    pub other_operation: Input<3>,
    pub machine: Input<2>,
    pub machine_versions: Input<3>,
    pub node_ready: Input<1>,
    pub held: Input<1>,
    pub runs_controller: Input<1>,
    pub pending: Input<4>,
    pub progress: Input<4>,
    pub waiting_since: Input<2>,
    pub step_done: Input<1>,
    pub machine_order: Input<2>,
    pub next_in_order: Input<2>,
    pub last_in_order: Input<1>,
    pub pending_value: Input<3>,
    pub node_boot: Input<2>,
    pub talos_boot: Input<2>,
    pub progress_boot: Input<2>,
    pub rollout_machine: Input<1>,
    pub awaiting_reboot: Input<2>,
    pub service_unhealthy: Input<2>,
    pub ichor_cordoned: Input<1>,
    pub drain_refused: Input<3>,
    pub pending_restart: Input<3>,
    pub cilium_values_refused: Input<2>,
    pub target_kubernetes: Input<1>,
    pub target_talos: Input<1>,
    pub talos_installer: Input<1>,
    pub allow_downgrade: Input<0>,
    pub force_drain: Input<0>,
    pub drain_deadline: Input<1>,
    pub node_os_image: Input<2>,
    pub target_cilium_chart: Input<1>,
    pub release_set_kubernetes: Input<1>,
    pub release_set_talos: Input<1>,
    pub ichor_tainted: Input<1>,
    pub has_windows: Input<0>,
    pub window_open: Input<0>,
    pub window_next: Input<2>,
    pub window_problem: Input<1>,
    pub health_check: Input<2>,
    pub health_failing: Input<3>,
    pub health_passed: Input<2>,
    pub act_taint: Output<1>,
    pub act_untaint: Output<1>,
    pub cni: Input<2>,
    pub handover_done: Input<0>,
    pub static_pod: Input<4>,
    pub removed_api_in_use: Input<2>,
    pub kube_proxy_ds: Input<4>,
    pub target_kube_proxy: Input<1>,
    pub cilium_kpr: Input<1>,
    pub cilium_ds: Input<5>,
    pub kube_proxy_configmap: Input<1>,
    pub service_answers: Input<0>,
    pub service_probe: Input<1>,
    pub bootstrap_patch: Input<1>,
    pub consent: Input<1>,
    pub spec_kube_proxy: Input<1>,
    pub status_kube_proxy: Input<1>,
    pub home_kpr: Input<1>,
    pub argocd_application: Input<2>,
    pub cilium_api_server: Input<2>,
    pub cilium_config_read: Input<0>,
    pub cilium_chart_running: Input<1>,
    pub embedded_cilium_chart: Input<1>,
    pub kube_proxy_object: Input<2>,
    pub kube_proxy_manifest_rendered: Input<1>,
    pub machine_contract: Input<2>,
    pub machine_condition: Input<3>,
    pub removed_apis_unknown: Input<1>,
    pub cilium_job_failed: Input<2>,
    pub cilium_job_in_flight: Input<1>,
    pub cilium_job_succeeded: Input<1>,
    pub cilium_ipam: Input<1>,
    pub cilium_owner: Input<2>,
    pub cilium_adopted: Input<1>,
    pub abort_requested: Input<0>,
    pub inputs_rejected: Input<1>,
    pub resume_requested: Input<0>,
    pub stage_operation: Input<5>,
    pub stage_recorded: Input<2>,
    pub release_parent: Input<1>,
    pub release_stage: Output<3>,
    pub release_set: Output<2>,
    pub release_set_problem: Output<3>,
    pub act_start_stage: Output<2>,
    pub act_pause: Output<3>,
    pub act_fail: Output<3>,
    pub act_set_kube_proxy_status: Output<1>,
    pub act_start: Output<2>,
    pub act_pull_image: Output<3>,
    pub act_cordon: Output<1>,
    pub act_drain: Output<1>,
    pub act_drain_forced: Output<1>,
    pub act_apply: Output<2>,
    pub act_apply_staged: Output<2>,
    pub act_reboot: Output<1>,
    pub act_upgrade_talos: Output<3>,
    pub act_stage: Output<2>,
    pub roll_path: Output<2>,
    pub act_done: Output<1>,
    pub act_uncordon: Output<1>,
    pub act_sync_manifests: Output<1>,
    pub act_delete: Output<5>,
    pub act_restore_kube_proxy: Output<2>,
    pub act_cilium_job: Output<1>,
    pub cilium_job_takes_ownership: Output<0>,
    pub act_record_adoption: Output<1>,
    pub plan_check: Output<2>,
    pub drain_refused_now: Output<3>,
    pub drain_forced_now: Output<3>,
    pub nothing_to_do: Output<2>,
    pub act_step_done: Output<1>,
    pub act_wait: Output<5>,
    pub act_clear_clock: Output<1>,
    pub act_warn: Output<3>,
    pub act_complete: Output<0>,
    pub act_resume: Output<0>,
    pub act_abort: Output<1>,
    pub terminal: Output<1>,
    pub holds_lock: Output<1>,
    pub phase: Output<1>,
    pub action_order: Output<2>,
    pub current_kube_proxy_mode: Output<1>,
    pub cilium_job_mode: Output<1>,
    pub operation_order: Output<3>,
    pub work_left: Output<1>,
}

impl Rels {
    /// Binds every relation, or reports every one the program lacks or declares otherwise.
    pub fn bind(program: &Program) -> Result<Rels, BindError> {
        let mut b = Binder::new(program, "operations");
        let rels = Rels {
            now: b.input("now", [("t", N)]),
            operation: b.input("operation", [("name", S), ("kind", S), ("phase", S)]),
            paused_reason: b.input("paused_reason", [("reason", S)]),
            max_unavailable: b.input("max_unavailable", [("n", N)]),
            other_operation: b.input("other_operation", [("name", S), ("kind", S), ("phase", S)]),
            machine: b.input("machine", [("name", S), ("role", S)]),
            machine_versions: b.input("machine_versions", [("name", S), ("talos", S), ("kubelet", S)]),
            node_ready: b.input("node_ready", [("name", S)]),
            held: b.input("held", [("name", S)]),
            runs_controller: b.input("runs_controller", [("name", S)]),
            pending: b.input("pending", [("machine", S), ("path", S), ("class", S), ("owner", S)]),
            progress: b.input("progress", [("machine", S), ("phase", S), ("stage", S), ("started", N)]),
            waiting_since: b.input("waiting_since", [("reason", S), ("t", N)]),
            step_done: b.input("step_done", [("step", S)]),
            machine_order: b.input("machine_order", [("name", S), ("index", N)]),
            next_in_order: b.input("next_in_order", [("a", S), ("b", S)]),
            last_in_order: b.input("last_in_order", [("machine", S)]),
            pending_value: b.input("pending_value", [("machine", S), ("path", S), ("value", S)]),
            node_boot: b.input("node_boot", [("machine", S), ("boot", S)]),
            talos_boot: b.input("talos_boot", [("machine", S), ("boot", S)]),
            progress_boot: b.input("progress_boot", [("machine", S), ("boot", S)]),
            rollout_machine: b.input("rollout_machine", [("machine", S)]),
            awaiting_reboot: b.input("awaiting_reboot", [("machine", S), ("path", S)]),
            service_unhealthy: b.input("service_unhealthy", [("machine", S), ("service", S)]),
            ichor_cordoned: b.input("ichor_cordoned", [("machine", S)]),
            drain_refused: b.input("drain_refused", [("machine", S), ("budget", S), ("pods", S)]),
            pending_restart: b.input("pending_restart", [("machine", S), ("path", S), ("service", S)]),
            cilium_values_refused: b.input("cilium_values_refused", [("mode", S), ("refusal", S)]),
            target_kubernetes: b.input("target_kubernetes", [("version", S)]),
            target_talos: b.input("target_talos", [("version", S)]),
            talos_installer: b.input("talos_installer", [("image", S)]),
            allow_downgrade: b.input("allow_downgrade", []),
            force_drain: b.input("force_drain", []),
            drain_deadline: b.input("drain_deadline", [("seconds", N)]),
            node_os_image: b.input("node_os_image", [("machine", S), ("image", S)]),
            target_cilium_chart: b.input("target_cilium_chart", [("version", S)]),
            release_set_kubernetes: b.input("release_set_kubernetes", [("version", S)]),
            release_set_talos: b.input("release_set_talos", [("version", S)]),
            ichor_tainted: b.input("ichor_tainted", [("machine", S)]),
            has_windows: b.input("has_windows", []),
            window_open: b.input("window_open", []),
            window_next: b.input("window_next", [("start", S), ("at", N)]),
            window_problem: b.input("window_problem", [("problem", S)]),
            health_check: b.input("health_check", [("check", S), ("timeout", N)]),
            health_failing: b.input("health_failing", [("check", S), ("object", S), ("result", S)]),
            health_passed: b.input("health_passed", [("check", S), ("object", S)]),
            act_taint: b.output("act_taint", [("machine", S)]),
            act_untaint: b.output("act_untaint", [("machine", S)]),
            cni: b.input("cni", [("preset", S), ("handover", S)]),
            handover_done: b.input("handover_done", []),
            static_pod: b.input("static_pod", [("machine", S), ("component", S), ("image", S), ("ready", S)]),
            removed_api_in_use: b.input("removed_api_in_use", [("api", S), ("removed_in", S)]),
            kube_proxy_ds: b.input("kube_proxy_ds", [("desired", N), ("updated", N), ("ready", N), ("image", S)]),
            target_kube_proxy: b.input("target_kube_proxy", [("mode", S)]),
            cilium_kpr: b.input("cilium_kpr", [("value", S)]),
            cilium_ds: b
                .input("cilium_ds", [("desired", N), ("updated", N), ("ready", N), ("generation", N), ("observed", N)]),
            kube_proxy_configmap: b.input("kube_proxy_configmap", [("name", S)]),
            service_answers: b.input("service_answers", []),
            service_probe: b.input("service_probe", [("target", S)]),
            bootstrap_patch: b.input("bootstrap_patch", [("name", S)]),
            consent: b.input("consent", [("mode", S)]),
            spec_kube_proxy: b.input("spec_kube_proxy", [("mode", S)]),
            status_kube_proxy: b.input("status_kube_proxy", [("mode", S)]),
            home_kpr: b.input("home_kpr", [("value", S)]),
            argocd_application: b.input("argocd_application", [("health", S), ("sync", S)]),
            cilium_api_server: b.input("cilium_api_server", [("host", S), ("port", S)]),
            cilium_config_read: b.input("cilium_config_read", []),
            cilium_chart_running: b.input("cilium_chart_running", [("version", S)]),
            embedded_cilium_chart: b.input("embedded_cilium_chart", [("version", S)]),
            kube_proxy_object: b.input("kube_proxy_object", [("kind", S), ("name", S)]),
            kube_proxy_manifest_rendered: b.input("kube_proxy_manifest_rendered", [("machine", S)]),
            machine_contract: b.input("machine_contract", [("machine", S), ("contract", S)]),
            machine_condition: b.input("machine_condition", [("machine", S), ("type", S), ("reason", S)]),
            removed_apis_unknown: b.input("removed_apis_unknown", [("reason", S)]),
            cilium_job_failed: b.input("cilium_job_failed", [("mode", S), ("reason", S)]),
            cilium_job_in_flight: b.input("cilium_job_in_flight", [("job", S)]),
            cilium_job_succeeded: b.input("cilium_job_succeeded", [("mode", S)]),
            cilium_ipam: b.input("cilium_ipam", [("mode", S)]),
            cilium_owner: b.input("cilium_owner", [("kind", S), ("name", S)]),
            cilium_adopted: b.input("cilium_adopted", [("operation", S)]),
            abort_requested: b.input("abort_requested", []),
            inputs_rejected: b.input("inputs_rejected", [("reason", S)]),
            resume_requested: b.input("resume_requested", []),
            stage_operation: b
                .input("stage_operation", [("kind", S), ("target", S), ("name", S), ("phase", S), ("reason", S)]),
            stage_recorded: b.input("stage_recorded", [("kind", S), ("target", S)]),
            release_parent: b.input("release_parent", [("name", S)]),
            release_stage: b.output("release_stage", [("order", N), ("kind", S), ("target", S)]),
            release_set: b.output("release_set", [("component", S), ("version", S)]),
            release_set_problem: b.output("release_set_problem", [("component", S), ("version", S), ("why", S)]),
            act_start_stage: b.output("act_start_stage", [("kind", S), ("target", S)]),
            act_pause: b.output("act_pause", [("template", S), ("machine", S), ("detail", S)]),
            act_fail: b.output("act_fail", [("machine", S), ("template", S), ("detail", S)]),
            act_set_kube_proxy_status: b.output("act_set_kube_proxy_status", [("mode", S)]),
            act_start: b.output("act_start", [("machine", S), ("stage", S)]),
            act_pull_image: b.output("act_pull_image", [("machine", S), ("namespace", S), ("image", S)]),
            act_cordon: b.output("act_cordon", [("machine", S)]),
            act_drain: b.output("act_drain", [("machine", S)]),
            act_drain_forced: b.output("act_drain_forced", [("machine", S)]),
            act_apply: b.output("act_apply", [("machine", S), ("path", S)]),
            act_apply_staged: b.output("act_apply_staged", [("machine", S), ("path", S)]),
            act_reboot: b.output("act_reboot", [("machine", S)]),
            act_upgrade_talos: b.output("act_upgrade_talos", [("machine", S), ("image", S), ("api", S)]),
            act_stage: b.output("act_stage", [("machine", S), ("stage", S)]),
            roll_path: b.output("roll_path", [("machine", S), ("path", S)]),
            act_done: b.output("act_done", [("machine", S)]),
            act_uncordon: b.output("act_uncordon", [("machine", S)]),
            act_sync_manifests: b.output("act_sync_manifests", [("via", S)]),
            act_delete: b
                .output("act_delete", [("order", N), ("api_version", S), ("kind", S), ("namespace", S), ("name", S)]),
            act_restore_kube_proxy: b.output("act_restore_kube_proxy", [("via", S), ("manifest", S)]),
            act_cilium_job: b.output("act_cilium_job", [("mode", S)]),
            cilium_job_takes_ownership: b.output("cilium_job_takes_ownership", []),
            act_record_adoption: b.output("act_record_adoption", [("chart", S)]),
            plan_check: b.output("plan_check", [("template", S), ("detail", S)]),
            nothing_to_do: b.output("nothing_to_do", [("template", S), ("detail", S)]),
            drain_refused_now: b.output("drain_refused_now", [("machine", S), ("budget", S), ("pods", S)]),
            drain_forced_now: b.output("drain_forced_now", [("machine", S), ("budget", S), ("pods", S)]),
            act_step_done: b.output("act_step_done", [("step", S)]),
            act_wait: b.output("act_wait", [("template", S), ("detail", S), ("clock", S), ("since", N), ("limit", N)]),
            act_clear_clock: b.output("act_clear_clock", [("clock", S)]),
            act_warn: b.output("act_warn", [("template", S), ("a", S), ("b", S)]),
            act_complete: b.output("act_complete", []),
            act_resume: b.output("act_resume", []),
            act_abort: b.output("act_abort", [("was", S)]),
            terminal: b.output("terminal", [("phase", S)]),
            holds_lock: b.output("holds_lock", [("phase", S)]),
            phase: b.output("phase", [("phase", S)]),
            action_order: b.output("action_order", [("action", S), ("rank", N)]),
            current_kube_proxy_mode: b.output("current_kube_proxy_mode", [("mode", S)]),
            cilium_job_mode: b.output("cilium_job_mode", [("mode", S)]),
            operation_order: b.output("operation_order", [("machine", S), ("rank", N), ("index", N)]),
            work_left: b.output("work_left", [("machine", S)]),
        };
        b.finish()?;
        Ok(rels)
    }
}

/// Builds the facts of one reconcile. The snapshot was checked by `ObservedState::parse`;
/// `keys` is the Cilium chart's key inventory the values are validated against.
pub fn facts(engine: &Engine, r: &Rels, s: &ObservedState, keys: &render::inventory::Inventory) -> FactBuilder {
    let mut b = engine.fact_builder();
    let now = epoch(&s.now).unwrap_or(0);
    let n = b.num(now);
    r.now.push(&mut b, [n]);
    operation_facts(&mut b, r, s, now);
    cluster_facts(&mut b, r, s, keys);
    machine_facts(&mut b, r, s);
    workload_facts(&mut b, r, s);
    b
}

/// The operation's facts: its kind, phase, the user's intent, its targets, each machine's step,
/// its clocks and steps done, the other operations, a release's chain.
fn operation_facts(b: &mut FactBuilder, r: &Rels, s: &ObservedState, now: i64) {
    // The operation.
    let op = &s.operation;
    let row = [b.sym(&op.name), b.sym(op.kind.name()), b.sym(op.phase.name())];
    r.operation.push(b, row);
    // The user's intent (annotations): the rules move the phase.
    if op.intent.abort {
        r.abort_requested.push(b, []);
    }
    if op.intent.resume_pending() {
        r.resume_requested.push(b, []);
    }
    if let Some(reason) = &op.paused_reason {
        let id = b.sym(reason);
        r.paused_reason.push(b, [id]);
    }
    let mu = b.num(op.max_unavailable);
    r.max_unavailable.push(b, [mu]);
    if let Some(t) = &op.target_kubernetes {
        let id = b.sym(t);
        r.target_kubernetes.push(b, [id]);
    }
    if let Some(t) = &op.target_talos {
        let id = b.sym(t);
        r.target_talos.push(b, [id]);
    }
    if let Some(i) = &op.talos_installer {
        let id = b.sym(i);
        r.talos_installer.push(b, [id]);
    }
    if op.allow_downgrade {
        r.allow_downgrade.push(b, []);
    }
    if op.force_drain {
        r.force_drain.push(b, []);
    }
    if let Some(d) = op.drain_deadline {
        let d = b.num(d);
        r.drain_deadline.push(b, [d]);
    }
    if let Some(t) = op.target_kube_proxy {
        let id = b.sym(t.name());
        r.target_kube_proxy.push(b, [id]);
    }
    if let Some(t) = &op.target_cilium_chart {
        let id = b.sym(t);
        r.target_cilium_chart.push(b, [id]);
    }
    for (m, pr) in &op.machines {
        let row = [
            b.sym(m),
            b.sym(pr.phase.name()),
            b.sym(pr.stage.as_deref().unwrap_or("")),
            b.num(pr.started_at.as_deref().and_then(epoch).unwrap_or(now)),
        ];
        r.progress.push(b, row);
        if let Some(boot) = &pr.boot_id {
            let row = [b.sym(m), b.sym(boot)];
            r.progress_boot.push(b, row);
        }
    }
    for m in &op.target_machines {
        let id = b.sym(m);
        r.rollout_machine.push(b, [id]);
    }
    for (reason, t) in &op.waiting_since {
        let row = [b.sym(reason), b.num(epoch(t).unwrap_or(now))];
        r.waiting_since.push(b, row);
    }
    for d in &op.done {
        let id = b.sym(d);
        r.step_done.push(b, [id]);
    }
    for o in &s.other_operations {
        let row = [b.sym(&o.name), b.sym(o.kind.name()), b.sym(o.phase.name())];
        r.other_operation.push(b, row);
    }
    // A release's chain: its stage operations and the stages its status holds; a stage's release.
    for o in &s.stage_operations {
        let reason = o.paused_reason.as_deref().unwrap_or_default();
        let row = [b.sym(o.kind.name()), b.sym(&o.target), b.sym(&o.name), b.sym(o.phase.name()), b.sym(reason)];
        r.stage_operation.push(b, row);
    }
    for st in &op.stages {
        let row = [b.sym(st.kind.name()), b.sym(&st.target)];
        r.stage_recorded.push(b, row);
    }
    if let Some(release) = &op.release {
        let id = b.sym(release);
        r.release_parent.push(b, [id]);
    }
    if let Some(why) = &s.inputs_rejected {
        let id = b.sym(why);
        r.inputs_rejected.push(b, [id]);
    }
}

/// The cluster's facts: the Cilium values' validation per mode, the release set, the windows and
/// health checks, the CNI, the consent.
fn cluster_facts(b: &mut FactBuilder, r: &Rels, s: &ObservedState, keys: &render::inventory::Inventory) {
    // The cluster.
    let c = &s.cluster;
    // The one validation, for each mode a Job could run with: the rules decide which applies.
    if let Some(values) = &c.cilium_values {
        for mode in render::api::KubeProxyMode::ALL {
            for refusal in render::cilium::validate(values, keys, *mode == render::api::KubeProxyMode::Replaced) {
                let row = [b.sym(mode.name()), b.sym(&refusal.to_string())];
                r.cilium_values_refused.push(b, row);
            }
        }
    }
    let id = b.sym(&c.release_set_kubernetes);
    r.release_set_kubernetes.push(b, [id]);
    if let Some(m) = &c.maintenance {
        r.has_windows.push(b, []);
        if m.open {
            r.window_open.push(b, []);
        }
        if let Some(t) = &m.next_start {
            let row = [b.sym(t), b.num(epoch(t).unwrap_or_default())];
            r.window_next.push(b, row);
        }
        for p in &m.problems {
            let id = b.sym(p);
            r.window_problem.push(b, [id]);
        }
    }
    for h in &c.health {
        let row = [b.sym(&h.name), b.num(h.timeout_seconds)];
        r.health_check.push(b, row);
        for res in &h.results {
            if res.passed {
                let row = [b.sym(&h.name), b.sym(&res.object)];
                r.health_passed.push(b, row);
            } else {
                let row = [b.sym(&h.name), b.sym(&res.object), b.sym(&res.result)];
                r.health_failing.push(b, row);
            }
        }
    }
    if !c.release_set_talos.is_empty() {
        let id = b.sym(&c.release_set_talos);
        r.release_set_talos.push(b, [id]);
    }
    let row = [b.sym(c.cni.preset.name()), b.sym(c.cni.handover.name())];
    r.cni.push(b, row);
    if c.cni.handover_done {
        r.handover_done.push(b, []);
    }
    if let Some(pch) = &c.cni.bootstrap_patch {
        let id = b.sym(pch);
        r.bootstrap_patch.push(b, [id]);
    }
    if let Some(v) = &c.cni.home_kube_proxy_replacement {
        let id = b.sym(v);
        r.home_kpr.push(b, [id]);
    }
    if let Some(a) = &c.cilium_adoption {
        let id = b.sym(&a.operation);
        r.cilium_adopted.push(b, [id]);
    }
    let id = b.sym(render::embedded::CILIUM_CHART_VERSION);
    r.embedded_cilium_chart.push(b, [id]);
    let id = b.sym(c.cni.kube_proxy.name());
    r.spec_kube_proxy.push(b, [id]);
    if let Some(k) = c.status_kube_proxy {
        let id = b.sym(k.name());
        r.status_kube_proxy.push(b, [id]);
    }
    if let Some(mode) = c.annotations.get(render::api::CONFIRM_KUBE_PROXY_SWITCH) {
        let id = b.sym(mode);
        r.consent.push(b, [id]);
    }
}

/// Each machine's facts, with its position in name order.
fn machine_facts(b: &mut FactBuilder, r: &Rels, s: &ObservedState) {
    // Machines, with their position in name order.
    let mut names: Vec<&str> = s.machines.iter().map(|m| m.name.as_str()).collect();
    names.sort_unstable();
    for m in &s.machines {
        let name = b.sym(&m.name);
        let row = [name, b.sym(m.role.name())];
        r.machine.push(b, row);
        let idx = names.binary_search(&m.name.as_str()).unwrap_or(0) as i64;
        let row = [name, b.num(idx)];
        r.machine_order.push(b, row);
        let row = [name, b.sym(&m.talos_version), b.sym(&m.kubelet_version)];
        r.machine_versions.push(b, row);
        if m.ready {
            r.node_ready.push(b, [name]);
        }
        if m.hold {
            r.held.push(b, [name]);
        }
        if m.runs_controller {
            r.runs_controller.push(b, [name]);
        }
        for pp in &m.pending {
            let owner = pp.applied_by.map_or("none", |k| k.name());
            let row = [name, b.sym(&pp.path), b.sym(pp.class.name()), b.sym(owner)];
            r.pending.push(b, row);
            for svc in &pp.restarts {
                let row = [name, b.sym(&pp.path), b.sym(svc)];
                r.pending_restart.push(b, row);
            }
            if let Some(v) = &pp.new {
                let row = [name, b.sym(&pp.path), b.sym(v)];
                r.pending_value.push(b, row);
            }
        }
        if let Some(boot) = &m.boot_id {
            let row = [name, b.sym(boot)];
            r.node_boot.push(b, row);
        }
        if let Some(os) = &m.os_image {
            let row = [name, b.sym(os)];
            r.node_os_image.push(b, row);
        }
        if let Some(boot) = &m.talos_boot_id {
            let row = [name, b.sym(boot)];
            r.talos_boot.push(b, row);
        }
        for p in &m.awaiting_reboot {
            let row = [name, b.sym(p)];
            r.awaiting_reboot.push(b, row);
        }
        if m.cordoned {
            r.ichor_cordoned.push(b, [name]);
        }
        if m.tainted {
            r.ichor_tainted.push(b, [name]);
        }
        for d in &m.drain_refusals {
            let row = [name, b.sym(&d.budget), b.sym(&d.pods.join(", "))];
            r.drain_refused.push(b, row);
        }
        for svc in &m.unhealthy_services {
            let row = [name, b.sym(svc)];
            r.service_unhealthy.push(b, row);
        }
        if let Some(c) = m.contract {
            let row = [name, b.sym(&c.to_string())];
            r.machine_contract.push(b, row);
        }
        if m.role == render::api::Role::Controlplane && m.kube_proxy_manifest_rendered != Some(false) {
            r.kube_proxy_manifest_rendered.push(b, [name]);
        }
        for (kind, reason) in &m.conditions {
            let row = [name, b.sym(kind), b.sym(reason)];
            r.machine_condition.push(b, row);
        }
        for (component, pod) in &m.static_pods {
            let row = [name, b.sym(component), b.sym(&pod.image), b.sym(if pod.ready { "true" } else { "false" })];
            r.static_pod.push(b, row);
        }
    }
    for pair in names.windows(2) {
        let row = [b.sym(pair[0]), b.sym(pair[1])];
        r.next_in_order.push(b, row);
    }
    if let Some(last) = names.last() {
        let id = b.sym(last);
        r.last_in_order.push(b, [id]);
    }
}

/// The workload cluster's facts: Cilium, kube-proxy, the Jobs, the kubernetes Service, the
/// removed APIs in use.
fn workload_facts(b: &mut FactBuilder, r: &Rels, s: &ObservedState) {
    // The workload cluster.
    let w = &s.workload;
    if let Some(v) = &w.cilium_kube_proxy_replacement {
        let id = b.sym(v);
        r.cilium_kpr.push(b, [id]);
    }
    if w.cilium_config_read {
        r.cilium_config_read.push(b, []);
    }
    if w.cilium_k8s_service_host.is_some() || w.cilium_k8s_service_port.is_some() {
        let row = [
            b.sym(w.cilium_k8s_service_host.as_deref().unwrap_or("")),
            b.sym(w.cilium_k8s_service_port.as_deref().unwrap_or("")),
        ];
        r.cilium_api_server.push(b, row);
    }
    if let Some(v) = &w.cilium_chart_version {
        let id = b.sym(v);
        r.cilium_chart_running.push(b, [id]);
    }
    if let Some(a) = &w.argocd_application {
        let row = [b.sym(&a.health), b.sym(&a.sync)];
        r.argocd_application.push(b, row);
    }
    // Unobserved: present while the DaemonSet or a ConfigMap is (deleting a missing one is a no-op).
    let others = w.kube_proxy_daemon_set.is_some() || !w.kube_proxy_config_maps.is_empty();
    for (kind, seen) in
        [("ServiceAccount", w.kube_proxy_service_account), ("ClusterRoleBinding", w.kube_proxy_cluster_role_binding)]
    {
        if seen.unwrap_or(others) {
            let row = [b.sym(kind), b.sym("kube-proxy")];
            r.kube_proxy_object.push(b, row);
        }
    }
    for (mode, why) in &w.cilium_jobs_failed {
        let row = [b.sym(mode.name()), b.sym(why)];
        r.cilium_job_failed.push(b, row);
    }
    for job in &w.cilium_jobs_in_flight {
        let id = b.sym(job);
        r.cilium_job_in_flight.push(b, [id]);
    }
    for mode in &w.cilium_jobs_succeeded {
        let id = b.sym(mode.name());
        r.cilium_job_succeeded.push(b, [id]);
    }
    // cilium-config's `ipam`; `""` for a cilium-config read without the key.
    if let Some(ipam) = w.cilium_ipam.as_deref().or(w.cilium_config_read.then_some("")) {
        let id = b.sym(ipam);
        r.cilium_ipam.push(b, [id]);
    }
    for o in &w.cilium_owners {
        let row = [b.sym(&o.kind), b.sym(&o.name)];
        r.cilium_owner.push(b, row);
    }
    if let Some(why) = &w.removed_apis_check_failed {
        let id = b.sym(why);
        r.removed_apis_unknown.push(b, [id]);
    }
    if let Some(d) = &w.cilium_daemon_set {
        let row =
            [b.num(d.desired), b.num(d.updated), b.num(d.ready), b.num(d.generation), b.num(d.observed_generation)];
        r.cilium_ds.push(b, row);
    }
    if let Some(d) = &w.kube_proxy_daemon_set {
        let row = [b.num(d.desired), b.num(d.updated), b.num(d.ready), b.sym(d.image.as_deref().unwrap_or(""))];
        r.kube_proxy_ds.push(b, row);
    }
    for cm in &w.kube_proxy_config_maps {
        let id = b.sym(cm);
        r.kube_proxy_configmap.push(b, [id]);
    }
    if w.kubernetes_service_answers {
        r.service_answers.push(b, []);
    }
    if !w.kubernetes_service_probe.is_empty() {
        let target = b.sym(&w.kubernetes_service_probe);
        r.service_probe.push(b, [target]);
    }
    for api in &w.removed_apis_in_use {
        let row = [b.sym(&api.api), b.sym(&api.removed_in)];
        r.removed_api_in_use.push(b, row);
    }
}
