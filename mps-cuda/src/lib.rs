//! `libcuda.so.1` of mps: the CUDA driver API, served by an mps server.
//!
//! A program that loads this library instead of NVIDIA's (through `LD_LIBRARY_PATH`, which
//! `mps-run` sets) becomes a client of the mps server of `$MPS_PIPE_DIRECTORY` at `cuInit`, with
//! no change to the program. Queries (device attributes, names, contexts, function parameters)
//! are answered here from what the server reported at connect; work goes to the server, and
//! launches are posted without waiting, their errors surfacing at the next synchronising call,
//! as CUDA's asynchronous errors do. docs/TRANSPARENT.md lists what is implemented.
//!
//! The exports are CUDA's own names and ABIs (hence the non-snake-case names); the modules that
//! hold them are public so that they are reachable, but the library is meant only for C. Each
//! module defines its exports in one `exports!` block (`ffi`), from which `proc` makes
//! `cuGetProcAddress`'s table.
//!
//! The modules form layers, each using only those below it (a test below fails on a cycle):
//! - `abi`, `log`, `image`; `errors`, `ffi` (the panic boundary, out-parameters, `exports!`);
//!   `connection` (the one user of the mps client);
//! - `memo`, `handles`; `order` (the legacy default stream's ordering) and `objects` (what the
//!   handles stand for); `driver` (the devices and the registries) and `capture` (CUDA's rules
//!   of stream capture);
//! - the areas of the API, each over those: `context`, `device`; `stream`, `module`, `export`;
//!   `memory`, `vmm`, `kernel_queries`; `pointer`, `launch`, `mempool`; `unified` (copies whose
//!   direction comes from their addresses); then the graphs: `graph_node` (the work of one node),
//!   `graph_build` (the registry of graphs, and graphs built node by node), `graph_plan` (what an
//!   instantiation runs) and `graph` (capture and executable graphs); then `proc` over them all,
//!   and `unsupported`. A context's release frees what an area above keeps for it (the runtime's
//!   storage, modules) through the hooks that area registers (`driver::on_release`).

#![allow(non_snake_case)]

mod abi;
mod capture;
mod connection;
pub mod context;
pub mod context_wide;
pub mod device;
mod driver;
mod errors;
pub mod export;
mod ffi;
pub mod graph;
pub mod graph_build;
mod graph_node;
mod graph_plan;
mod handles;
mod image;
pub mod kernel_queries;
pub mod launch;
mod log;
mod memo;
pub mod memory;
pub mod mempool;
pub mod module;
mod objects;
mod order;
pub mod pointer;
pub mod proc;
pub mod stream;
pub mod tensor_map;
pub mod unified;
pub mod unsupported;
pub mod vmm;

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    /// The modules of the library that module `source` names (`crate::x`, `use crate::{x, y}`).
    fn named(source: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
        let mut found = BTreeSet::new();
        let word = |s: &str| -> String {
            s.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        };
        for (i, _) in source.match_indices("crate::") {
            let rest = &source[i + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                found.extend(group.split(',').map(|m| word(m.trim())));
            } else {
                found.insert(word(rest));
            }
        }
        found.retain(|m| modules.contains(m));
        found
    }

    /// The modules form layers: no module names one that names it back, however far round. A
    /// module may use those below it, and an area that keeps something for a context frees it
    /// through a release hook (`driver::on_release`) instead of the context calling up into it.
    #[test]
    fn the_modules_import_each_other_in_no_cycle() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let sources: BTreeMap<String, String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .map(|p| {
                let name = p.file_stem().unwrap().to_str().unwrap().to_string();
                (name, std::fs::read_to_string(&p).unwrap())
            })
            .filter(|(name, _)| name != "lib")
            .collect();
        assert!(sources.len() > 10, "found the modules in {}", dir.display());
        let modules: BTreeSet<String> = sources.keys().cloned().collect();
        let mut deps: BTreeMap<&str, BTreeSet<String>> = sources
            .iter()
            .map(|(m, s)| {
                let mut d = named(s, &modules);
                d.remove(m);
                (m.as_str(), d)
            })
            .collect();
        // Peel off the layers: each is the modules that name none left.
        let mut layers: Vec<Vec<&str>> = Vec::new();
        while !deps.is_empty() {
            let layer: Vec<&str> = deps
                .iter()
                .filter(|(_, d)| d.iter().all(|m| !deps.contains_key(m.as_str())))
                .map(|(m, _)| *m)
                .collect();
            if layer.is_empty() {
                // What is left names only what is left: a cycle, and what stands on it.
                let left: BTreeMap<&str, Vec<&String>> = deps
                    .iter()
                    .map(|(m, d)| {
                        (
                            *m,
                            d.iter().filter(|n| deps.contains_key(n.as_str())).collect(),
                        )
                    })
                    .collect();
                panic!(
                    "these modules import each other in a cycle, or import one that does (each \
                     with what it names of them): {left:?}; the layers below them: {layers:?}"
                );
            }
            layer.iter().for_each(|m| {
                deps.remove(m);
            });
            layers.push(layer);
        }
        eprintln!("the layers, lowest first: {layers:?}");
    }

    #[test]
    fn the_check_of_cycles_finds_names_in_both_forms() {
        let modules = ["a", "b", "c"].map(String::from).into();
        let found = named(
            "use crate::a::X;\nuse crate::{b, log};\nfn f() { crate::c::g() }",
            &modules,
        );
        assert_eq!(found, ["a", "b", "c"].map(String::from).into());
    }
}
