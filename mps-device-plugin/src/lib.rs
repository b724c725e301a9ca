//! A Kubernetes device plugin for mps (see docs/KUBERNETES.md).

pub mod api;
