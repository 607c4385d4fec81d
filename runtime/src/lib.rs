//! Ichor's runtime: the observed state, the facts the operation rules see, and the plan they
//! derive, as typed actions an executor performs without choosing anything.
//!
//! Start at `state::ObservedState` (the snapshot), `facts::facts` (the one function from state
//! to facts) and `plan::Planner` (evaluate, decode, check, explain); then, with feature `io`,
//! `controller::Controller` (observe, assemble, plan, execute, write status) and `exec` (the
//! executor, which performs a plan's actions and chooses nothing). The simulators live in
//! `sim` (feature `sim`), apart from the product.

pub mod admission;
pub mod assemble;
pub mod cni_objects;
#[cfg(feature = "io")]
pub mod controller;
pub mod crashpoint;
#[cfg(feature = "io")]
pub mod exec;
pub mod facts;
pub mod handover;
pub mod health;
#[cfg(feature = "io")]
pub mod install;
pub mod intent;
#[cfg(feature = "io")]
pub mod kube;
pub mod messages;
#[cfg(feature = "io")]
pub mod metrics;
pub mod monitoring;
pub mod netpol;
pub mod plan;
pub mod rbac;
pub mod reconcile;
pub mod select;
#[cfg(feature = "io")]
pub mod serve;
/// The test substrate (feature `sim`): the simulated Talos fleet and its PKI, the in-memory
/// Kubernetes API and the demo stand-ins. No product module names it (a tidy test).
#[cfg(feature = "sim")]
pub mod sim;
pub mod state;
pub mod status;
#[cfg(feature = "io")]
pub mod stores;
#[cfg(feature = "io")]
pub mod talos;
#[cfg(feature = "io")]
pub mod webhook;
pub mod window;

/// An error and its sources as one line (`a: b: c`): how logs, Events and status messages print
/// an error, since each error's own text names only its layer and never repeats its source's
/// (the chain is printed once, here and by the CLI's `main`; nothing is hidden).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let (mut text, mut source) = layer(e);
    while let Some(s) = source {
        let (next, below) = layer(s);
        text.push_str(": ");
        text.push_str(&next);
        source = below;
    }
    text
}

/// One layer of an error chain as a sentence, and the layer below it. An answer of the
/// Kubernetes API is its code, reason, message and object, never kube-rs's `Display` (which
/// appends the whole `Status` as a Rust debug dump, issue 50 finding 8).
fn layer<'a>(e: &'a (dyn std::error::Error + 'static)) -> (String, Option<&'a (dyn std::error::Error + 'static)>) {
    #[cfg(feature = "io")]
    if let Some(kube_client::Error::Api(status)) = e.downcast_ref::<kube_client::Error>() {
        return (api_status_text(status), None);
    }
    (e.to_string(), e.source())
}

/// An answer of the Kubernetes API as a sentence: `the API server answered 429 TooManyRequests
/// (pods "x"): message`.
#[cfg(feature = "io")]
pub fn api_status_text(s: &kube_client::core::Status) -> String {
    let object = s.details.as_ref().filter(|d| !d.name.is_empty()).map(|d| {
        let kind = if d.kind.is_empty() { String::new() } else { format!("{} ", d.kind) };
        format!(" ({kind}{:?})", d.name)
    });
    let reason = if s.reason.is_empty() { String::new() } else { format!(" {}", s.reason) };
    let message = if s.message.is_empty() { "no message".to_string() } else { s.message.clone() };
    format!("the API server answered {}{reason}{}: {message}", s.code, object.unwrap_or_default())
}

/// The shipped program rooted at `root` (one of `render::embedded`'s program roots), loaded
/// from the rule files this build embeds, its warnings dropped (`ichor rules check` shows them).
pub fn embedded_program(root: &str) -> Result<engine::Engine, engine::LoadError> {
    let files = render::embedded::RULE_FILES.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect();
    engine::Engine::load(&[root.to_string()], &engine::MemSources(files)).map(|(e, _)| e)
}

#[cfg(all(test, feature = "io"))]
mod error_chain_tests {
    /// Issue 50, finding 8: a pause message read `Status { status: Some(Failure), code: 429 ...`.
    #[test]
    fn an_api_answer_is_a_sentence_never_a_debug_dump() {
        let status = kube_client::core::Status::failure("too many requests, try again later", "TooManyRequests")
            .with_code(429)
            .with_details(kube_client::core::response::StatusDetails {
                name: "w1-pod".into(),
                group: String::new(),
                kind: "pods".into(),
                uid: String::new(),
                causes: vec![],
                retry_after_seconds: 1,
            });
        let e = kube_client::Error::Api(Box::new(status));
        let text = super::error_chain(&e);
        assert_eq!(
            text,
            "the API server answered 429 TooManyRequests (pods \"w1-pod\"): too many requests, try again later"
        );
        assert!(!text.contains("Some(") && !text.contains("Status {"), "{text}");
    }
}
