//! What the judge's tests (and act's, which judge first) build their
//! snapshots from: two GPUs, slices `a` and `b`, processes that never
//! registered, the policies with passes of 2 s.

use std::path::{Path, PathBuf};

use cuslice_core::config::{Config, format_uuid};
use cuslice_core::gpu::audit::Finding;
use cuslice_core::segment::RawDevice;

use super::verdict::{Case, Verdict};
use crate::watch::config::{Policy, WatchConfig};
use crate::watch::slices::{Owner, SliceId};
use crate::watch::snapshot::{
    Device, GpuSegReading, GpuSnap, ProcSnap, Registration, SliceSnap, SlotReading, Snapshot,
    TenantReading,
};

pub const G: u64 = 1 << 30;
pub const GPU0: [u8; 16] = [0xa0; 16];
pub const GPU1: [u8; 16] = [0xa1; 16];
pub const SECOND: u64 = 1_000_000_000;
/// The snapshots' clock (CLOCK_MONOTONIC, ns).
pub const NOW: u64 = 1000 * SECOND;

pub fn quota(text: &str) -> Config {
    cuslice_core::config::parse_file(Path::new("quota.toml"), text).expect("quota file")
}

pub fn a() -> SliceId {
    SliceId::Container("aaa".into())
}

pub fn b() -> SliceId {
    SliceId::Container("bbb".into())
}

pub fn slice(tenant: &str, q: &str) -> SliceSnap {
    SliceSnap {
        tenant: tenant.into(),
        label: format!("container {tenant}"),
        quota: Some(quota(q)),
        mem_seg: Some(PathBuf::from(format!(
            "/run/cuslice/containers/{tenant}/segment/memory.seg"
        ))),
        ..SliceSnap::default()
    }
}

/// A process of `owner` using `used` bytes, that never registered
/// (its PID as it sees itself is its host PID, in no slot).
pub fn process(pid: u32, start: u64, used: u64, owner: Owner) -> ProcSnap {
    ProcSnap {
        pid,
        start,
        used: Some(used),
        sm: None,
        owner,
        registration: Some(Registration {
            inner_pid: pid,
            maps_segment: None,
            exiting: Some(false),
        }),
    }
}

pub fn gpu(index: u32, uuid: [u8; 16], procs: Vec<ProcSnap>) -> GpuSnap {
    GpuSnap {
        index,
        uuid: format_uuid(&uuid),
        uuid_bytes: Some(uuid),
        memory_total: Some(16 * G),
        procs,
    }
}

pub fn snapshot(pass: u64, gpus: Vec<GpuSnap>, slices: Vec<(SliceId, SliceSnap)>) -> Snapshot {
    Snapshot {
        pass,
        now_ns: NOW,
        devices: [(0, GPU0), (1, GPU1)]
            .iter()
            .map(|(index, u)| Device {
                index: *index,
                uuid: format_uuid(u),
            })
            .collect(),
        nvml_pids: gpus
            .iter()
            .flat_map(|g| g.procs.iter().map(|p| p.pid))
            .collect(),
        gpus,
        slices: slices.into_iter().collect(),
        ..Snapshot::default()
    }
}

/// Passes of 2 s: one pass spans the window of a 40 % ceiling with the
/// default burst (`ceiling_passes`), so that a ceiling is judged pass
/// by pass where a test is about something else.
pub fn policy(p: Policy) -> WatchConfig {
    WatchConfig {
        policy: p,
        interval: std::time::Duration::from_secs(2),
        ..WatchConfig::default()
    }
}

/// The cases found, in order (findings that stand, unseen parts and
/// GPU segments left out).
pub fn cases(v: &[Verdict]) -> Vec<&Case> {
    v.iter()
        .filter_map(|v| match v {
            Verdict::Found { case, .. } => Some(case),
            _ => None,
        })
        .collect()
}

pub const MEM_1G: &str = "[all]\nmemory = \"1GiB\"\n";

/// Slice a (share 20, ceiling 40 where `ceiling`) at `a_pct` of the
/// GPU, slice b (share 70) at 45% asking for `demand` per mille, last
/// active `idle` ago.
pub fn two_tenants(pass: u64, a_pct: f64, ceiling: bool, demand: u32, idle: u64) -> Snapshot {
    let mut pa = process(10, 100, G / 4, Owner::Slice(a()));
    pa.sm = Some(a_pct);
    pa.registration = None;
    let mut pb = process(20, 200, G / 4, Owner::Slice(b()));
    pb.sm = Some(45.0);
    pb.registration = None;
    let mut sa = slice(
        "a",
        if ceiling {
            "[all]\ncompute = 20\ncompute_max = 40\n"
        } else {
            "[all]\ncompute = 20\n"
        },
    );
    sa.gpu_tenant.insert(0, TenantReading::default());
    let mut sb = slice("b", "[all]\ncompute = 70\n");
    sb.gpu_tenant.insert(
        0,
        TenantReading {
            throttled_ns: 0,
            demand_pm: demand,
            last_activity: NOW - idle,
        },
    );
    snapshot(
        pass,
        vec![gpu(0, GPU0, vec![pa, pb])],
        vec![(a(), sa), (b(), sb)],
    )
}

pub fn entry(index: usize, uuid: [u8; 16], state: u32, limit: u64) -> RawDevice {
    RawDevice {
        index,
        state,
        uuid,
        limit,
        used: 0,
    }
}

/// Slice a (1 GiB) and its process 7 on GPU 0, in pass `pass`: registered
/// (in a live slot, mapping its slice's segments) or never.
pub fn unregistered_at(pass: u64, registered: bool) -> Snapshot {
    let mut s = slice("a", MEM_1G);
    if registered {
        s.slots.push(SlotReading {
            pid: 7,
            alive: true,
        });
    }
    let mut p = process(7, 70, G / 2, Owner::Slice(a()));
    p.registration = Some(Registration {
        inner_pid: 7,
        maps_segment: registered.then_some(true),
        exiting: (!registered).then_some(false),
    });
    snapshot(pass, vec![gpu(0, GPU0, vec![p])], vec![(a(), s)])
}

/// Slice a with quota file `q` and two processes on GPU 0: an old one
/// holding 600 MiB, a new one 2 GiB.
pub fn memory_at(q: &str) -> Snapshot {
    let mut old = process(10, 100, 600 << 20, Owner::Slice(a()));
    let mut new = process(20, 200, 2 * G, Owner::Slice(a()));
    for p in [&mut old, &mut new] {
        p.registration = None;
    }
    snapshot(
        1,
        vec![gpu(0, GPU0, vec![old, new])],
        vec![(a(), slice("a", q))],
    )
}

/// Slice a with quota file `q`, its memory segment holding entry `e`
/// alone, nothing on a GPU.
pub fn memory_entry_at(q: &str, e: RawDevice) -> Snapshot {
    let mut s = slice("a", q);
    s.mem_entries = Some(vec![e]);
    snapshot(1, vec![], vec![(a(), s)])
}

/// The GPU segment the GPU segment tests read.
pub const GPU_SEGMENT: &str = "/run/cuslice/gpu/GPU-x.seg";

/// What the audit found in [`GPU_SEGMENT`]: tenant a's share forged.
pub fn forged_share() -> Finding {
    Finding {
        tenant: Some("a".into()),
        kind: "tenant-config",
        what: "share 90, its quota file 30".into(),
    }
}

/// Three audits of [`GPU_SEGMENT`] (GPU 1): right, `found`, unreadable.
pub fn gpu_segments_read(found: Finding) -> Snapshot {
    let reading = |found| GpuSegReading {
        path: PathBuf::from(GPU_SEGMENT),
        gpu: 1,
        expected: vec![],
        at_ns: NOW,
        found,
    };
    let mut s = snapshot(1, vec![], vec![]);
    s.gpu_segments = vec![
        reading(Ok(vec![])),
        reading(Ok(vec![found])),
        reading(Err("cannot open".into())),
    ];
    s
}
