//! Ichor's pure domain: Talos configs, paths, field metadata, classification.
//!
//! Start at `config` (parse a multi-document machine config), `path` (the path syntax and
//! patterns), `diff` (changed paths and the redacted unified diff), `inventory` (the paths
//! each Talos contract has, derived from its schema), `fieldmeta` (the classes of paths, from
//! `rules/fieldmeta.yaml`) and `classify` (facts for the classification rules, and their
//! answers decoded).
//!
//! Architecture invariant: no I/O, no async, no clock. Files arrive as strings.

#![warn(missing_docs)]

pub mod adopt;
pub mod api;
pub mod boot;
pub mod cilium;
pub mod classify;
pub mod config;
pub mod diff;
pub mod embedded;
pub mod fieldmeta;
pub mod inventory;
pub mod machine;
pub mod manifests;
pub mod migrate;
pub mod patch;
pub mod path;
pub mod policy;
pub mod render;
pub mod secrets;
pub mod vocab;
pub mod yaml;
