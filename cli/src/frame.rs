//! The table `cuslice top` shows and `cuslice status` prints: per GPU a
//! header line from NVML, then one row per tenant. Columns fit the width
//! given (the terminal's): the tenant and what it runs share what the fixed
//! columns leave, and every line is cut to the width, so that nothing
//! wraps (80 columns included).

use crate::view::{GpuView, Snapshot, TenantView};
use cuslice_host::gpu::health::State;
use cuslice_host::gpu::health::judge::{ago, utc};

/// One line of a frame. `dim`: a tenant with no live process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub text: String,
    pub dim: bool,
}

impl Line {
    fn plain(text: String) -> Line {
        Line { text, dim: false }
    }
}

const MEM_W: usize = 11;
const SHARE_W: usize = 5;
const MAX_W: usize = 4;
const MODE_W: usize = 5;
const PCT_W: usize = 5;
const PROCS_W: usize = 5;
/// From this width on, the class is written out (`latency`, `standard`).
const WIDE: usize = 100;

/// `s` cut to `w` characters, ending in `…` if it was longer.
pub fn fit(s: &str, w: usize) -> String {
    if s.chars().count() <= w {
        return s.to_string();
    }
    if w == 0 {
        return String::new();
    }
    let mut out: String = s.chars().take(w - 1).collect();
    out.push('…');
    out
}

/// A size in at most 5 characters: `512M`, `3.2G`, `80G`.
pub fn short_size(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "K", "M", "G", "T", "P"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b}B")
    } else if v < 9.95 {
        format!("{v:.1}{}", UNITS[i])
    } else {
        format!("{v:.0}{}", UNITS[i])
    }
}

fn pct(p: Option<f64>) -> String {
    match p {
        None => "-".into(),
        Some(p) if p >= 999.95 => format!("{p:.0}"),
        Some(p) => format!("{p:.1}"),
    }
}

/// Whether some of a tenant's GPU % is an upper bound nothing checked.
fn unverified(t: &TenantView) -> bool {
    t.unverified_percent.is_some_and(|u| u >= 0.05)
}

/// The GPU % cell: `<` before a figure that is partly an upper bound
/// nothing checked (`TenantView::unverified_percent`).
fn gpu_pct(t: &TenantView) -> String {
    let p = pct(t.gpu_percent);
    if unverified(t) { format!("<{p}") } else { p }
}

/// Used/quota; with a guarantee below the quota, used/guarantee-max; with
/// part of the guarantee still lent out to others' bursts, `(-pending)`
/// after it.
fn memory(t: &TenantView) -> String {
    match (t.memory_used_bytes, t.memory_limit_bytes) {
        (None, None) => "-".into(),
        (u, l) => format!(
            "{}/{}{}{}",
            u.map_or("-".into(), short_size),
            t.memory_guarantee_bytes
                .map_or(String::new(), |g| format!("{}-", short_size(g))),
            l.map_or("-".into(), short_size),
            t.memory_pending_bytes
                .filter(|p| *p > 0)
                .map_or(String::new(), |p| format!("(-{})", short_size(p)))
        ),
    }
}

struct Cols {
    tenant: usize,
    runs: usize,
    class: usize,
}

fn columns(width: usize, tenants: &[&TenantView]) -> Cols {
    let class = if width >= WIDE { 8 } else { 5 };
    // Indent, the fixed columns, and a space before each of the 9 columns
    // after the first.
    let fixed = 2 + MEM_W + SHARE_W + MAX_W + class + MODE_W + 2 * PCT_W + PROCS_W + 9;
    let avail = width.saturating_sub(fixed).max(16);
    let want_t = tenants
        .iter()
        .map(|t| t.name.chars().count())
        .max()
        .unwrap_or(0)
        .max(6);
    let want_r = tenants
        .iter()
        .map(|t| t.runs.chars().count())
        .max()
        .unwrap_or(0)
        .max(4);
    let tenant = if want_t.saturating_add(want_r) <= avail {
        want_t
    } else {
        want_t.min((avail * 2 / 5).max(8))
    };
    let runs = avail.saturating_sub(tenant).min(want_r);
    Cols {
        tenant,
        runs,
        class,
    }
}

fn row(c: &Cols, cells: [&str; 10]) -> String {
    let [t, r, m, s, x, k, o, g, h, p] = cells;
    format!(
        "  {:<tw$} {:<rw$} {:>MEM_W$} {:>SHARE_W$} {:>MAX_W$} {:<cw$} {:<MODE_W$} {:>PCT_W$} {:>PCT_W$} {:>PROCS_W$}",
        fit(t, c.tenant),
        fit(r, c.runs),
        m,
        s,
        x,
        k,
        o,
        g,
        h,
        p,
        tw = c.tenant,
        rw = c.runs,
        cw = c.class,
    )
}

fn gpu_header(g: &GpuView) -> String {
    let mut parts = vec![];
    match g.index {
        Some(i) => parts.push(format!("GPU {i}")),
        None => parts.push("GPU".into()),
    }
    // Early in the line: `top` cuts it to the terminal's width.
    if let Some(h) = &g.health {
        parts.push(match h.health.state {
            State::Healthy => "healthy".into(),
            s => s.name().to_uppercase(),
        });
    }
    if let Some(n) = &g.name {
        parts.push(n.clone());
    }
    if let (Some(u), Some(t)) = (g.memory_used_bytes, g.memory_total_bytes) {
        parts.push(format!("mem {}/{}", short_size(u), short_size(t)));
    }
    if let Some(u) = g.utilization_percent {
        parts.push(format!("util {u}%"));
    }
    parts.push(g.uuid.clone());
    if g.segment.is_some() {
        parts.push(format!("{} hand-overs", g.handovers));
    }
    parts.join("  ")
}

/// Under a GPU that is not healthy: `  ! unhealthy since ... (3m12s):
/// why`.
fn health_line(g: &GpuView) -> Option<String> {
    let h = g
        .health
        .as_ref()
        .filter(|h| h.health.state != State::Healthy)?;
    let now = cuslice_host::watch_state::now_unix();
    Some(format!(
        "  ! {} since {} ({}){}: {}{}",
        h.health.state,
        utc(h.health.since_unix),
        ago(now - h.health.since_unix),
        if h.health.lost { ", lost" } else { "" },
        h.health.reason.as_deref().unwrap_or("-"),
        if h.judged_by == "look" {
            " [one look now]"
        } else {
            ""
        }
    ))
}

/// Whose judgement the GPUs' health is: the health source's (and whether
/// it is up), or why each is this reading's own look.
pub fn health_source_line(h: &crate::view::HealthSource) -> String {
    match (&h.source, &h.note) {
        (Some(s), None) => format!(
            "health: {} pid {} {}, last wrote {} ago",
            s.writer,
            s.pid,
            if s.up { "up" } else { "DOWN" },
            ago(s.updated_seconds_ago)
        ),
        (_, Some(n)) => format!("health: {n}"),
        (None, None) => "health: -".into(),
    }
}

/// The frame: `title` (`cuslice top`), the host and counts, the NVML note,
/// then per GPU its header and its tenants, and (`with_errors`) a line per
/// segment that could not be read; every line at most `width` characters
/// (`usize::MAX`: no limit).
pub fn frame(s: &Snapshot, title: &str, width: usize, with_errors: bool) -> Vec<Line> {
    let tenants: Vec<&TenantView> = s.gpus.iter().flat_map(|g| &g.tenants).collect();
    let live = tenants.iter().filter(|t| t.live).count();
    let mut out = vec![];
    let mut head = format!(
        "{title}  {}  {} tenant{}, {live} live",
        s.hostname,
        tenants.len(),
        if tenants.len() == 1 { "" } else { "s" }
    );
    if let Some(i) = s.interval_seconds {
        head.push_str(&format!("  over {i:.1}s"));
    }
    out.push(Line::plain(head));
    if let Some(e) = &s.nvml_error {
        out.push(Line::plain(format!(
            "NVML not available ({e}): no GPU header"
        )));
    }
    if s.gpus.is_empty() {
        out.push(Line::plain("no GPU and no cuslice segment found".into()));
    }
    let c = columns(width, &tenants);
    let long = c.class == 8;
    for g in &s.gpus {
        out.push(Line::plain(gpu_header(g)));
        if let Some(l) = health_line(g) {
            out.push(Line::plain(l));
        }
        if g.tenants.is_empty() {
            out.push(Line::plain("  (no tenants)".into()));
            continue;
        }
        out.push(Line::plain(row(
            &c,
            [
                "TENANT", "RUNS", "MEMORY", "SHARE", "MAX", "CLASS", "MODE", "GPU%", "THR%",
                "PROCS",
            ],
        )));
        for t in &g.tenants {
            let class = match (t.class, long) {
                (None, _) => "-",
                (Some(k), true) => k,
                (Some("latency"), false) => "lat",
                (Some(_), false) => "std",
            };
            let procs = if t.live {
                t.processes.to_string()
            } else {
                "ended".into()
            };
            out.push(Line {
                text: row(
                    &c,
                    [
                        &t.name,
                        &t.runs,
                        &memory(t),
                        &t.share_percent.map_or("-".into(), |p| format!("{p}%")),
                        &t.ceiling_percent.map_or("-".into(), |p| format!("{p}%")),
                        class,
                        t.mode.unwrap_or("-"),
                        &gpu_pct(t),
                        &pct(t.throttled_percent),
                        &procs,
                    ],
                ),
                dim: !t.live,
            });
        }
        if g.tenants.iter().any(unverified) {
            out.push(Line::plain(format!(
                "  <: at most: wall time in flight that nothing measured, unchecked ({})",
                g.process_time_error
                    .as_deref()
                    .or(s.nvml_error.as_ref().map(|_| "no NVML"))
                    .unwrap_or("unknown")
            )));
        }
    }
    if let Some(h) = &s.health {
        out.push(Line::plain(health_source_line(h)));
    }
    if let Some(w) = &s.watch {
        out.extend(watch_lines(w).into_iter().map(Line::plain));
    }
    if with_errors {
        for e in &s.errors {
            out.push(Line::plain(format!("error: {e}")));
        }
    }
    for l in &mut out {
        l.text = fit(l.text.trim_end(), width);
    }
    out
}

/// The watch's line and one row per active finding: `! KIND TENANT:
/// what: action`.
pub fn watch_lines(w: &crate::view::WatchView) -> Vec<String> {
    let st = &w.state;
    let mut out = vec![format!(
        "watch: {}  policy {}  repair {}  every {}s  last pass {:.1}s ago  {} finding{}",
        if w.up { "up" } else { "DOWN" },
        st.policy,
        if st.repair { "on" } else { "off" },
        st.interval_seconds,
        w.last_pass_seconds_ago,
        st.findings.len(),
        if st.findings.len() == 1 { "" } else { "s" }
    )];
    for f in &st.findings {
        out.push(format!(
            "  ! {:<14} {}: {}: {}",
            f.kind.name(),
            f.tenant,
            f.what,
            f.action
        ));
    }
    out
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// What `cuslice status` prints after the frame: per memory segment, its
/// tenant, what it runs, its usage per GPU and its processes; then the
/// segments that could not be read. Not cut to any width (a script may
/// read it).
pub fn details(s: &Snapshot) -> String {
    let mut out = String::new();
    for c in &s.containers {
        out.push_str(&format!(
            "container segment {}  (tenant {}{})\n",
            c.segment,
            c.tenant,
            c.container
                .as_ref()
                .map(|m| format!(", container {}", cuslice_host::container::describe(m)))
                .unwrap_or_default()
        ));
        if let Some(l) = c
            .container
            .as_ref()
            .and_then(|m| m.driver_memory_limit.as_ref())
        {
            out.push_str(&format!("  driver memory limit: {l}\n"));
        }
        if let Some(r) = &c.resize {
            out.push_str(&format!(
                "  resized by uid {}: {}; grace {}s\n",
                r.by_uid,
                r.describe(),
                r.grace_seconds
            ));
        }
        for d in &c.devices {
            let grace = match d.grace_left_seconds {
                Some(s) if s > 0.0 => format!("  over its quota after a resize: grace {s:.0}s left"),
                Some(_) => "  over its quota after a resize: grace over, `cuslice watch` applies its policy".into(),
                None => String::new(),
            };
            out.push_str(&format!(
                "  GPU {}  memory {} / {}  (peak {}, refused {}){grace}\n",
                d.uuid,
                gib(d.used_bytes),
                d.limit_bytes.map(gib).unwrap_or_else(|| "no quota".into()),
                gib(d.peak_bytes),
                d.refused
            ));
        }
        for p in &c.processes {
            let used: Vec<String> = p.used_bytes.values().map(|b| gib(*b)).collect();
            out.push_str(&format!(
                "    pid {:<8} {:<5} {}\n",
                p.pid,
                if p.alive { "live" } else { "dead" },
                if used.is_empty() {
                    "-".to_string()
                } else {
                    used.join(", ")
                }
            ));
        }
    }
    for e in &s.errors {
        out.push_str(&format!("error: {e}\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::GpuView;

    fn tenant(name: &str, runs: &str, live: bool) -> TenantView {
        TenantView {
            name: name.into(),
            tag: 0,
            live,
            runs: runs.into(),
            container: None,
            pids: if live { vec![7] } else { vec![] },
            processes: u32::from(live),
            memory_used_bytes: Some(3 << 30),
            memory_limit_bytes: Some(4 << 30),
            memory_guarantee_bytes: None,
            memory_pending_bytes: None,
            memory_burst_bytes: None,
            memory_peak_bytes: None,
            memory_refused: None,
            share_percent: Some(30),
            ceiling_percent: Some(50),
            class: Some("latency"),
            mode: Some("lease"),
            gpu_time_seconds: Some(1.0),
            gpu_seconds: Some(1.0),
            throttled_seconds: Some(0.0),
            gpu_percent: Some(61.25),
            charged_percent: Some(61.25),
            unmeasured_percent: Some(0.0),
            unverified_percent: Some(0.0),
            throttled_percent: Some(1200.0),
            waiting: 0,
            last_active_seconds_ago: Some(0.0),
            ended_seconds_ago: (!live).then_some(3.0),
            demand_percent: Some(0.0),
        }
    }

    fn snap() -> Snapshot {
        Snapshot {
            hostname: "host".into(),
            interval_seconds: Some(1.0),
            linger_seconds: 60.0,
            nvml_error: None,
            gpus: vec![GpuView {
                uuid: "GPU-2890b33c-2519-c446-0a78-e511a9662fcf".into(),
                index: Some(0),
                name: Some("NVIDIA H100 80GB HBM3".into()),
                memory_used_bytes: Some(12 << 30),
                memory_total_bytes: Some(80 << 30),
                utilization_percent: Some(87),
                segment: Some("/run/cuslice/gpu/x.seg".into()),
                handovers: 412,
                process_time_error: None,
                health: None,
                tenants: vec![
                    tenant(
                        "team-a/a-rather-long-trainer-name",
                        "python3 /workspace/train.py --epochs 100 --batch-size 512",
                        true,
                    ),
                    tenant("svc", "vllm serve", false),
                ],
            }],
            containers: vec![],
            errors: vec![],
            watch: None,
            health: None,
        }
    }

    #[test]
    fn the_memory_cell_shows_the_part_of_a_guarantee_still_lent_out() {
        let mut t = tenant("b", "x", true);
        t.memory_used_bytes = Some(1 << 30);
        t.memory_limit_bytes = Some(20 << 30);
        t.memory_pending_bytes = Some(19 << 30);
        let (one, twenty) = (short_size(1 << 30), short_size(20 << 30));
        assert_eq!(
            memory(&t),
            format!("{one}/{twenty}(-{})", short_size(19 << 30))
        );
        t.memory_pending_bytes = Some(0);
        assert_eq!(memory(&t), format!("{one}/{twenty}"));
    }

    #[test]
    fn the_memory_cell_shows_a_guarantee_below_the_quota() {
        let mut t = tenant("a", "x", true);
        t.memory_used_bytes = Some(3 << 30);
        t.memory_limit_bytes = Some(8 << 30);
        assert_eq!(
            memory(&t),
            format!("{}/{}", short_size(3 << 30), short_size(8 << 30))
        );
        t.memory_guarantee_bytes = Some(2 << 30);
        assert_eq!(
            memory(&t),
            format!(
                "{}/{}-{}",
                short_size(3 << 30),
                short_size(2 << 30),
                short_size(8 << 30)
            )
        );
    }

    #[test]
    fn no_line_is_wider_than_the_terminal() {
        for w in [60, 80, 100, 132, 200] {
            let f = frame(&snap(), "cuslice top", w, true);
            for l in &f {
                assert!(l.text.chars().count() <= w, "{w}: {:?}", l.text);
            }
            let rows: Vec<&Line> = f.iter().filter(|l| l.text.contains("3.0G/4.0G")).collect();
            assert_eq!(rows.len(), 2, "{f:?}");
            assert!(!rows[0].dim && rows[1].dim, "{f:?}");
            // Every column fits from 80 columns on; below, lines are cut.
            if w >= 80 {
                assert!(rows[0].text.contains("61.2"), "{w}: {:?}", rows[0].text);
                assert!(rows[0].text.ends_with(" 1"), "{w}: {:?}", rows[0].text);
                assert!(rows[0].text.contains(" 1200 "), "{w}: {:?}", rows[0].text);
                assert!(rows[1].text.ends_with("ended"), "{w}: {:?}", rows[1].text);
            }
        }
        // Wide: names and commands whole, the class written out.
        let f = frame(&snap(), "cuslice top", 200, true);
        assert!(f.iter().any(|l| l.text.contains(
            "team-a/a-rather-long-trainer-name python3 /workspace/train.py --epochs 100 --batch-size 512"
        )));
        assert!(f.iter().any(|l| l.text.contains("latency")));
        let f = frame(&snap(), "cuslice top", 80, true);
        assert!(f.iter().any(|l| l.text.contains(" lat ")), "{f:?}");
        assert!(f.iter().any(|l| l.text.contains("…")), "{f:?}");
    }

    #[test]
    fn sizes_fit_five_characters() {
        assert_eq!(short_size(0), "0B");
        assert_eq!(short_size(512 << 20), "512M");
        assert_eq!(short_size(3 << 30), "3.0G");
        assert_eq!(short_size(80 << 30), "80G");
        assert_eq!(short_size((9.97 * (1u64 << 30) as f64) as u64), "10G");
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("abc", 4), "abc");
    }
}
