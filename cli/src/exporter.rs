//! `cuslice exporter`: the figures of `cuslice status` as Prometheus metrics
//! (OpenMetrics text) on `GET /metrics`, read afresh at every scrape.
//!
//! Named and labelled the way NVIDIA's DCGM exporter does, so that a
//! dashboard made for DCGM can add cuslice panels: the unit in the name
//! (`_bytes`, `_seconds`, `_percent`), and on every series `gpu` (NVML's
//! index, as `nvidia-smi` numbers the GPUs), `UUID` (`GPU-...`),
//! `modelName` and `Hostname`; per tenant also `tenant`. Shares over an
//! interval are not exported: they are `rate()` of the counters, over
//! whatever interval the dashboard picks.
//!
//! Label values: the snapshot's strings are escaped already where they
//! were read ([`text::clean`]: no control character, no bidirectional
//! override, one line), and each label value passes through it again here
//! (idempotent) so that no series can carry one whatever its source.
//! `prometheus_client` then writes them per the text exposition format:
//! `\` as `\\`, `"` as `\"`, a newline as `\n` (tested below and in
//! `cli/tests/status.rs`).

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use crate::view::{GpuView, Snapshot, Viewer};
use cuslice_host::text;

type Labels = Vec<(String, String)>;
type G = Family<Labels, Gauge>;
type GF = Family<Labels, Gauge<f64, AtomicU64>>;
type C = Family<Labels, Counter>;
type CF = Family<Labels, Counter<f64, AtomicU64>>;

fn gpu_labels(g: &GpuView, host: &str) -> Labels {
    with(
        vec![],
        &[
            ("gpu", &g.index.map(|i| i.to_string()).unwrap_or_default()),
            ("UUID", &g.uuid),
            ("modelName", g.name.as_deref().unwrap_or_default()),
            ("Hostname", host),
        ],
    )
}

/// `l` and the labels `more`, their values escaped ([`text::clean`]).
fn with(mut l: Labels, more: &[(&str, &str)]) -> Labels {
    l.extend(more.iter().map(|(k, v)| (k.to_string(), text::clean(v))));
    l
}

/// Registers `metric` under `name` (after the `cuslice_` prefix).
fn reg<M: prometheus_client::registry::Metric>(
    r: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) {
    r.register(name, help, metric);
}

/// The metrics of one snapshot, in OpenMetrics text.
pub fn render(s: &Snapshot) -> Result<String, std::fmt::Error> {
    let mut r = Registry::with_prefix("cuslice");
    let host = s.hostname.as_str();

    let gpu_used = G::default();
    let gpu_total = G::default();
    let gpu_util = G::default();
    let handovers = C::default();
    let tenants = G::default();
    let mem_used = G::default();
    let mem_limit = G::default();
    let mem_pending = G::default();
    let mem_burst = G::default();
    let mem_peak = G::default();
    let refused = C::default();
    let proc_used = G::default();
    let used = CF::default();
    let gpu_time = CF::default();
    let throttled = CF::default();
    let share = G::default();
    let ceiling = G::default();
    let procs = G::default();
    let waiting = G::default();
    let latency = G::default();
    let lease = G::default();
    let demand = GF::default();
    let live = G::default();
    let info = G::default();
    let health = G::default();
    let health_since = GF::default();

    let mut by_uuid: BTreeMap<&str, Labels> = BTreeMap::new();
    for g in &s.gpus {
        let l = gpu_labels(g, host);
        by_uuid.insert(&g.uuid, l.clone());
        if let (Some(u), Some(t)) = (g.memory_used_bytes, g.memory_total_bytes) {
            gpu_used.get_or_create(&l).set(u as i64);
            gpu_total.get_or_create(&l).set(t as i64);
        }
        if let Some(u) = g.utilization_percent {
            gpu_util.get_or_create(&l).set(i64::from(u));
        }
        if g.segment.is_some() {
            handovers.get_or_create(&l).inc_by(g.handovers);
        }
        tenants.get_or_create(&l).set(g.tenants.len() as i64);
        if let Some(h) = &g.health {
            health
                .get_or_create(&l)
                .set(i64::from(h.health.state.code()));
            health_since.get_or_create(&l).set(h.health.since_unix);
        }
        for t in &g.tenants {
            let tl = with(l.clone(), &[("tenant", &t.name)]);
            live.get_or_create(&tl).set(i64::from(t.live));
            let c = t.container.as_ref();
            let (ns, pod) = c
                .and_then(|c| c.pod.as_deref())
                .and_then(|p| p.split_once('/'))
                .unwrap_or(("", ""));
            info.get_or_create(&with(
                tl.clone(),
                &[
                    ("runs", &t.runs),
                    ("container", c.and_then(|c| c.name.as_deref()).unwrap_or("")),
                    ("pod", pod),
                    ("namespace", ns),
                    ("image", c.and_then(|c| c.image.as_deref()).unwrap_or("")),
                ],
            ))
            .set(1);
            if let Some(u) = t.memory_used_bytes {
                mem_used.get_or_create(&tl).set(u as i64);
            }
            if let Some(q) = t.memory_limit_bytes {
                mem_limit.get_or_create(&tl).set(q as i64);
            }
            if let Some(p) = t.memory_pending_bytes {
                mem_pending.get_or_create(&tl).set(p as i64);
            }
            if let Some(b) = t.memory_burst_bytes {
                mem_burst.get_or_create(&tl).set(b as i64);
            }
            if let Some(p) = t.memory_peak_bytes {
                mem_peak.get_or_create(&tl).set(p as i64);
            }
            if let Some(n) = t.memory_refused {
                refused.get_or_create(&tl).inc_by(n);
            }
            // The compute figures exist for tenants with a share or a
            // ceiling on this GPU.
            let Some(sh) = t.share_percent else { continue };
            used.get_or_create(&tl)
                .inc_by(t.gpu_time_seconds.unwrap_or(0.0));
            gpu_time
                .get_or_create(&tl)
                .inc_by(t.gpu_seconds.unwrap_or(0.0));
            throttled
                .get_or_create(&tl)
                .inc_by(t.throttled_seconds.unwrap_or(0.0));
            share.get_or_create(&tl).set(i64::from(sh));
            ceiling
                .get_or_create(&tl)
                .set(i64::from(t.ceiling_percent.unwrap_or(100)));
            procs.get_or_create(&tl).set(i64::from(t.processes));
            waiting.get_or_create(&tl).set(i64::from(t.waiting));
            latency
                .get_or_create(&tl)
                .set(i64::from(t.class == Some("latency")));
            lease
                .get_or_create(&tl)
                .set(i64::from(t.mode == Some("lease")));
            demand
                .get_or_create(&tl)
                .set(t.demand_percent.unwrap_or(0.0));
        }
    }
    for c in &s.containers {
        for p in c.processes.iter().filter(|p| p.alive) {
            for (uuid, b) in &p.used_bytes {
                let Some(l) = by_uuid.get(uuid.as_str()) else {
                    continue;
                };
                let pid = p.pid.to_string();
                let l = with(l.clone(), &[("tenant", &c.tenant), ("pid", &pid)]);
                proc_used.get_or_create(&l).set(*b as i64);
            }
        }
    }

    reg(
        &mut r,
        "gpu_memory_used_bytes",
        "Device memory in use on the GPU, all processes (NVML)",
        gpu_used,
    );
    reg(
        &mut r,
        "gpu_memory_total_bytes",
        "Device memory of the GPU (NVML)",
        gpu_total,
    );
    reg(
        &mut r,
        "gpu_utilization_percent",
        "Percent of NVML's last sample period a kernel ran on the GPU",
        gpu_util,
    );
    reg(
        &mut r,
        "gpu_lease_handovers",
        "Hand-overs of the GPU's lease between processes",
        handovers,
    );
    reg(
        &mut r,
        "gpu_tenants",
        "Tenants listed on the GPU (live, or ended within the linger time)",
        tenants,
    );
    reg(
        &mut r,
        "gpu_health",
        "The GPU's health: 0 healthy, 1 degraded (in service, something to see), 2 unhealthy (out of service); cuslice status says why",
        health,
    );
    reg(
        &mut r,
        "gpu_health_since_timestamp_seconds",
        "When the GPU's health last changed (Unix time)",
        health_since,
    );
    reg(
        &mut r,
        "memory_used_bytes",
        "Device memory a tenant's processes hold on a GPU",
        mem_used,
    );
    reg(
        &mut r,
        "memory_limit_bytes",
        "A tenant's memory quota on a GPU (absent: no quota)",
        mem_limit,
    );
    reg(
        &mut r,
        "memory_pending_bytes",
        "The part of a tenant's memory guarantee on a GPU still lent out to tenants that burst before it arrived (taken back as they free)",
        mem_pending,
    );
    reg(
        &mut r,
        "memory_burst_bytes",
        "What a tenant holds past its memory guarantee on a GPU, as the GPU's memory pool says (a borrower)",
        mem_burst,
    );
    reg(
        &mut r,
        "memory_peak_bytes",
        "Highest memory_used_bytes since the tenant's memory segment was created",
        mem_peak,
    );
    reg(
        &mut r,
        "memory_refused",
        "Allocations refused by the tenant's quota",
        refused,
    );
    reg(
        &mut r,
        "process_memory_used_bytes",
        "Device memory one live process holds on a GPU",
        proc_used,
    );
    reg(
        &mut r,
        "compute_used_seconds",
        "GPU time charged to a tenant",
        used,
    );
    reg(
        &mut r,
        "compute_gpu_seconds",
        "GPU time a tenant's kernels ran, as cuslice status counts it: the charge, less the upper bounds NVML's per-process time disproved while this exporter watched",
        gpu_time,
    );
    reg(
        &mut r,
        "compute_throttled_seconds",
        "Time a tenant's processes waited for the GPU, summed over its processes",
        throttled,
    );
    reg(
        &mut r,
        "compute_share_percent",
        "A tenant's guaranteed share of GPU time",
        share,
    );
    reg(
        &mut r,
        "compute_ceiling_percent",
        "A tenant's ceiling on GPU time (100: none)",
        ceiling,
    );
    reg(
        &mut r,
        "compute_processes",
        "Live processes of a tenant with a compute share",
        procs,
    );
    reg(
        &mut r,
        "compute_waiting_processes",
        "Processes of a tenant waiting for the GPU",
        waiting,
    );
    reg(
        &mut r,
        "compute_latency_class",
        "1 if the tenant is latency-sensitive (others hold back while its work is in flight)",
        latency,
    );
    reg(
        &mut r,
        "compute_lease_mode",
        "1 if the tenant competes for a saturated GPU through the lease, 0 if it launches freely",
        lease,
    );
    reg(
        &mut r,
        "compute_demand_percent",
        "GPU time charged to the tenant per wall time over its last demand window",
        demand,
    );
    reg(
        &mut r,
        "tenant_live",
        "1 while a process of the tenant is alive, 0 for an ended tenant still listed",
        live,
    );
    reg(
        &mut r,
        "tenant_info",
        "What a tenant runs: container name, pod, namespace and image where its runtime gives them, else its command",
        info,
    );

    if let Some(src) = s.health.as_ref().and_then(|h| h.source.as_ref()) {
        let h = with(vec![], &[("Hostname", host)]);
        let up = G::default();
        up.get_or_create(&h).set(i64::from(src.up));
        reg(
            &mut r,
            "health_source_up",
            "1 while the GPU health source (cuslice watch, cuslice health follow or the DRA plugin) runs and published lately",
            up,
        );
    }
    if let Some(w) = &s.watch {
        let h = with(vec![], &[("Hostname", host)]);
        let up = G::default();
        up.get_or_create(&h).set(i64::from(w.up));
        reg(
            &mut r,
            "watch_up",
            "1 while cuslice watch runs and its last pass is recent",
            up,
        );
        let last = GF::default();
        last.get_or_create(&h).set(w.state.last_pass_unix);
        reg(
            &mut r,
            "watch_last_pass_timestamp_seconds",
            "When cuslice watch last looked (Unix time)",
            last,
        );
        let cpu = CF::default();
        cpu.get_or_create(&h).inc_by(w.state.cpu_seconds);
        reg(
            &mut r,
            "watch_cpu_seconds",
            "CPU time cuslice watch has used",
            cpu,
        );
        let total = C::default();
        for c in &w.state.counts {
            total
                .get_or_create(&with(
                    h.clone(),
                    &[("kind", c.kind.name()), ("tenant", &c.tenant)],
                ))
                .inc_by(c.count);
        }
        reg(
            &mut r,
            "watch_findings",
            "Findings of cuslice watch that started, by kind and tenant",
            total,
        );
        let active = G::default();
        for f in &w.state.findings {
            active
                .get_or_create(&with(
                    h.clone(),
                    &[("kind", f.kind.name()), ("tenant", &f.tenant)],
                ))
                .inc();
        }
        reg(
            &mut r,
            "watch_active_findings",
            "Findings of cuslice watch active at its last pass, by kind and tenant",
            active,
        );
    }

    let mut out = String::new();
    encode(&mut out, &r)?;
    Ok(out)
}

/// Serves `GET /metrics` on `listen` until killed. Prints the bound address.
pub fn serve(listen: &str, mut obs: Viewer) -> Result<(), String> {
    let server = tiny_http::Server::http(listen).map_err(|e| format!("--listen {listen}: {e}"))?;
    println!(
        "cuslice exporter listening on http://{}/metrics",
        server.server_addr()
    );
    for req in server.incoming_requests() {
        let resp = if req.url() == "/metrics" {
            match render(&obs.read()) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::TenantView;

    fn tenant(name: &str, runs: &str) -> TenantView {
        TenantView {
            name: name.into(),
            live: true,
            runs: runs.into(),
            pids: vec![7],
            processes: 1,
            memory_used_bytes: Some(1 << 30),
            ..TenantView::default()
        }
    }

    /// Label values with `"`, `\` and a newline, even ones that did not
    /// come through the snapshot's escaping, are written per the text
    /// format, each sample on one line.
    #[test]
    fn label_values_are_escaped_per_the_exposition_format() {
        let s = Snapshot {
            hostname: "host".into(),
            interval_seconds: None,
            linger_seconds: 60.0,
            nvml_error: None,
            gpus: vec![GpuView {
                uuid: "GPU-x".into(),
                index: Some(0),
                name: Some("GPU \"model\"".into()),
                memory_used_bytes: None,
                memory_total_bytes: None,
                utilization_percent: None,
                segment: None,
                handovers: 0,
                process_time_error: None,
                health: None,
                tenants: vec![tenant(
                    "a\"b\\c\nd",
                    "run\n# EOF\ncuslice_tenant_live{tenant=\"x\"} 1\x1b[2J\r",
                )],
            }],
            containers: vec![],
            errors: vec![],
            watch: None,
            health: None,
        };
        let out = render(&s).expect("render");
        let gpu = r#"gpu="0",UUID="GPU-x",modelName="GPU \"model\"",Hostname="host""#;
        assert!(
            out.contains(&format!(
                r#"cuslice_memory_used_bytes{{{gpu},tenant="a\"b\\c\\nd"}} 1073741824"#
            )),
            "{out}"
        );
        assert!(
            out.contains(r#"runs="run\\n# EOF\\ncuslice_tenant_live{tenant=\"x\"} 1\\x1b[2J\\r""#),
            "{out}"
        );
        assert!(!out.contains(['\x1b', '\r']), "{out}");
        assert_eq!(out.matches("# EOF").count(), 2, "{out}");
        assert!(out.ends_with("# EOF\n"), "{out}");
        for l in out.lines() {
            assert!(
                l.starts_with('#') || l.starts_with("cuslice_"),
                "{l:?} in:\n{out}"
            );
        }
    }
}
