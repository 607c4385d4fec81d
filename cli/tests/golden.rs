//! Golden tests: every case under `tests/golden/<case>/` runs the `ichor` binary.
//!
//! A case is a `*.toml` (arguments, expected exit code) beside its inputs, with the expected
//! output in `*.stdout` / `*.stderr`; the command runs in the case's folder. Rewrite the
//! expected files with `TRYCMD=overwrite cargo test -p cli --test golden` and read the change
//! as a diff.

#[test]
fn golden() {
    trycmd::TestCases::new().case("../tests/golden/*/*.toml");
}
