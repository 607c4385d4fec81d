//! `ichor controller`'s loop (feature `io`): a kube-runtime `Controller` over TalosOperations
//! that reconciles only while this replica holds the Lease (kube-lease-manager), so two
//! replicas never both act; `/healthz`, `/readyz` and Prometheus `/metrics` (axum); a
//! Kubernetes Event on the operation for every action and pause; snapshots dumped for replay.
//!
//! Start at `run`. Each reconcile is `controller::Controller::reconcile`; this file decides
//! nothing about operations, only when to reconcile and what to report.

use crate::controller::{Controller, ControllerError};
use crate::plan::Action as PlanAction;
use futures::StreamExt;
use kube_client::api::Api;
use kube_runtime::controller::Action;
use kube_runtime::events::{Event, EventType, Recorder, Reporter};
use kube_runtime::{WatchStreamExt, watcher};
use render::api::TalosOperation;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How the loop runs.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The namespace of the custom resources (and the Lease).
    pub namespace: String,
    pub lease_name: String,
    /// This replica's identity in the Lease (its pod name).
    pub identity: String,
    /// Where `/healthz`, `/readyz` and `/metrics` are served (`None`: not served).
    pub listen: Option<SocketAddr>,
    /// Requeue of an operation still running (its waits are re-derived each time).
    pub requeue: Duration,
    /// Write each reconcile's snapshot here (`<operation>-<n>.yaml`), for `ichor plan --state`.
    pub dump_snapshots: Option<PathBuf>,
}

pub use crate::metrics::Metrics;

struct Ctx {
    controller: Arc<Controller>,
    config: RunConfig,
    leader: tokio::sync::watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    recorder: Recorder,
    count: std::sync::atomic::AtomicU64,
    backoff: Backoff,
}

/// How long a failed reconcile waits before it is tried again, per object: 500 ms after the
/// first failure, doubling to at most 15 s, and back to the start after a success (a transient
/// 500 or 429 costs half a second, not 15 s; a lasting fault is not retried in a tight loop).
/// The same per-item exponential backoff client-go's work queues use.
#[derive(Default)]
pub struct Backoff {
    failures: std::sync::Mutex<std::collections::HashMap<String, u32>>,
}

/// The first retry after a failure.
pub const RETRY_FIRST: Duration = Duration::from_millis(500);
/// The longest wait between retries.
pub const RETRY_MAX: Duration = Duration::from_secs(15);

impl Backoff {
    /// Records a failure of `key` and returns how long to wait before the next try.
    pub fn failed(&self, key: &str) -> Duration {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let n = f.entry(key.to_string()).or_insert(0);
        *n = n.saturating_add(1);
        let wait = RETRY_FIRST.saturating_mul(1u32 << (*n - 1).min(10));
        wait.min(RETRY_MAX)
    }

    /// Forgets `key`'s failures.
    pub fn succeeded(&self, key: &str) {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        f.remove(key);
    }
}

/// Why a reconcile of the loop failed.
#[derive(Debug, thiserror::Error)]
#[error("reconciling {operation}")]
pub struct ReconcileError {
    operation: String,
    #[source]
    source: ControllerError,
}

fn now() -> String {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    crate::plan::rfc3339(t)
}

/// Runs a reconcile; after a success, forgets the object's failures (the backoff starts over).
async fn forgetting_failures(
    ctx: &Ctx,
    key: String,
    reconcile: impl std::future::Future<Output = Result<Action, ReconcileError>>,
) -> Result<Action, ReconcileError> {
    let r = reconcile.await;
    if r.is_ok() {
        ctx.backoff.succeeded(&key);
    }
    r
}

/// `reconcile_once`, with the object's failures forgotten after a success (the backoff).
async fn reconcile(op: Arc<TalosOperation>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let k = key("TalosOperation", &op.metadata);
    forgetting_failures(&ctx.clone(), k, reconcile_once(op, ctx)).await
}

async fn reconcile_once(op: Arc<TalosOperation>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    if !*ctx.leader.borrow() {
        // A standby replica never acts; it looks again when it may hold the Lease.
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let name = op.metadata.name.clone().unwrap_or_default();
    // Quiet when there is nothing to do (issue 23): an ended operation with nothing left to
    // tidy (no clock, no wait in its status) is neither read, planned, written nor requeued,
    // whatever else changes in the cluster (a Node's heartbeat wakes every operation).
    if let Some(st) = &op.status
        && st.phase().is_terminal()
        && st.waiting_since.is_empty()
        && st.waits.is_empty()
    {
        return Ok(Action::await_change());
    }
    let started = std::time::Instant::now();
    ctx.metrics.reconciles.inc();
    let span = tracing::info_span!("reconcile", namespace = %ctx.config.namespace, operation = %name);
    let r =
        tracing::Instrument::instrument(ctx.controller.reconcile(&ctx.config.namespace, &name, &now()), span.clone())
            .await;
    let _entered = span.enter();
    match &r {
        Ok(r) => {
            ctx.metrics.decide_seconds.observe(r.decided_in.as_secs_f64());
            tracing::info!(phase = %r.status.operation.phase, actions = r.plan.actions.len(), "reconciled");
            // An action refused (its precondition no longer held) or interrupted records
            // nothing: said, with the action, so a plan that keeps meeting it can be seen.
            for (a, p) in &r.outcome.actions {
                if let crate::exec::Performed::Refused { why } | crate::exec::Performed::Interrupted { why } = p {
                    tracing::warn!(action = %a, why = %why, "an action did not happen; the next reconcile plans again");
                }
            }
        }
        Err(e) => tracing::warn!(error = %crate::error_chain(e), "reconcile failed"),
    }
    drop(_entered);
    ctx.metrics.plan_seconds.observe(started.elapsed().as_secs_f64());
    let r = match r {
        Ok(r) => r,
        Err(source) => {
            ctx.metrics.errors.inc();
            let note = crate::error_chain(&source);
            publish(&ctx, &op, EventType::Warning, "ReconcileFailed", "Reconcile", note).await;
            return Err(ReconcileError { operation: name, source });
        }
    };
    dump(&ctx, &name, || &r.snapshot);
    // Events come from what the executor did, never from the plan (issue 50, finding 4: an apply
    // and a reboot were recorded on a machine whose drain had failed): an action the run never
    // reached records nothing; one that failed, was refused or interrupted says so below.
    for (a, p) in &r.outcome.actions {
        ctx.metrics.action(a.kind(), performed_name(p));
        if !matches!(p, crate::exec::Performed::Done | crate::exec::Performed::Recorded) {
            continue;
        }
        let (ty, reason) = match a {
            PlanAction::Pause { .. } | PlanAction::Fail { .. } => {
                (EventType::Warning, render::api::Phase::Paused.name())
            }
            PlanAction::Wait { .. } | PlanAction::ClearClock { .. } => continue,
            _ => (EventType::Normal, ""),
        };
        // A reason per action kind (`Start`, `Drain`, `ApplyNoReboot` ...), and the action
        // itself (its object, machine, stage and paths) as the Event's action: the recorder
        // groups repeats by both, so it never merges different actions into one series.
        let kind_reason = capitalized(a.kind());
        let reason = if reason.is_empty() { kind_reason.as_str() } else { reason };
        // A step's record names the stage it closes: four stages of one machine are four
        // Events, not one series (`Done (x4)`).
        let stage = match a {
            PlanAction::Done { machine } => {
                op.status.as_ref().and_then(|s| s.machines.get(machine)).and_then(|p| p.stage.clone())
            }
            _ => None,
        };
        let action = match stage {
            Some(stage) => event_text(format!("{a} (stage {stage})")),
            None => event_action(a),
        };
        use kube_client::Resource;
        let op_ref = op.object_ref(&());
        // A step's action is an Event on the operation related to its machine, and one on the
        // machine related to the operation.
        let machine_ref = match a.machine() {
            Some(machine) => {
                let machines: Api<render::api::TalosMachine> =
                    Api::namespaced(ctx.controller.kube.clone(), &ctx.config.namespace);
                machines.get_opt(machine).await.ok().flatten().map(|m| m.object_ref(&()))
            }
            None => None,
        };
        publish_on(&ctx, &op_ref, machine_ref.clone(), ty, reason, &action, a.to_string()).await;
        if let Some(m) = &machine_ref {
            publish_on(&ctx, m, Some(op_ref.clone()), ty, reason, &action, format!("{name}: {a}")).await;
        }
    }
    // A step that failed names the action that failed (a drain, an apply ...), not a fixed
    // word: it read "Apply" for a drain refused by a budget.
    for (a, p) in &r.outcome.actions {
        match p {
            crate::exec::Performed::Failed { machine, message } => {
                publish(&ctx, &op, EventType::Warning, "StepFailed", &event_action(a), format!("{machine}: {message}"))
                    .await
            }
            crate::exec::Performed::Refused { why } => {
                publish(&ctx, &op, EventType::Warning, "PreconditionFailed", a.kind(), why.clone()).await
            }
            crate::exec::Performed::Forbidden { message } => {
                publish(&ctx, &op, EventType::Warning, "Forbidden", &event_action(a), message.clone()).await
            }
            _ => {}
        }
    }
    let phase = r.status.operation.phase;
    Ok(match requeue_after(phase, ctx.config.requeue) {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

/// When an operation in `phase` is reconciled again without a change: an ended or paused one
/// never (the user's intent is an annotation, a change of the object, which wakes it); a running
/// or waiting one after `running`, to look at its waits again.
pub fn requeue_after(phase: render::api::Phase, running: Duration) -> Option<Duration> {
    (!phase.is_terminal() && phase != render::api::Phase::Paused).then_some(running)
}

async fn publish(ctx: &Ctx, op: &TalosOperation, type_: EventType, reason: &str, action: &str, note: String) {
    use kube_client::Resource;
    publish_on(ctx, &op.object_ref(&()), None, type_, reason, action, note).await;
}

/// What became of an action, as the actions counter's `outcome` label.
fn performed_name(p: &crate::exec::Performed) -> &'static str {
    use crate::exec::Performed;
    match p {
        Performed::Done => "done",
        Performed::Recorded => "recorded",
        Performed::Failed { .. } => "failed",
        Performed::Forbidden { .. } => "forbidden",
        Performed::Refused { .. } => "refused",
        Performed::Interrupted { .. } => "interrupted",
    }
}

/// An Event's `action`: the action as it reads (`apply the rendered config to cp1 ...,
/// changing KubeAPIServerConfig.image`), cut to the API's 128 characters at a character
/// boundary. Two actions that differ in object, machine, stage or paths differ here.
pub fn event_action(a: &PlanAction) -> String {
    event_text(a.to_string())
}

/// A text cut to an Event action's 128 characters.
fn event_text(text: String) -> String {
    if text.len() <= 128 {
        return text;
    }
    let mut end = 125;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// `applyNoReboot` -> `ApplyNoReboot`: an action kind as an Event reason.
fn capitalized(kind: &str) -> String {
    let mut c = kind.chars();
    c.next().map(|f| f.to_uppercase().chain(c).collect()).unwrap_or_default()
}

/// Publishes an Event regarding `reference` (an operation, a machine).
async fn publish_on(
    ctx: &Ctx,
    reference: &k8s_openapi::api::core::v1::ObjectReference,
    related: Option<k8s_openapi::api::core::v1::ObjectReference>,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let ev = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note.chars().take(1000).collect()),
        action: action.to_string(),
        secondary: related,
    };
    if let Err(e) = ctx.recorder.publish(&ev, reference).await {
        tracing::warn!(error = %crate::error_chain(&e), "publishing an event");
    }
}

/// How often the machine controller looks at a converged machine with nothing changing.
pub const MACHINE_RESYNC_CONVERGED: Duration = Duration::from_secs(120);
/// How often it looks at one that is not converged.
pub const MACHINE_RESYNC: Duration = Duration::from_secs(30);

/// `reconcile_machine_once`, with the object's failures forgotten after a success (the backoff).
async fn reconcile_machine(m: Arc<render::api::TalosMachine>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let k = key("TalosMachine", &m.metadata);
    forgetting_failures(&ctx.clone(), k, reconcile_machine_once(m, ctx)).await
}

/// The Machine controller: a TalosMachine's Ready condition and hashes.
async fn reconcile_machine_once(m: Arc<render::api::TalosMachine>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    if !*ctx.leader.borrow() {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let name = m.metadata.name.clone().unwrap_or_default();
    match ctx.controller.reconcile_machine(&ctx.config.namespace, &name, &now()).await {
        Ok(crate::reconcile::machine::MachineReconciled { condition, applied, left_to, state }) => {
            dump(&ctx, &format!("machine-{name}"), || state.snapshot(&ctx.controller.classifier));
            // A change of the machine's Ready condition is an Event on the machine (what
            // `kubectl describe talosmachine` shows): its reason and message are the rules'.
            let before = m.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
            if before.is_none_or(|b| b.status != condition.status || b.reason != condition.reason) {
                use kube_client::Resource;
                let ty = if condition.status == "True" { EventType::Normal } else { EventType::Warning };
                publish_on(
                    &ctx,
                    &m.object_ref(&()),
                    None,
                    ty,
                    &condition.reason,
                    "Reconcile",
                    condition.message.clone(),
                )
                .await;
            }
            // After a live apply, soon again: the node shows whether it runs the change.
            if !applied.is_empty() {
                use kube_client::Resource;
                let note = format!("applied live (no reboot): {}", applied.join(", "));
                publish_on(&ctx, &m.object_ref(&()), None, EventType::Normal, "AppliedLive", "Apply", note).await;
                return Ok(Action::requeue(Duration::from_secs(2)));
            }
            // A converged machine is looked at again every two minutes (drift behind Ichor's
            // back shows then); one that is not, every 30 s, unless an operation has it (the
            // operation reconciles it; its end wakes the machine). A change it watches wakes it
            // at once.
            let look =
                if condition.status == "True" || left_to.is_some() { MACHINE_RESYNC_CONVERGED } else { MACHINE_RESYNC };
            Ok(Action::requeue(look))
        }
        Err(source) => {
            ctx.metrics.errors.inc();
            Err(ReconcileError { operation: format!("TalosMachine {name}"), source })
        }
    }
}

/// `reconcile_handover_once`, with the object's failures forgotten after a success (the backoff).
async fn reconcile_handover(c: Arc<render::api::TalosCluster>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    let k = key("TalosCluster", &c.metadata);
    forgetting_failures(&ctx.clone(), k, reconcile_handover_once(c, ctx)).await
}

/// The CNI hand-over controller (ADR 0024): a TalosCluster's CNIHandover condition from Argo
/// CD's Application; it comes back while the hand-over waits.
async fn reconcile_handover_once(c: Arc<render::api::TalosCluster>, ctx: Arc<Ctx>) -> Result<Action, ReconcileError> {
    if !*ctx.leader.borrow() {
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let name = c.metadata.name.clone().unwrap_or_default();
    let ns = c.metadata.namespace.clone().unwrap_or_default();
    // The operations read fresh, not from the watch's cache: the values wait for any operation
    // of the cluster that has not ended, and a cache that lags behind a just-created one would
    // let a values Job start beside the operation's own.
    let read = async { Ok((ctx.controller.operations_fresh(&ns).await?, ctx.controller.lockdown_of(&ns).await?)) };
    let (operations, lockdown) = match read.await {
        Ok(x) => x,
        Err(source) => {
            ctx.metrics.errors.inc();
            return Err(ReconcileError { operation: format!("the hand-over of TalosCluster {name}"), source });
        }
    };
    let mut kube = ctx.controller.kube_port(&ns, None);
    match crate::reconcile::cluster::reconcile(&mut kube, &operations, lockdown.as_ref(), &c, &now()).await {
        Ok(r) => {
            dump(&ctx, &format!("cluster-{name}"), || &r.state);
            Ok(r.requeue.map_or_else(Action::await_change, Action::requeue))
        }
        Err(source) => {
            ctx.metrics.errors.inc();
            Err(ReconcileError { operation: format!("the hand-over of TalosCluster {name}"), source: source.into() })
        }
    }
}

/// Writes a loop's state to `--dump-snapshots` (`<name>-<n>.yaml`, for `ichor plan --state`),
/// when asked to; made only then.
fn dump<S: serde::Serialize>(ctx: &Ctx, name: &str, state: impl FnOnce() -> S) {
    let Some(dir) = &ctx.config.dump_snapshots else { return };
    let n = ctx.count.fetch_add(1, Ordering::Relaxed);
    if let Ok(text) = serde_yaml::to_string(&state()) {
        let _ = std::fs::create_dir_all(dir);
        let _ = std::fs::write(dir.join(format!("{name}-{n:06}.yaml")), text);
    }
}

/// The backoff's key of an object.
fn key(kind: &str, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!("{kind}/{}", meta.name.as_deref().unwrap_or_default())
}

/// What a watch maps a change of `cluster` to: the objects of `store` that belong to it.
fn of_cluster_in<K>(
    store: kube_runtime::reflector::Store<K>,
    cluster_of: fn(&K) -> &String,
) -> impl Fn(String) -> Vec<kube_runtime::reflector::ObjectRef<K>>
where
    K: kube_client::Resource<DynamicType = ()> + Clone + 'static,
{
    move |cluster: String| {
        store
            .state()
            .iter()
            .filter(|o| *cluster_of(o) == cluster)
            .map(|o| kube_runtime::reflector::ObjectRef::from_obj(o.as_ref()))
            .collect()
    }
}

/// Every loop's error policy: the object's backoff grows (`Backoff::failed`), and the error is
/// logged with the object's kind and name, its whole chain once.
fn error_policy<K>(o: Arc<K>, e: &ReconcileError, ctx: Arc<Ctx>) -> Action
where
    K: kube_client::Resource<DynamicType = ()>,
{
    let kind = K::kind(&());
    let wait = ctx.backoff.failed(&key(&kind, o.meta()));
    tracing::warn!(kind = %kind, name = %o.meta().name.as_deref().unwrap_or_default(), error = %crate::error_chain(e), retry_in = ?wait, "reconcile failed");
    Action::requeue(wait)
}

/// Logs each change of who acts: this replica holding the Lease, or waiting for it (and who
/// holds it), so a replica that does nothing says why; the `ichor_leader` gauge follows it.
/// The task holds a receiver of the Lease's channel: it is aborted on shutdown, as the Lease is
/// released only once every receiver is gone (issue 50: it held one forever, so a SIGTERM left
/// the Lease renewed and no standby took over).
///
/// Holding it, the replica writes its node on the Lease (`LEASE_NODE_ANNOTATION`; removed when
/// it does not know it): a preview run from anywhere states the true order of an operation,
/// the controller's own node last (issue 50).
fn log_lease_changes(
    mut leader: tokio::sync::watch::Receiver<bool>,
    client: kube_client::Client,
    config: &RunConfig,
    node: Option<String>,
    release_set: String,
    metrics: Arc<Metrics>,
) -> tokio::task::JoinHandle<()> {
    let (ns, name, me) = (config.namespace.clone(), config.lease_name.clone(), config.identity.clone());
    tokio::spawn(async move {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client, &ns);
        let mut was = None;
        loop {
            let now = *leader.borrow_and_update();
            metrics.set_leader(now);
            if was != Some(now) {
                if now {
                    tracing::info!(lease = %format!("{ns}/{name}"), identity = %me, "holding the Lease: this replica acts");
                    let patch = serde_json::json!({"metadata": {"annotations": {
                        crate::kube::LEASE_NODE_ANNOTATION: node,
                        crate::kube::RELEASE_SET_ANNOTATION: release_set,
                    }}});
                    if let Err(e) =
                        leases.patch(&name, &Default::default(), &kube_client::api::Patch::Merge(patch)).await
                    {
                        tracing::warn!(lease = %format!("{ns}/{name}"), error = %crate::error_chain(&e), "writing this replica's node on the Lease failed: a preview states the order without it");
                    }
                } else {
                    let holder = leases
                        .get_opt(&name)
                        .await
                        .ok()
                        .flatten()
                        .and_then(|l| l.spec.and_then(|s| s.holder_identity))
                        .filter(|h| !h.is_empty() && *h != me)
                        .unwrap_or_else(|| "nobody yet".into());
                    tracing::info!(lease = %format!("{ns}/{name}"), identity = %me, holder = %holder, "waiting for the Lease: this replica acts only once it holds it");
                }
                was = Some(now);
            }
            if leader.changed().await.is_err() {
                break;
            }
        }
    })
}

/// The Lease the replicas elect their leader with, unless `ichor controller --lease-name` says
/// another.
pub const LEASE_NAME: &str = "ichor-controller";

/// Drives the Lease by hand (kube-lease-manager's `changed`, as its own `watch` does), while a
/// standby also looks at the Lease every quarter second: a standby otherwise sleeps until the lock it
/// last read expires (up to 15 s), so a holder that released it on SIGTERM left the cluster
/// leaderless for up to 10 s (issue 50 asks for a hand-over within 5 s). Once the Lease is
/// free the standby's sleep is cut short, a fresh manager (which has read no lock yet) replaces
/// its own, and it takes the Lease. The Lease is released once every
/// receiver of the channel is gone.
fn drive_lease(
    mut lease: kube_lease_manager::LeaseManager,
    builder: impl Fn() -> kube_lease_manager::LeaseManagerBuilder + Send + 'static,
    client: kube_client::Client,
    namespace: &str,
    name: &str,
) -> (tokio::sync::watch::Receiver<bool>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = tokio::sync::watch::channel(false);
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client, namespace);
    let name = name.to_string();
    let task = tokio::spawn(async move {
        loop {
            let holding = *tx.borrow();
            tokio::select! {
                _ = tx.closed() => break,
                changed = lease.changed() => match changed {
                    Ok(state) => {
                        tx.send_replace(state);
                    }
                    Err(e) => {
                        tracing::warn!(lease = %name, error = %crate::error_chain(&e), "the Lease could not be read or written; trying again");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                },
                _ = lease_freed(&leases, &name), if !holding => {
                    // A manager keeps the lock it last read until that lock expires (its
                    // `changed` sleeps until then): a fresh one reads the free Lease and takes it.
                    match builder().build().await {
                        Ok(fresh) => lease = fresh,
                        Err(e) => tracing::warn!(lease = %name, error = %crate::error_chain(&e), "reading the freed Lease"),
                    }
                }
            }
        }
        if *tx.borrow()
            && let Err(e) = lease.release().await
        {
            tracing::warn!(lease = %name, error = %crate::error_chain(&e), "releasing the Lease");
        }
    });
    (rx, task)
}

/// Resolves once nobody holds the Lease (its holder released it), read every quarter second
/// (one small GET by the standby alone).
async fn lease_freed(leases: &Api<k8s_openapi::api::coordination::v1::Lease>, name: &str) {
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if let Ok(Some(l)) = leases.get_opt(name).await
            && l.spec.and_then(|s| s.holder_identity).is_none_or(|h| h.is_empty())
        {
            return;
        }
    }
}

/// How long the reconciles in flight at a SIGTERM may take to end before the process stops
/// them: a step is idempotent and resumes from status, so cutting one is safe; waiting longer
/// would keep the Lease from a standby. 20 s fits in `ichor install`'s grace period (30 s) with
/// the Lease's release after it.
pub const SHUTDOWN_RECONCILE_GRACE: std::time::Duration = std::time::Duration::from_secs(20);
/// How long the Lease's release may take: an API that no longer answers must not keep the
/// process alive (a standby then takes the Lease when it expires, 15 s).
pub const SHUTDOWN_LEASE_RELEASE: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs until `shutdown` resolves; releases the Lease on the way out.
/// Serves /healthz, /readyz (`ready`) and /metrics on `addr` (the release-behind gauge read at
/// each scrape); nothing when the address cannot be bound.
async fn serve_metrics(
    addr: std::net::SocketAddr,
    controller: Arc<Controller>,
    metrics: Arc<Metrics>,
    namespace: &str,
    ready: Arc<AtomicBool>,
) {
    let m = metrics.clone();
    m.set_release_set(&controller.release_set_kubernetes, &controller.release_set_talos);
    let metrics_controller = controller.clone();
    // (No receiver of the Lease's channel here: the Lease is released only once every
    // receiver is gone, and the metrics server outlives the shutdown. `log_lease_changes`
    // sets the leader gauge.)
    let metrics_ns = namespace.to_string();
    let app = axum::Router::new()
        .route("/healthz", axum::routing::get(|| async { "ok" }))
        .route(
            "/readyz",
            axum::routing::get(move || async move {
                if ready.load(Ordering::Relaxed) {
                    (axum::http::StatusCode::OK, "ready")
                } else {
                    (axum::http::StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }),
        )
        .route(
            "/metrics",
            axum::routing::get(move || {
                let (m, c) = (m.clone(), metrics_controller.clone());
                let ns = metrics_ns.clone();
                async move {
                    // The clusters behind the release set, read now (kept from the last
                    // scrape when the read fails or takes longer than 5 s).
                    let api: Api<render::api::TalosCluster> = Api::namespaced(c.kube.clone(), &ns);
                    let read = tokio::time::timeout(Duration::from_secs(5), api.list(&Default::default())).await;
                    if let Ok(Ok(list)) = read {
                        let behind = crate::metrics::release_behind(
                            &list.items,
                            &c.release_set_talos,
                            &c.release_set_kubernetes,
                        );
                        m.set_release_behind(&behind);
                    }
                    m.encode_with(c.stores.get())
                }
            }),
        );
    if let Ok(listener) = tokio::net::TcpListener::bind(addr).await {
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
    }
}

/// The cluster loop (the hand-over, the Cilium values, the lockdown) until `shutdown`.
fn cluster_loop(
    ctx: Arc<Ctx>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> impl std::future::Future<Output = ()> {
    let ns = ctx.config.namespace.clone();
    // The cluster host (the hand-over and the Cilium values) is woken by its cluster, by an
    // operation of the cluster that ends (it releases the lock the values wait on), and by Ichor's
    // Cilium Jobs (one that ends, or a failed one deleted to run it again).
    let controller_clusters = kube_runtime::Controller::new(
        Api::<render::api::TalosCluster>::namespaced(ctx.controller.kube.clone(), &ns),
        watcher::Config::default(),
    );
    let cstore = controller_clusters.store();
    let every_cluster = move || {
        cstore.state().iter().map(|c| kube_runtime::reflector::ObjectRef::from_obj(c.as_ref())).collect::<Vec<_>>()
    };
    let k = ctx.controller.kube.clone();
    let ns_of_ops = ns.clone();
    controller_clusters
        .watches(Api::<TalosOperation>::namespaced(k.clone(), &ns), watcher::Config::default(), move |o| {
            let ended = o.status.as_ref().is_some_and(|s| s.phase().is_terminal());
            ended.then(|| kube_runtime::reflector::ObjectRef::new(&o.spec.cluster_ref.name).within(&ns_of_ops))
        })
        .watches(
            Api::<k8s_openapi::api::batch::v1::Job>::namespaced(k, crate::kube::JOB_NAMESPACE),
            watcher::Config::default().labels("app.kubernetes.io/managed-by=ichor"),
            move |_| every_cluster(),
        )
        .graceful_shutdown_on(shutdown)
        .run(reconcile_handover, error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %crate::error_chain(&e), "hand-over reconcile");
            }
        })
}

/// The machine loop, woken by what a machine's render reads and by its cluster's operations
/// ending, until `shutdown`.
fn machine_loop(
    ctx: Arc<Ctx>,
    stores: &crate::stores::Stores,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> impl std::future::Future<Output = ()> {
    use crate::stores::Changed;
    let ns = ctx.config.namespace.clone();
    let machines: Api<render::api::TalosMachine> = Api::namespaced(ctx.controller.kube.clone(), &ns);
    // A machine is woken by what its render reads and by its cluster's operations ending (an
    // ended one hands the machine back; a running one's status writes wake nothing): its
    // cluster, the cluster's patches and operations, and the namespace's Secrets (watched by
    // their metadata alone: a Secret's data never enters a cache; a change wakes every machine
    // of the namespace, as secrets change rarely).
    let secrets = watcher::watcher(
        Api::<kube_client::core::PartialObjectMeta<k8s_openapi::api::core::v1::Secret>>::namespaced(
            ctx.controller.kube.clone(),
            &ctx.config.namespace,
        ),
        watcher::Config::default(),
    )
    .touched_objects()
    .filter_map(|r| async move { r.ok().map(|_| ()) });
    let controller_machines = kube_runtime::Controller::new(machines, watcher::Config::default());
    let mstore = controller_machines.store();
    let machines_of = |store| of_cluster_in(store, |m: &render::api::TalosMachine| &m.spec.cluster_ref.name);
    let (m1, m2, m3) = (machines_of(mstore.clone()), machines_of(mstore.clone()), machines_of(mstore));
    let k = ctx.controller.kube.clone();
    controller_machines
        .watches(Api::<render::api::TalosCluster>::namespaced(k.clone(), &ns), watcher::Config::default(), move |c| {
            m1(c.metadata.name.unwrap_or_default())
        })
        .watches(
            Api::<render::api::TalosConfigPatch>::namespaced(k.clone(), &ns),
            watcher::Config::default(),
            move |p| m2(p.spec.cluster_ref.name),
        )
        .watches(Api::<TalosOperation>::namespaced(k, &ns), watcher::Config::default(), move |o| {
            let ended = o.status.as_ref().is_some_and(|s| s.phase().is_terminal());
            if ended { m3(o.spec.cluster_ref.name) } else { vec![] }
        })
        .reconcile_all_on(futures::stream::select(
            secrets,
            stores.changes(|c| matches!(c, Changed::Patch | Changed::OperationEnded)),
        ))
        .graceful_shutdown_on(shutdown)
        .run(reconcile_machine, error_policy, ctx)
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %crate::error_chain(&e), "machine reconcile");
            }
        })
}

pub async fn run(
    controller: Arc<Controller>,
    config: RunConfig,
    metrics: Arc<Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Result<(), kube_lease_manager::LeaseManagerError> {
    let client = controller.kube.clone();
    let builder = {
        let (client, config) = (client.clone(), config.clone());
        move || {
            kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &config.lease_name)
                .with_namespace(&config.namespace)
                .with_identity(&config.identity)
                .with_duration(15)
                .with_grace(5)
        }
    };
    let lease = builder().build().await?;
    let (leader, lease_task) = drive_lease(lease, builder, client.clone(), &config.namespace, &config.lease_name);
    let lease_log = log_lease_changes(
        leader.clone(),
        client.clone(),
        &config,
        controller.controller_node.clone(),
        controller.release_set_words(),
        metrics.clone(),
    );
    // The lists every reconcile reads come from watches from here on (see `stores`).
    let _ = controller.stores.set(crate::stores::Stores::start(&client, &config.namespace).await);
    let stores = controller.stores.get().expect("set just now");
    use crate::stores::Changed;
    let ready = Arc::new(AtomicBool::new(true));
    if let Some(addr) = config.listen {
        serve_metrics(addr, controller.clone(), metrics.clone(), &config.namespace, ready.clone()).await;
    }
    let reporter = Reporter { controller: "ichor-controller".into(), instance: Some(config.identity.clone()) };
    let ctx = Arc::new(Ctx {
        controller: controller.clone(),
        config: config.clone(),
        leader: leader.clone(),
        metrics,
        recorder: Recorder::new(client.clone(), reporter),
        count: Default::default(),
        backoff: Backoff::default(),
    });
    let ops: Api<TalosOperation> = Api::namespaced(client.clone(), &config.namespace);
    let shutdown = futures::FutureExt::shared(Box::pin(shutdown));
    let shutdown_begun = shutdown.clone();
    // What an operation depends on wakes it: its cluster, machines and patches, and the
    // kube-system DaemonSets and ConfigMaps (cilium, kube-proxy, cilium-config); a change the
    // caches hold (`runtime::stores`) of what it reads of a Node or a mirror pod (a heartbeat
    // wakes nothing).
    let ops_of_stages = ops.clone();
    let controller_ops = kube_runtime::Controller::new(ops, watcher::Config::default());
    let store = controller_ops.store();
    let of_cluster = |store| of_cluster_in(store, |o: &TalosOperation| &o.spec.cluster_ref.name);
    let every = |store: kube_runtime::reflector::Store<TalosOperation>| {
        move || {
            store.state().iter().map(|o| kube_runtime::reflector::ObjectRef::from_obj(o.as_ref())).collect::<Vec<_>>()
        }
    };
    let ns = config.namespace.clone();
    let (c1, c2, c3) = (of_cluster(store.clone()), of_cluster(store.clone()), of_cluster(store.clone()));
    let (e2, e3) = (every(store.clone()), every(store));
    let k = ctx.controller.kube.clone();
    let operations = controller_ops
        // A release's stage operation (owned by it) wakes the release when it moves.
        .owns(ops_of_stages, watcher::Config::default().labels(render::api::RELEASE))
        .watches(Api::<render::api::TalosCluster>::namespaced(k.clone(), &ns), watcher::Config::default(), move |c| {
            c1(c.metadata.name.unwrap_or_default())
        })
        .watches(Api::<render::api::TalosMachine>::namespaced(k.clone(), &ns), watcher::Config::default(), move |m| {
            c2(m.spec.cluster_ref.name)
        })
        .watches(
            Api::<render::api::TalosConfigPatch>::namespaced(k.clone(), &ns),
            watcher::Config::default(),
            move |p| c3(p.spec.cluster_ref.name),
        )
        .watches(
            Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(k.clone(), "kube-system"),
            watcher::Config::default(),
            move |_| e2(),
        )
        .watches(
            Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(k, "kube-system"),
            watcher::Config::default().fields("metadata.name=cilium-config"),
            move |_| e3(),
        )
        .reconcile_all_on(stores.changes(|c| !matches!(c, Changed::Operation | Changed::OperationEnded)))
        .graceful_shutdown_on(shutdown.clone())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %crate::error_chain(&e), "reconcile");
            }
        });
    let handovers = cluster_loop(ctx.clone(), shutdown.clone());
    let machine_conditions = machine_loop(ctx, stores, shutdown);
    // On a SIGTERM the loops take no new work and let the reconciles in flight end, within
    // their grace; past it they are dropped (cut), before the Lease is released, so no step of
    // this replica runs beside a standby's.
    let loops = async {
        futures::join!(operations, machine_conditions, handovers);
    };
    tokio::select! {
        () = loops => {}
        () = async {
            shutdown_begun.await;
            tokio::time::sleep(SHUTDOWN_RECONCILE_GRACE).await;
        } => {
            tracing::warn!(grace = ?SHUTDOWN_RECONCILE_GRACE, "reconciles still running past the shutdown grace: stopped (their steps resume from status)");
        }
    }
    ready.store(false, Ordering::Relaxed);
    // Dropping every receiver makes the lease task release the Lease.
    lease_log.abort();
    let _ = lease_log.await;
    drop(leader);
    match tokio::time::timeout(SHUTDOWN_LEASE_RELEASE, lease_task).await {
        Ok(_) => {
            tracing::info!(lease = %format!("{}/{}", config.namespace, config.lease_name), "Lease released: a standby takes over at once")
        }
        Err(_) => tracing::warn!(
            lease = %format!("{}/{}", config.namespace, config.lease_name),
            within = ?SHUTDOWN_LEASE_RELEASE,
            "the Lease was not released in time (the API does not answer): a standby takes it when it expires"
        ),
    }
    Ok(())
}

#[cfg(test)]
mod backoff_tests {
    use super::*;

    #[test]
    fn a_failure_is_retried_soon_then_less_often_and_a_success_starts_over() {
        let b = Backoff::default();
        let waits: Vec<u64> = (0..8).map(|_| b.failed("TalosOperation/a").as_millis() as u64).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 15000, 15000, 15000]);
        assert_eq!(b.failed("TalosMachine/cp1"), RETRY_FIRST, "each object has its own count");
        b.succeeded("TalosOperation/a");
        assert_eq!(b.failed("TalosOperation/a"), RETRY_FIRST);
    }
}
