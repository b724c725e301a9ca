//! A Kubernetes device plugin for mps (docs/KUBERNETES.md): it advertises shares of each GPU
//! that the node's mps daemon serves, device memory in GiB (`<domain>/gpu-memory`) and SM share
//! in percent (`<domain>/gpu-sm`), and gives each container that asks for them the pipe
//! directory, mps's CUDA library and a server group of its own held to what it asked for.
//!
//! `shares` is the model (devices, allocations, what a container gets), free of I/O; `daemon`
//! asks the mps daemon; `plugin` speaks the kubelet's API (`api`, generated).

pub mod api;
pub mod daemon;
pub mod plugin;
pub mod shares;
