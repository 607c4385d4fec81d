//! The controller's reads of lists, from watches (feature `io`): kube-runtime reflector caches
//! of the namespace's TalosMachines, TalosConfigPatches and TalosOperations, the Nodes and
//! kube-system's pods. A reconcile reads these instead of listing them, so its cost grows with
//! what changed, not with the fleet; single objects a decision rests on (the operation, its
//! cluster, the secret) are still read by GET.
//!
//! Start at `Stores::start`. A cache can lag a write by a watch event; each reconcile
//! re-derives everything, and a changed object wakes the reconciles again.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube_client::api::Api;
use kube_runtime::reflector::{self, Store};
use kube_runtime::{WatchStreamExt, watcher};
use render::api::{TalosConfigPatch, TalosMachine, TalosOperation};
use std::sync::Arc;

/// What changed in a cache (sent once the cache holds the change, so a reconcile it wakes
/// reads it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    Machine,
    Patch,
    /// An operation that has not ended.
    Operation,
    /// An operation that has ended (it hands its machines back).
    OperationEnded,
    Node,
    Pod,
}

/// The caches, each kept by its own watch task (aborted when the stores are dropped).
pub struct Stores {
    pub machines: Store<TalosMachine>,
    pub patches: Store<TalosConfigPatch>,
    pub operations: Store<TalosOperation>,
    pub nodes: Store<Node>,
    pub kube_system_pods: Store<Pod>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    changed: tokio::sync::broadcast::Sender<Changed>,
    /// Moves on every change the machines' and patches' caches hear (after the cache has it).
    epoch: Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores").field("machines", &self.machines.state().len()).finish_non_exhaustive()
    }
}

impl Drop for Stores {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn keep<K>(
    api: Api<K>,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
    changed: &tokio::sync::broadcast::Sender<Changed>,
    what: fn(&K) -> Changed,
    digest: Option<fn(&K) -> u64>,
    epoch: Option<Arc<std::sync::atomic::AtomicU64>>,
) -> Store<K>
where
    K: kube_client::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    use futures::StreamExt;
    let (reader, writer) = reflector::store();
    // Errors (a dropped watch, a refused list) are retried with kube-runtime's backoff; the
    // cache keeps its last state meanwhile.
    let stream = reflector::reflector(writer, watcher::watcher(api, watcher::Config::default()).default_backoff());
    let changed = changed.clone();
    // With a digest, what the decisions read of each object as last heard: a change that leaves
    // it the same (a Node's heartbeat, a pod's status time) wakes nothing.
    let mut heard: std::collections::HashMap<(Option<String>, Option<String>), u64> = Default::default();
    tasks.push(tokio::spawn(stream.for_each(move |e| {
        if let Ok(e) = e {
            use kube_runtime::watcher::Event;
            if let Some(epoch) = &epoch {
                epoch.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            let key = |o: &K| (o.meta().namespace.clone(), o.meta().name.clone());
            match e {
                Event::Apply(o) | Event::InitApply(o) => {
                    let new = digest.map(|d| d(&o));
                    let same = new.is_some() && heard.get(&key(&o)) == new.as_ref();
                    if let Some(n) = new {
                        heard.insert(key(&o), n);
                    }
                    if !same {
                        let _ = changed.send(what(&o));
                    }
                }
                Event::Delete(o) => {
                    heard.remove(&key(&o));
                    let _ = changed.send(what(&o));
                }
                Event::Init | Event::InitDone => {}
            }
        }
        async {}
    })));
    reader
}

fn hash_of(x: impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    x.hash(&mut h);
    h.finish()
}

/// A Node's digest: what the decisions read of it (`assemble::node_read`). A heartbeat
/// changes none of it.
pub fn node_digest(n: &Node) -> u64 {
    hash_of(crate::assemble::node_read(n))
}

/// A kube-system pod's digest: what the decisions read of it (`assemble::mirror_pod`); every
/// pod that is not a static component's mirror has the same.
pub fn pod_digest(p: &Pod) -> u64 {
    hash_of(crate::assemble::mirror_pod(p))
}

impl Stores {
    /// Starts the watches of `namespace`'s objects and the cluster's Nodes, and waits until
    /// each has listed once.
    pub async fn start(client: &kube_client::Client, namespace: &str) -> Stores {
        let mut tasks = vec![];
        let (changed, _) = tokio::sync::broadcast::channel(4096);
        let epoch: Arc<std::sync::atomic::AtomicU64> = Default::default();
        let e = || Some(epoch.clone());
        let t = &mut tasks;
        let ended = |o: &TalosOperation| {
            if o.status.as_ref().is_some_and(|s| s.phase().is_terminal()) {
                Changed::OperationEnded
            } else {
                Changed::Operation
            }
        };
        let stores = Stores {
            machines: keep(Api::namespaced(client.clone(), namespace), t, &changed, |_| Changed::Machine, None, e()),
            patches: keep(Api::namespaced(client.clone(), namespace), t, &changed, |_| Changed::Patch, None, e()),
            operations: keep(Api::namespaced(client.clone(), namespace), t, &changed, ended, None, None),
            nodes: keep(Api::all(client.clone()), t, &changed, |_| Changed::Node, Some(node_digest), None),
            kube_system_pods: keep(
                Api::namespaced(client.clone(), "kube-system"),
                t,
                &changed,
                |_| Changed::Pod,
                Some(pod_digest),
                None,
            ),
            tasks,
            changed,
            epoch: epoch.clone(),
        };
        let _ = futures::join!(
            stores.machines.wait_until_ready(),
            stores.patches.wait_until_ready(),
            stores.operations.wait_until_ready(),
            stores.nodes.wait_until_ready(),
            stores.kube_system_pods.wait_until_ready(),
        );
        stores
    }
}

impl Stores {
    /// How many changes the machines' and patches' caches have heard: equal twice, nothing of
    /// them changed between.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A stream with one item for each change `wanted` picks, once the cache holds it: what
    /// wakes the reconciles that read these caches (a watch of their own could wake them
    /// before the cache has the change). A lagging receiver yields one item for what it missed.
    pub fn changes(&self, wanted: fn(Changed) -> bool) -> impl futures::Stream<Item = ()> + Send + use<> {
        use futures::StreamExt;
        tokio_stream::wrappers::BroadcastStream::new(self.changed.subscribe()).filter_map(move |c| async move {
            match c {
                Ok(c) if !wanted(c) => None,
                _ => Some(()),
            }
        })
    }
}

/// A store's objects that `keep` keeps, shared, in namespace and name order (the order a LIST
/// gives).
pub fn shared<K>(store: &Store<K>, keep: impl Fn(&K) -> bool) -> Vec<Arc<K>>
where
    K: kube_client::Resource<DynamicType = ()> + Clone + 'static,
{
    let mut v: Vec<Arc<K>> = store.state_filter(|o| keep(o));
    let key = |o: &Arc<K>| (o.meta().namespace.clone(), o.meta().name.clone());
    v.sort_by_cached_key(key);
    v
}

/// `shared`, cloned.
pub fn items<K>(store: &Store<K>, keep: impl Fn(&K) -> bool) -> Vec<K>
where
    K: kube_client::Resource<DynamicType = ()> + Clone + 'static,
{
    shared(store, keep).into_iter().map(|o| (*o).clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(ready: &str, heartbeat: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "w1"},
            "status": {
                "conditions": [{"type": "Ready", "status": ready, "lastHeartbeatTime": heartbeat}],
                "nodeInfo": {"kubeletVersion": "v1.36.4", "bootID": "b1", "machineID": "", "systemUUID": "",
                    "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "", "kubeProxyVersion": "",
                    "operatingSystem": "linux", "architecture": "amd64"}
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_heartbeat_changes_no_digest_and_what_the_decisions_read_does() {
        let a = node("True", "2026-12-06T10:00:00Z");
        assert_eq!(node_digest(&a), node_digest(&node("True", "2026-12-06T10:00:10Z")), "a heartbeat");
        assert_ne!(node_digest(&a), node_digest(&node("False", "2026-12-06T10:00:00Z")), "readiness");
        let mut unschedulable = a.clone();
        unschedulable.spec =
            Some(k8s_openapi::api::core::v1::NodeSpec { unschedulable: Some(true), ..Default::default() });
        assert_eq!(node_digest(&a), node_digest(&unschedulable), "someone else's cordon: not read");
        let mut cordoned = unschedulable.clone();
        cordoned.metadata.annotations = Some([(render::api::CORDONED.to_string(), "true".to_string())].into());
        assert_ne!(node_digest(&a), node_digest(&cordoned), "Ichor's cordon");
        let mut newer = a.clone();
        if let Some(i) = newer.status.as_mut().and_then(|s| s.node_info.as_mut()) {
            i.kubelet_version = "v1.37.0".into();
        }
        assert_ne!(node_digest(&a), node_digest(&newer), "the kubelet's version");
    }

    #[test]
    fn only_a_mirror_pods_node_image_and_readiness_make_its_digest() {
        let pod = |mirror: bool, image: &str, ready: &str, started: &str| -> Pod {
            let ann =
                if mirror { serde_json::json!({"kubernetes.io/config.mirror": "x"}) } else { serde_json::json!({}) };
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "kube-apiserver-cp1", "annotations": ann, "labels": {"k8s-app": "kube-apiserver"}},
                "spec": {"nodeName": "cp1", "containers": [{"name": "c", "image": image}]},
                "status": {"startTime": started, "conditions": [{"type": "Ready", "status": ready}]}
            }))
            .unwrap()
        };
        let a = pod(true, "k8s/apiserver:v1.36.4", "True", "2026-12-06T10:00:00Z");
        assert_eq!(pod_digest(&a), pod_digest(&pod(true, "k8s/apiserver:v1.36.4", "True", "2026-12-06T11:00:00Z")));
        assert_ne!(pod_digest(&a), pod_digest(&pod(true, "k8s/apiserver:v1.37.0", "True", "2026-12-06T10:00:00Z")));
        assert_ne!(pod_digest(&a), pod_digest(&pod(true, "k8s/apiserver:v1.36.4", "False", "2026-12-06T10:00:00Z")));
        let other = pod(false, "k8s/apiserver:v1.36.4", "True", "2026-12-06T10:00:00Z");
        assert_eq!(pod_digest(&other), pod_digest(&pod(false, "x:1", "False", "2026-12-06T10:00:00Z")));
    }
}
