//! Settings read from the environment: mps's own `MPS_*` names, and NVIDIA MPS's `CUDA_MPS_*`
//! names where mps's is unset, so that a setup made for NVIDIA's MPS (the pipe directory that
//! NVIDIA's device plugin injects, its client limits) works as it is. mps's name wins when both
//! are set.

use std::ffi::OsString;

/// mps's variables that NVIDIA's MPS has too, each with NVIDIA's name for it.
pub const NVIDIA_NAMES: &[(&str, &str)] = &[
    ("MPS_PIPE_DIRECTORY", "CUDA_MPS_PIPE_DIRECTORY"),
    ("MPS_LOG_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"),
    (
        "MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    ),
    (
        "MPS_PINNED_DEVICE_MEM_LIMIT",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    ),
    ("MPS_CLIENT_PRIORITY", "CUDA_MPS_CLIENT_PRIORITY"),
];

/// Setting `name` (an `MPS_*` variable), unless unset or blank, and the variable it came from
/// (for messages): `name` itself, else NVIDIA's name for it, if it has one.
pub fn setting(name: &'static str) -> Option<(String, &'static str)> {
    first_set(name, |v| std::env::var(v).ok())
}

/// As [`setting`], for a path (which need not be UTF-8).
pub fn setting_os(name: &'static str) -> Option<OsString> {
    first_set(name, |v| std::env::var_os(v)).map(|(v, _)| v)
}

fn first_set<T: AsRef<std::ffi::OsStr>>(
    name: &'static str,
    get: impl Fn(&str) -> Option<T>,
) -> Option<(T, &'static str)> {
    let nvidia = NVIDIA_NAMES
        .iter()
        .find(|(ours, _)| *ours == name)
        .map(|(_, theirs)| *theirs);
    std::iter::once(name).chain(nvidia).find_map(|var| {
        get(var)
            .filter(|v| !v.as_ref().to_string_lossy().trim().is_empty())
            .map(|v| (v, var))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(name: &'static str, env: &[(&str, &str)]) -> Option<(String, &'static str)> {
        first_set(name, |v| {
            env.iter()
                .find(|(k, _)| *k == v)
                .map(|(_, x)| x.to_string())
        })
    }

    #[test]
    fn mps_names_win_and_nvidia_names_stand_in_where_they_are_unset() {
        let both = [
            ("MPS_PIPE_DIRECTORY", "/run/mps"),
            ("CUDA_MPS_PIPE_DIRECTORY", "/run/nvidia-mps"),
        ];
        assert_eq!(
            lookup("MPS_PIPE_DIRECTORY", &both),
            Some(("/run/mps".into(), "MPS_PIPE_DIRECTORY"))
        );
        assert_eq!(
            lookup("MPS_PIPE_DIRECTORY", &both[1..]),
            Some(("/run/nvidia-mps".into(), "CUDA_MPS_PIPE_DIRECTORY"))
        );
        // A blank value is unset.
        let blank = [
            ("MPS_CLIENT_PRIORITY", " "),
            ("CUDA_MPS_CLIENT_PRIORITY", "1"),
        ];
        assert_eq!(
            lookup("MPS_CLIENT_PRIORITY", &blank),
            Some(("1".into(), "CUDA_MPS_CLIENT_PRIORITY"))
        );
        // mps's own settings have no NVIDIA name.
        assert_eq!(
            lookup("MPS_SM_RESERVE", &[("CUDA_MPS_SM_RESERVE", "25")]),
            None
        );
        assert_eq!(lookup("MPS_PINNED_DEVICE_MEM_LIMIT", &[]), None);
    }
}
