//! The intent host: whether `ichor operation resume|abort` may be asked of an operation now,
//! as rules/intent.rules decides it (the same rules the controller acts on the annotation with,
//! through backbone.rules). The CLI asks before it writes anything.
//!
//! Start at `refusal`. Pure.

use render::api::{OperationKind, Phase};

/// What the user asks of an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intent {
    Resume,
    Abort,
}

impl Intent {
    /// The intent as rules/intent.rules names it.
    pub fn name(self) -> &'static str {
        match self {
            Intent::Resume => "resume",
            Intent::Abort => "abort",
        }
    }
}

/// Why the intent rules could not decide.
#[derive(Debug, thiserror::Error)]
pub enum IntentError {
    /// The shipped rules do not load or do not declare what this host reads.
    #[error(
        "the intent rules ({}) do not load; fix them and run `ichor rules check`",
        render::embedded::INTENT_PROGRAM
    )]
    Load(#[from] engine::LoadError),
    #[error("evaluating the intent rules")]
    Eval(#[from] engine::EvalError),
    /// The message templates do not load, or the refusal's does not fill.
    #[error(transparent)]
    Messages(#[from] crate::messages::MessageError),
}

/// The intent program, compiled, and its relations as this host uses them.
pub struct Rules {
    engine: engine::Engine,
    operation: engine::Input<3>,
    abort_requested: engine::Input<0>,
    refused: engine::Output<2>,
    messages: crate::messages::Messages,
}

/// The operation as the intent rules see it.
#[derive(Clone, Debug)]
pub struct Operation<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub kind: OperationKind,
    pub phase: Phase,
    /// `ichor operation abort` was asked already (its annotation).
    pub abort_requested: bool,
}

impl Rules {
    /// The shipped rules and messages.
    pub fn embedded() -> Result<Rules, IntentError> {
        use engine::Type::Symbol as S;
        let engine = crate::embedded_program(render::embedded::INTENT_PROGRAM)?;
        let mut b = engine::Binder::new(&engine.program, "intent");
        let operation = b.input("operation", [("name", S), ("kind", S), ("phase", S)]);
        let abort_requested = b.input("abort_requested", []);
        let refused = b.output("intent_refused", [("intent", S), ("template", S)]);
        b.finish().map_err(engine::LoadError::from)?;
        Ok(Rules { engine, operation, abort_requested, refused, messages: crate::messages::Messages::embedded()? })
    }

    /// Why asking `intent` of `op` now is refused, as a sentence that says what to do; none:
    /// it may be asked.
    pub fn refusal(&self, op: &Operation, intent: Intent) -> Result<Option<String>, IntentError> {
        let mut b = self.engine.fact_builder();
        let row = [b.sym(op.name), b.sym(op.kind.name()), b.sym(op.phase.name())];
        self.operation.push(&mut b, row);
        if op.abort_requested {
            self.abort_requested.push(&mut b, []);
        }
        let db = self.engine.evaluate_built(b, engine::EvalOptions::default())?;
        let Some(template) = self.refused.rows(&db).find(|[i, _]| db.sym(*i) == intent.name()).map(|[_, t]| t) else {
            return Ok(None);
        };
        let data = serde_json::json!({"namespace": op.namespace, "operation": op.name, "phase": op.phase.name()});
        Ok(Some(self.messages.render(db.sym(template), &data)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each phase, each intent: the rules refuse what the controller would not act on.
    #[test]
    fn only_a_paused_operation_is_resumed_and_only_one_not_ended_is_aborted() {
        let rules = Rules::embedded().unwrap();
        let op = |phase, abort_requested| Operation {
            namespace: "ns",
            name: "up",
            kind: OperationKind::Kubernetes,
            phase,
            abort_requested,
        };
        let refused = |phase, abort, intent| rules.refusal(&op(phase, abort), intent).unwrap();
        assert_eq!(refused(Phase::Paused, false, Intent::Resume), None);
        assert_eq!(refused(Phase::Running, false, Intent::Abort), None);
        assert_eq!(
            refused(Phase::Running, false, Intent::Resume).as_deref(),
            Some(
                "TalosOperation ns/up is Running, not Paused: only a paused operation is resumed; follow it with ichor status --watch, or end it with ichor operation abort"
            )
        );
        assert_eq!(
            refused(Phase::Completed, false, Intent::Abort).as_deref(),
            Some("TalosOperation ns/up is already Completed: there is nothing to abort")
        );
        assert!(refused(Phase::Paused, true, Intent::Resume).unwrap().contains("was asked to abort"));
    }
}
