//! Quick end-to-end checks of the engine on tiny programs (more in engine/tests/engine.rs).
use engine::{Engine, EvalOptions, load_str};
use engine::facts::FactSet;

fn run(src: &str, facts: &str) -> String {
    let loaded = load_str("t.rules", src);
    assert!(loaded.program.is_some(), "{}", loaded.render_diagnostics());
    let engine = Engine::new(loaded.program.unwrap()).unwrap();
    let f = FactSet::from_json(facts).unwrap().resolve(&engine.program).unwrap();
    let db = engine.evaluate(&f, EvalOptions::default()).unwrap();
    let mut out = String::new();
    for r in engine.program.outputs() {
        for t in db.decoded(r) {
            out.push_str(&engine::Database::format_tuple(&engine.program, r, &t));
            out.push('\n');
        }
    }
    out
}

#[test]
fn tc() {
    let out = run(
        ".decl e(a: number, b: number)\n.input e\n.decl p(a: number, b: number)\n.output p\np(X, Y) :- e(X, Y).\np(X, Z) :- p(X, Y), e(Y, Z).\n",
        r#"{"e": [[1,2],[2,3],[3,4]]}"#,
    );
    assert_eq!(out, "p(1, 2)\np(1, 3)\np(1, 4)\np(2, 3)\np(2, 4)\np(3, 4)\n");
}
