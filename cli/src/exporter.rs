//! `cuslice exporter`: the status figures as Prometheus metrics
//! (OpenMetrics text) on `GET /metrics`. Every scrape reads the segments
//! afresh; nothing is cached between scrapes.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

use crate::status::{Snapshot, Sources, snapshot};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemLabels {
    gpu: String,
    segment: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProcLabels {
    gpu: String,
    segment: String,
    pid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TenantLabels {
    gpu: String,
    tenant: String,
}

type G = Family<MemLabels, Gauge>;
type F64Counter = Counter<f64, AtomicU64>;

/// The metrics of one snapshot, in OpenMetrics text.
pub fn render(s: &Snapshot) -> Result<String, std::fmt::Error> {
    let mut reg = Registry::with_prefix("cuslice");
    let mem_used = G::default();
    let mem_limit = G::default();
    let mem_peak = G::default();
    let refused = Family::<MemLabels, Counter>::default();
    let proc_used = Family::<ProcLabels, Gauge>::default();
    for c in &s.containers {
        for d in &c.devices {
            let l = MemLabels {
                gpu: d.uuid.clone(),
                segment: c.segment.clone(),
            };
            mem_used.get_or_create(&l).set(d.used_bytes as i64);
            mem_peak.get_or_create(&l).set(d.peak_bytes as i64);
            refused.get_or_create(&l).inc_by(d.refused);
            if let Some(q) = d.limit_bytes {
                mem_limit.get_or_create(&l).set(q as i64);
            }
        }
        for p in c.processes.iter().filter(|p| p.alive) {
            for (gpu, b) in &p.used_bytes {
                let l = ProcLabels {
                    gpu: gpu.clone(),
                    segment: c.segment.clone(),
                    pid: p.pid.to_string(),
                };
                proc_used.get_or_create(&l).set(*b as i64);
            }
        }
    }
    reg.register(
        "memory_used_bytes",
        "Device memory a container's processes hold on a GPU",
        mem_used,
    );
    reg.register(
        "memory_limit_bytes",
        "A container's memory quota on a GPU (absent: no quota)",
        mem_limit,
    );
    reg.register(
        "memory_peak_bytes",
        "Highest memory_used_bytes since the segment was created",
        mem_peak,
    );
    reg.register(
        "memory_refused",
        "Allocations refused by the quota",
        refused,
    );
    reg.register(
        "process_memory_used_bytes",
        "Device memory one live process holds on a GPU",
        proc_used,
    );

    let used = Family::<TenantLabels, F64Counter>::default();
    let throttled = Family::<TenantLabels, F64Counter>::default();
    let share = Family::<TenantLabels, Gauge>::default();
    let ceiling = Family::<TenantLabels, Gauge>::default();
    let procs = Family::<TenantLabels, Gauge>::default();
    let waiting = Family::<TenantLabels, Gauge>::default();
    let latency = Family::<TenantLabels, Gauge>::default();
    let heavy = Family::<TenantLabels, Gauge>::default();
    let demand = Family::<TenantLabels, Gauge<f64, AtomicU64>>::default();
    for g in &s.gpus {
        for t in &g.tenants {
            let l = TenantLabels {
                gpu: g.uuid.clone(),
                tenant: t.name.clone(),
            };
            used.get_or_create(&l).inc_by(t.gpu_time_seconds);
            throttled.get_or_create(&l).inc_by(t.throttled_seconds);
            share.get_or_create(&l).set(t.share_percent as i64);
            ceiling
                .get_or_create(&l)
                .set(t.ceiling_percent.unwrap_or(100) as i64);
            procs.get_or_create(&l).set(t.processes as i64);
            waiting.get_or_create(&l).set(t.waiting as i64);
            latency
                .get_or_create(&l)
                .set(i64::from(t.class == "latency"));
            heavy.get_or_create(&l).set(i64::from(t.mode == "lease"));
            demand.get_or_create(&l).set(t.demand_percent);
        }
    }
    reg.register("compute_used_seconds", "GPU time charged to a tenant", used);
    reg.register(
        "compute_throttled_seconds",
        "Time a tenant's processes waited for the GPU",
        throttled,
    );
    reg.register(
        "compute_share_percent",
        "A tenant's guaranteed share of GPU time",
        share,
    );
    reg.register(
        "compute_ceiling_percent",
        "A tenant's ceiling on GPU time (100: none)",
        ceiling,
    );
    reg.register(
        "compute_processes",
        "Live processes of a tenant on a GPU",
        procs,
    );
    reg.register(
        "compute_waiting_processes",
        "Processes of a tenant waiting for the GPU",
        waiting,
    );
    reg.register(
        "compute_latency_class",
        "1 if the tenant is latency-sensitive (others hold back while its work is in flight)",
        latency,
    );
    reg.register(
        "compute_lease_mode",
        "1 if the tenant competes for a saturated GPU through the lease, 0 if it launches freely",
        heavy,
    );
    reg.register(
        "compute_demand_percent",
        "GPU time charged to the tenant per wall time over its last demand window",
        demand,
    );

    let mut out = String::new();
    encode(&mut out, &reg)?;
    Ok(out)
}

/// Serves `GET /metrics` on `listen` until killed. Prints the bound address.
pub fn serve(listen: &str, src: &Sources) -> Result<(), String> {
    let server = tiny_http::Server::http(listen).map_err(|e| format!("--listen {listen}: {e}"))?;
    println!(
        "cuslice exporter listening on http://{}/metrics",
        server.server_addr()
    );
    for req in server.incoming_requests() {
        let resp = if req.url() == "/metrics" {
            match render(&snapshot(src)) {
                Ok(body) => tiny_http::Response::from_string(body).with_header(
                    tiny_http::Header::from_bytes(
                        &b"Content-Type"[..],
                        &b"application/openmetrics-text; version=1.0.0; charset=utf-8"[..],
                    )
                    .map_err(|_| "bad header".to_string())?,
                ),
                Err(e) => tiny_http::Response::from_string(format!("cannot encode metrics: {e}"))
                    .with_status_code(500),
            }
        } else {
            tiny_http::Response::from_string("cuslice exporter: try /metrics\n")
                .with_status_code(404)
        };
        let _ = req.respond(resp);
    }
    Ok(())
}
