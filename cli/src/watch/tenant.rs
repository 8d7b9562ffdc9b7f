//! What the watch's steps agree on about a slice's tenant on a GPU: from
//! its quota file, whether the shim registers its processes there, what
//! memory quota, share and ceiling it has there and whether each is
//! certain (not given by an index NVML's need not match), the tenants a
//! GPU segment is judged against; from its slots, whether a process is
//! registered. `observe` reads only the evidence these say can matter and
//! the judge's rules rule by them: both import this module, neither the
//! other for it. Pure functions, unit-tested here and through the rules.

use std::collections::HashSet;

use cuslice_core::config::Config;
use cuslice_core::gpu::audit::Expected;

use super::slices::Slice;
use super::snapshot::{Registration, SlotReading};

/// Whether the shim registers a process of a slice with quota file `cfg`
/// that uses GPU `index` / `uuid`: in a slot of the memory segment where
/// the slice has a memory quota on any GPU, in an entry of this GPU's
/// segment where it has a share or ceiling here. A slice limited on other
/// GPUs only gives a process that uses this one nothing to register in.
pub fn registers(cfg: &Config, index: u32, uuid: &[u8; 16]) -> bool {
    cfg.has_memory() || cfg.tenant_spec(index, uuid).is_some()
}

/// The PIDs registered in `slots`: those of live processes (a dead
/// process's slot, not swept yet, registers nobody).
pub fn registered_pids(slots: &[SlotReading]) -> HashSet<u32> {
    slots.iter().filter(|s| s.alive).map(|s| s.pid).collect()
}

/// Whether a process is registered: its PID as it sees itself is in a live
/// slot, and it maps its slice's segments. The PID alone is not enough: a
/// process in a PID namespace of its own (`unshare -Urpf` needs no
/// privilege) sees itself as 1, or as whatever a registered sibling of
/// another namespace is.
pub fn is_registered(registered: &HashSet<u32>, r: &Registration) -> bool {
    registered.contains(&r.inner_pid) && r.maps_segment == Some(true)
}

/// The memory quota `cfg` gives GPU `index` / `uuid`, and whether that is
/// certain: a quota given by index is matched against NVML's index, which
/// need not be the CUDA index the container's processes used.
pub fn memory_quota(cfg: &Config, index: u32, uuid: &[u8; 16]) -> (Option<u64>, bool) {
    (
        cfg.limits_for(index, uuid).memory_limit(),
        memory_certain(cfg, uuid),
    )
}

/// Whether `cfg`'s memory quota for GPU `uuid` does not depend on an
/// index: given by UUID, or no quota is given by index.
pub fn memory_certain(cfg: &Config, uuid: &[u8; 16]) -> bool {
    cfg.by_uuid.get(uuid).is_some_and(|l| l.memory.is_some())
        || cfg.by_index.values().all(|l| l.memory.is_none())
}

/// Whether `cfg`'s compute share and ceiling for GPU `uuid` are certain: a
/// share or ceiling given by index is matched against NVML's index, which
/// need not be the GPU the tenant's processes call that index.
pub fn compute_certain(cfg: &Config, uuid: &[u8; 16]) -> bool {
    cfg.by_uuid
        .get(uuid)
        .is_some_and(|l| l.compute.is_some() || l.compute_max.is_some())
        || cfg
            .by_index
            .values()
            .all(|l| l.compute.is_none() && l.compute_max.is_none())
}

/// The tenants of `slices` (those whose GPU segment directory holds the
/// segment) that a GPU segment of GPU `index` / `uuid` is judged against:
/// each by its name and its slice's tag (its entry, whatever other slice
/// has the same name), with what its quota file gives it there. A share
/// given by index may be another GPU's: such a tenant is not judged (nor
/// "repaired").
pub fn expected_tenants<'a>(
    slices: impl Iterator<Item = &'a Slice>,
    index: u32,
    uuid: &[u8; 16],
) -> Vec<Expected> {
    slices
        .filter_map(|s| {
            let q = s.quota.as_ref().filter(|q| compute_certain(q, uuid))?;
            Some(Expected {
                name: s.tenant.clone(),
                tag: s.tag,
                spec: q.tenant_spec(index, uuid)?,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const GPU0: [u8; 16] = [0xa0; 16];

    fn quota(text: &str) -> Config {
        cuslice_core::config::parse_file(Path::new("quota.toml"), text).expect("quota file")
    }

    #[test]
    fn a_limit_given_by_index_is_uncertain_and_one_given_by_uuid_or_for_all_is_not() {
        let by_uuid = |k: &str| {
            quota(&format!(
                "[device.\"{}\"]\n{k}\n",
                cuslice_core::config::format_uuid(&GPU0)
            ))
        };
        // Memory: for every GPU, by UUID, by index.
        assert_eq!(
            memory_quota(&quota("[all]\nmemory = \"1GiB\"\n"), 0, &GPU0),
            (Some(1 << 30), true)
        );
        assert_eq!(
            memory_quota(&by_uuid("memory = \"1GiB\""), 0, &GPU0),
            (Some(1 << 30), true)
        );
        assert_eq!(
            memory_quota(&quota("[device.0]\nmemory = \"1GiB\"\n"), 0, &GPU0),
            (Some(1 << 30), false)
        );
        // A share or a ceiling alike.
        assert!(compute_certain(&quota("[all]\ncompute = 30\n"), &GPU0));
        assert!(compute_certain(&by_uuid("compute_max = 40"), &GPU0));
        assert!(!compute_certain(
            &quota("[device.0]\ncompute_max = 40\n"),
            &GPU0
        ));
        // A memory quota by index leaves a share for all certain, and the
        // other way round.
        let mixed = quota("[all]\ncompute = 30\n[device.0]\nmemory = \"1GiB\"\n");
        assert!(compute_certain(&mixed, &GPU0));
        assert!(!memory_certain(&mixed, &GPU0));
    }

    #[test]
    fn a_process_is_registered_only_by_a_live_slot_and_its_mapping() {
        let slots = [
            SlotReading {
                pid: 1,
                alive: true,
            },
            SlotReading {
                pid: 7,
                alive: false,
            },
        ];
        let reg = registered_pids(&slots);
        assert_eq!(reg, HashSet::from([1]));
        let r = |inner_pid, maps_segment| Registration {
            inner_pid,
            maps_segment,
            exiting: None,
        };
        assert!(is_registered(&reg, &r(1, Some(true))));
        assert!(!is_registered(&reg, &r(1, Some(false))));
        assert!(!is_registered(&reg, &r(1, None)));
        assert!(!is_registered(&reg, &r(7, Some(true))));
    }
}
