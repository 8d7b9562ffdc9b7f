//! Process start and end: reading the environment once, the fork handler
//! and the exit report. Runs from the ELF constructor, before `main` and
//! possibly before other libraries are initialised: it only calls `getenv`,
//! stores atomics and registers handlers.

use std::ffi::CStr;

use crate::log::{self, Level};

fn env(name: &CStr) -> Option<&'static [u8]> {
    // SAFETY: getenv with a NUL-terminated name; the environment block lives
    // for the whole process (we read it before main can modify it).
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null NUL-terminated string from the environment.
    Some(unsafe { CStr::from_ptr(p) }.to_bytes())
}

/// Parses the kill switch. Unknown values keep cuslice active (limits are
/// never dropped by a typo) and say so.
pub fn parse_disable(v: Option<&[u8]>) -> Option<bool> {
    match v {
        None | Some(b"") | Some(b"0") | Some(b"false") | Some(b"no") | Some(b"off") => Some(false),
        Some(b"1") | Some(b"true") | Some(b"yes") | Some(b"on") => Some(true),
        Some(_) => None,
    }
}

extern "C" fn on_load() {
    let level_var = env(c"CUSLICE_LOG");
    let bad_level = match level_var {
        None | Some(b"") => None,
        Some(v) => match Level::parse(v) {
            Some(l) => {
                log::set_level(l);
                None
            }
            None => Some(v),
        },
    };
    if let Some(v) = bad_level {
        crate::warn!(
            "CUSLICE_LOG={} is not one of off, error, warn, info, debug; using warn",
            String::from_utf8_lossy(v)
        );
    }
    match parse_disable(env(c"CUSLICE_DISABLE")) {
        // The mounted quota file is authoritative over the environment, the
        // kill switch included: a tenant must not switch its limits off.
        Some(true) if quota_file_mounted() => crate::warn!(
            "CUSLICE_DISABLE is set but ignored: {} exists and is authoritative",
            cuslice_core::config::DEFAULT_CONFIG_PATH
        ),
        Some(d) => crate::ffi::set_disabled(d),
        None => crate::warn!(
            "CUSLICE_DISABLE={} is not 1/0 (or true/false, yes/no, on/off); cuslice stays active",
            String::from_utf8_lossy(env(c"CUSLICE_DISABLE").unwrap_or_default())
        ),
    }
    if crate::ffi::disabled() {
        crate::info!("CUSLICE_DISABLE is set: every call passes straight to the driver");
    }
    // SAFETY: registering plain extern "C" handlers with no preconditions.
    unsafe { libc::pthread_atfork(Some(before_fork), None, Some(after_fork_child)) };
    crate::debug!("loaded");
}

/// Whether the quota file a container's slice mounts exists (checked with
/// `access`, from the library constructor: no allocation).
fn quota_file_mounted() -> bool {
    const _: () = {
        // The path checked is core's default quota file.
        let (a, b) = (
            b"/etc/cuslice/quota.toml".as_slice(),
            cuslice_core::config::DEFAULT_CONFIG_PATH.as_bytes(),
        );
        assert!(a.len() == b.len());
        let mut i = 0;
        while i < a.len() {
            assert!(a[i] == b[i]);
            i += 1;
        }
    };
    // SAFETY: access with a NUL-terminated constant path.
    unsafe { libc::access(c"/etc/cuslice/quota.toml".as_ptr(), libc::F_OK) == 0 }
}

extern "C" fn before_fork() {
    // Lets an initialisation in progress notice a fork (one atomic add).
    crate::quota::before_fork();
}

extern "C" fn after_fork_child() {
    // The child reports its own calls, not its parent's.
    log::reset_counts();
    // ...and registers its own slot at its own cuInit.
    crate::quota::after_fork_child();
    crate::compute::after_fork_child();
    crate::gputime::after_fork_child();
}

extern "C" fn on_unload() {
    log::report_counts();
    crate::compute::at_exit();
    crate::quota::at_exit();
}

#[used]
#[unsafe(link_section = ".init_array")]
static ON_LOAD: extern "C" fn() = on_load;

#[used]
#[unsafe(link_section = ".fini_array")]
static ON_UNLOAD: extern "C" fn() = on_unload;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_switch_values() {
        assert_eq!(parse_disable(None), Some(false));
        assert_eq!(parse_disable(Some(b"1")), Some(true));
        assert_eq!(parse_disable(Some(b"off")), Some(false));
        assert_eq!(parse_disable(Some(b"maybe")), None);
    }
}
