//! `cuslice oci-hook create|poststop`: the OCI runtime hook that gives a
//! container its slice.
//!
//! `create` (run it as a `createRuntime` hook, or `prestart` where only that
//! exists: podman / CRI-O hooks.d) reads the container's state on stdin,
//! turns its `cuslice.io/*` annotations into a quota file, and mounts into
//! the container, before it pivots to its root file system:
//!
//! | in the container | from the host | |
//! |---|---|---|
//! | `/etc/cuslice` | `<root>/containers/<id>/etc` (the quota file `quota.toml` alone) | read-only |
//! | `/run/cuslice/segment` | `<root>/containers/<id>/segment` | the container's memory segment |
//! | `/run/cuslice/gpu` | `<root>/gpu` | the host's per-GPU segments |
//! | `/usr/lib/cuslice/libcuslice.so` | the installed library | read-only |
//! | `/etc/ld.so.preload` | `<root>/ld.so.preload` (names the library) | read-only |
//!
//! The quota file is mounted through its directory, not as a file:
//! `cuslice resize` renames a new quota file into place, and a mount of
//! the file would keep showing the container the one it was created with;
//! through the directory, a process the container starts after a resize
//! opens the resized file. That directory holds nothing else (the
//! container's record, its resize record and its segment directory are
//! beside it, out of the container's sight), but, while a resize or this
//! hook writes the file, the new file under a hidden name
//! (`.quota.toml.new`, the same text, mode 0444) before it is renamed
//! into place. A container made by an older hook has its quota file at
//! `<root>/containers/<id>/quota.toml`, mounted as a file: `cuslice
//! resize`, `status` and `watch` still find it there, and its processes
//! see a resize only once it is recreated.
//!
//! The mounts are made from a child that enters the container's mount
//! namespace (`setns` on `/proc/<pid>/ns/mnt`): at this stage the
//! container's root is mounted at its bundle path and host paths are still
//! reachable. `poststop` removes `<root>/containers/<id>`.
//!
//! That is also why the image cannot be trusted with names: the hook is
//! host root and host paths are reachable, so a symlink in the image
//! (`/etc -> /host/etc`, `/usr/lib/cuslice -> ../../../../x`) would lead its
//! writes onto the host. Every path in the container is opened, and created
//! where missing, through `inroot` without following any symlink, and
//! mounted on through its descriptor. A symlink, a device, fifo or socket,
//! or a directory where a file belongs (or the reverse) fails container
//! creation with one line naming the path inside the container.
//!
//! With `--claim <uid>` (the per-claim CDI spec that the DRA kubelet plugin,
//! `cuslice-dra-plugin`, writes for a Kubernetes ResourceClaim), the quota
//! is not taken from annotations but from `<root>/claims/<uid>/quota.toml`
//! (the plugin's, read-only, read here without following a link and checked
//! the way the shim reads it), and the segment directory mounted at
//! `/run/cuslice/segment` is `<root>/claims/<uid>/segment`: every container
//! of the claim shares its memory quota, as they share its capacity. The
//! container's annotations are then ignored (the claim is what the
//! scheduler granted), and everything else (the checks, the other mounts,
//! the record) is the same, but for the record's `claim`: the claim's UID,
//! by which `cuslice watch` judges every container of the claim as one
//! slice against the claim's quota file and memory segment (the copy in
//! `<root>/containers/<id>/etc/quota.toml`, mounted at
//! `/etc/cuslice/quota.toml`, is what the container's shim reads; `cuslice
//! resize` of the claim writes every such copy again, so that the claim's
//! containers' new processes read the resized quota). A claim with no
//! quota file fails creation.
//!
//! A container without `cuslice.io/*` annotations is left alone. A bad
//! annotation fails container creation with one line naming it, and nothing
//! is left behind.
//!
//! A tenant name (`cuslice.io/tenant`) is one container's: a container
//! whose annotation names the tenant of another live container (its
//! recorded init still runs) or of a DRA claim under the same `--root` is
//! refused with one line naming the tenant and the other. The check and
//! the record it is made against are written under an exclusive lock on
//! `<root>/hook.lock`, so two hooks at once cannot both pass. (The GPU
//! segment keys tenants by name *and* slice, the quota file's `slice`,
//! `ctr-<id>` here: even a name shared another way never lets one
//! container change another's share.)
//!
//! So does a container that could not use its slice: one whose runtime is
//! rootless (the hook itself runs in a user namespace) or that has its own
//! user namespace. Its processes would not be host root, and the segments
//! they must share are root's files under `<root>` (a segment owned by
//! another uid is refused, by design: docs/threat-model.md); without this
//! check such a container started and only failed at its first CUDA call.
//!
//! `create` also records what the container runs, for `cuslice status` /
//! `top` (which cannot see into the container's PID namespace):
//! `<root>/containers/<id>/container.json` holds its name, pod and image
//! where an annotation of the runtime gives them, and its command line;
//! and, for `cuslice watch`, the inode of its PID namespace and its cgroup
//! (what maps a host PID to the container, whatever the process does), its
//! init (host PID and start time) and, given `--claim`, the claim's UID
//! (what maps the container to the claim's slice).
//!
//! Files, by concern:
//! - `spec`: what the runtime hands the hook (the OCI state on stdin, the
//!   bundle's `config.json`: the parts read), and the user check (a
//!   rootless runtime, a container with its own user namespace);
//! - `annotations`: the `cuslice.io/*` annotations turned into a quota
//!   file, the container's slice name, and the record's name, pod and
//!   image from the runtime's annotations;
//! - `gpus`: the GPUs a container is given;
//! - `health_gate`: the refusal of a container on an unhealthy GPU;
//! - `guarantee`: the container's memory guarantee in its GPUs' memory
//!   pools, registered at `create` and released at `poststop`;
//! - `driver_limit`: the driver's per-cgroup memory limit;
//! - `tenant`: a tenant name is one container's (the check, and the
//!   root's lock it is made under);
//! - `files`: the host files under `--root` (segments, quota file,
//!   record, preload file; a claim's quota file), made and removed;
//! - `mounts`: the bind mounts into the container, made from a child in
//!   its mount namespace.

mod annotations;
mod driver_limit;
mod files;
mod gpus;
mod guarantee;
mod health_gate;
mod mounts;
mod spec;
mod tenant;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use cuslice_core::config;
use serde::Deserialize;

use cuslice_host::container::{self, ContainerMeta};
use cuslice_host::fs::Dir;
use cuslice_host::inroot::{self, Kind};
use cuslice_host::layout::{
    self, CLAIMS_DIR, CONTAINER_RECORD, CONTAINERS_DIR, GPU_DIR, LOCK_FILE, Layout, MEMORY_SEGMENT,
    PRELOAD_FILE, QUOTA_DIR, QUOTA_FILE, SEGMENT_DIR, SliceKind,
};

pub use annotations::*;
use driver_limit::*;
use files::*;
use gpus::*;
use guarantee::*;
use health_gate::*;
use mounts::*;
use spec::*;
use tenant::*;

pub use cuslice_host::layout::DEFAULT_ROOT;
pub const DEFAULT_LIB: &str = "/usr/lib/cuslice/libcuslice.so";

pub struct HookArgs {
    pub root: PathBuf,
    pub lib: PathBuf,
    /// `--claim`: the UID of the ResourceClaim whose quota file and segment
    /// directory (under `<root>/claims/`) the container gets.
    pub claim: Option<String>,
}

pub fn create(a: &HookArgs) -> Result<(), String> {
    let st = read_state()?;
    check_id(&st.id)?;
    let spec = read_spec(&st.bundle)?;
    // Annotations reach hooks through the state (runtime-spec >= 1.0.2) or
    // the bundle's config.json; the state's win.
    let mut ann = spec.annotations;
    ann.extend(st.annotations);
    let (quota, label) = match &a.claim {
        Some(uid) => claim_quota(&a.root, uid)?,
        None => match quota_from_annotations(&st.id, &ann)? {
            Some(q) => (q, PathBuf::from("annotations")),
            None => return Ok(()),
        },
    };
    let linux = spec.linux.unwrap_or_default();
    check_user_namespaces(own_user_namespace(), &linux)?;
    let meta = container_meta(
        &st.id,
        &ann,
        spec.process.as_ref().map_or(&[][..], |p| &p.args[..]),
    );
    let user = spec
        .process
        .as_ref()
        .map(|p| inroot::User {
            uid: p.user.uid,
            gid: p.user.gid,
            groups: p.user.additional_gids.clone(),
        })
        .unwrap_or_default();
    let cfg = config::parse_file(&label, &quota).map_err(|e| e.to_string())?;
    let minors = gpu_minors(&linux.devices);
    check_gpu_health(&a.root, &cfg, &minors, allow_unhealthy(&ann)?)?;
    let gpus = gpu_segments_to_make(&cfg, &user)?;
    let pid = st
        .pid
        .filter(|p| *p > 0)
        .ok_or("the OCI state has no container pid")?;
    let init = u32::try_from(pid).ok();
    // Read once: the record's cgroup and the driver's memory limit's.
    let cgroup_text = init
        .and_then(cuslice_host::proc::cgroup_text)
        .unwrap_or_default();
    let meta = ContainerMeta {
        pid_ns: cuslice_host::proc::ns_inode(&format!("/proc/{pid}/ns/pid")),
        cgroup: cuslice_host::proc::cgroup_of(&cgroup_text),
        init_pid: init,
        init_start: init.and_then(cuslice_host::proc::stat).map(|s| s.start),
        claim: a.claim.clone(),
        ..meta
    };
    let rootfs = match spec.root {
        Some(r) if r.path.is_absolute() => r.path,
        Some(r) => st.bundle.join(r.path),
        None => st.bundle.join("rootfs"),
    };
    if !a.lib.is_file() {
        return Err(format!(
            "{}: no such library (install cuslice, or pass --lib)",
            a.lib.display()
        ));
    }
    let meta = ContainerMeta {
        driver_memory_limit: driver_memory_limits(&cfg, &cgroup_text),
        ..meta
    };
    let layout = Layout::new(&a.root);
    let result = (|| {
        // The segments first, outside the lock: opening one waits for its
        // flock, which a tenant can hold (the files are 0666), and a hook
        // stuck there must not hold up every other container's.
        make_segments(a, &st.id, &cfg, &gpus)?;
        // The container's guarantee, registered before its first process
        // (a DRA claim's is the plugin's, at prepare).
        if a.claim.is_none() {
            register_guarantee(a, &cfg, &minors)?;
        }
        // The tenant check and the record it is made against, under the
        // root's lock (only a container that names its tenant takes it):
        // of two hooks naming one tenant at once, the second sees the
        // first's record.
        let lock = if a.claim.is_none() && ann.contains_key(TENANT_ANNOTATION) {
            let lock = lock_root(&a.root)?;
            let tenant = cfg.tenant_name();
            if let Some(other) = tenant_holder(&a.root, &st.id, &tenant, &|init| {
                cuslice_host::container::init_alive(init, cuslice_host::proc::stat)
            }) {
                return Err(format!(
                    "{TENANT_ANNOTATION} {tenant:?}: already the tenant of {other} on this host: two containers cannot share one tenant's slice; choose another name"
                ));
            }
            Some(lock)
        } else {
            None
        };
        write_records(a, &st.id, &quota, &meta)?;
        drop(lock);
        mount_into(pid, &rootfs, a, &st.id, &user)
    })();
    if result.is_err() {
        // Nothing half-created stays behind.
        if a.claim.is_none() {
            release_guarantee(&a.root, &st.id, &cfg);
        }
        let _ = remove_container(&layout, &st.id);
    }
    result
}

pub fn poststop(a: &HookArgs) -> Result<(), String> {
    let st = read_state()?;
    check_id(&st.id)?;
    // Its guarantee leaves the GPUs' pools: the quota file says whose
    // (read without following a link, root's file, bounded).
    let quota = Layout::new(&a.root)
        .open()
        .and_then(|r| r.open_dir(CONTAINERS_DIR))
        .and_then(|d| d.open_dir(&st.id))
        .and_then(|d| d.open_dir(QUOTA_DIR))
        .and_then(|d| d.read_file(QUOTA_FILE, 1 << 20));
    if let Ok(text) = quota
        && let Ok(cfg) = config::parse_file(Path::new(QUOTA_FILE), &text)
    {
        release_guarantee(&a.root, &st.id, &cfg);
    }
    remove_container(&Layout::new(&a.root), &st.id)
}
