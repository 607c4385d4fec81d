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
    tasks.push(tokio::spawn(stream.for_each(move |e| {
        if let Ok(e) = e {
            use kube_runtime::watcher::Event;
            match e {
                Event::Apply(o) | Event::Delete(o) | Event::InitApply(o) => {
                    let _ = changed.send(what(&o));
                }
                Event::Init | Event::InitDone => {}
            }
        }
        async {}
    })));
    reader
}

impl Stores {
    /// Starts the watches of `namespace`'s objects and the cluster's Nodes, and waits until
    /// each has listed once.
    pub async fn start(client: &kube_client::Client, namespace: &str) -> Stores {
        let mut tasks = vec![];
        let (changed, _) = tokio::sync::broadcast::channel(4096);
        let t = &mut tasks;
        let ended = |o: &TalosOperation| {
            if o.status.as_ref().is_some_and(|s| s.phase().is_terminal()) {
                Changed::OperationEnded
            } else {
                Changed::Operation
            }
        };
        let stores = Stores {
            machines: keep(Api::namespaced(client.clone(), namespace), t, &changed, |_| Changed::Machine),
            patches: keep(Api::namespaced(client.clone(), namespace), t, &changed, |_| Changed::Patch),
            operations: keep(Api::namespaced(client.clone(), namespace), t, &changed, ended),
            nodes: keep(Api::all(client.clone()), t, &changed, |_| Changed::Node),
            kube_system_pods: keep(Api::namespaced(client.clone(), "kube-system"), t, &changed, |_| Changed::Pod),
            tasks,
            changed,
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
