//! The test substrate (feature `sim`), in its own tree so that no product module can reach it:
//! a simulated Talos fleet serving Talos's real gRPC API over mTLS on loopback (`talos`, with
//! its PKI in `pki`), an in-memory Kubernetes API a real `kube_client::Client` talks to
//! (`kubeapi`, with its discovery documents in `discovery`), the pinned Kubernetes programs
//! (`kubebin`) and a real control plane of them (`control_plane`), stand-in kubelets that post
//! to any API server through kube-rs (`kubelet`), and a whole simulated installation with
//! stand-ins for what kubelets, Helm and Argo CD would do (`demo`). `ichor sim ...` serves them; tests build on them.
//!
//! Start at `demo::Demo::start`. A tidy test fails when a module outside this tree names it.

pub mod control_plane;
pub mod demo;
pub mod discovery;
pub mod kubeapi;
pub mod kubebin;
pub mod kubelet;
pub mod pki;
pub mod talos;
