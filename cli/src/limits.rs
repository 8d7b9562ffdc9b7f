//! The limits a user gives on the command line (`cuslice run`) or as
//! container annotations (`cuslice oci-hook`), validated once, the same way
//! for both, and turned into quota-file values.

use cuslice_core::config;

/// The limits as given: each an unparsed value.
#[derive(Default, clap::Args)]
pub struct Limits {
    /// Memory quota per GPU: 4GiB, 4096MiB, 4g, 512m or bytes.
    #[arg(long)]
    pub memory: Option<String>,
    /// With --memory (then the guarantee): the most the program may use
    /// while memory no tenant is guaranteed is free (see
    /// docs/memory-quota.md).
    #[arg(long)]
    pub memory_max: Option<String>,
    /// With --memory: how long an allocation refused for want of memory
    /// waits for memory to be freed before it fails (30s, 500ms, 2m).
    #[arg(long)]
    pub memory_wait: Option<String>,
    /// Guaranteed share of GPU time, percent (30 or 30%); time other
    /// tenants leave idle is lent to it.
    #[arg(long)]
    pub compute: Option<String>,
    /// Ceiling on GPU time, percent, even when the GPU is otherwise idle.
    #[arg(long)]
    pub compute_max: Option<String>,
    /// With --compute-max: how long the program, once held back by its
    /// ceiling, then runs at a stretch, in ms (default 200; see
    /// docs/compute-share.md).
    #[arg(long)]
    pub compute_burst_ms: Option<String>,
    /// Latency-sensitive (an inference service): while it has work in
    /// flight, other tenants on the GPU hold back; its GPU time still
    /// counts against --compute / --compute-max (see
    /// docs/compute-share.md).
    #[arg(long)]
    pub latency: bool,
}

/// How errors name a field: `--memory "x"` or `annotation cuslice.io/memory="x"`.
pub struct Names {
    pub what: &'static str,
    pub prefix: &'static str,
    pub sep: char,
}

pub const FLAGS: Names = Names {
    what: "",
    prefix: "--",
    sep: ' ',
};

pub const ANNOTATIONS: Names = Names {
    what: "annotation ",
    prefix: "cuslice.io/",
    sep: '=',
};

impl Names {
    fn name(&self, field: &str) -> String {
        format!("{}{field}", self.prefix)
    }

    fn label(&self, field: &str, value: &str) -> String {
        format!("{}{}{field}{}{value:?}", self.what, self.prefix, self.sep)
    }
}

/// The validated limits as quota-file values: (the file's top-level
/// settings, everything else unset; the limits of a limits table such as
/// `[all]`). Values, not text: the caller places them in its file and
/// [`config::QuotaFile`] writes it.
pub fn to_quota(l: &Limits, n: &Names) -> Result<(config::QuotaFile, config::Limits), String> {
    let mut table = config::Limits::default();
    if let Some(m) = &l.memory {
        let bytes = config::parse_size(m).map_err(|e| format!("{}: {e}", n.label("memory", m)))?;
        if !(config::MIN_MEMORY..=config::MAX_MEMORY).contains(&bytes) {
            return Err(format!(
                "{}: expected from 1MiB to 1PiB",
                n.label("memory", m)
            ));
        }
        table.memory = Some(bytes);
    }
    if let Some(x) = &l.memory_max {
        let label = n.label("memory-max", x);
        let bytes = config::parse_size(x).map_err(|e| format!("{label}: {e}"))?;
        let Some(g) = table.memory else {
            return Err(format!(
                "{label}: only applies with {} (the guarantee it may burst past)",
                n.name("memory")
            ));
        };
        if bytes < g || bytes > config::MAX_MEMORY {
            return Err(format!(
                "{label}: expected from {} (the guarantee) to 1PiB",
                n.name("memory")
            ));
        }
        table.memory_max = Some(bytes);
    }
    let pct = |field: &str, v: &Option<String>| -> Result<Option<u8>, String> {
        v.as_deref()
            .map(|s| config::parse_percent(s).map_err(|e| format!("{}: {e}", n.label(field, s))))
            .transpose()
    };
    let (c, m) = (
        pct("compute", &l.compute)?,
        pct("compute-max", &l.compute_max)?,
    );
    if let (Some(c), Some(m)) = (c, m)
        && m < c
    {
        return Err(format!(
            "{}: below {} {c}%",
            n.label("compute-max", &format!("{m}%")),
            n.name("compute")
        ));
    }
    table.compute = c;
    table.compute_max = m;
    let mut top = config::QuotaFile::default();
    if let Some(w) = &l.memory_wait {
        let label = n.label("memory-wait", w);
        let ms = config::parse_wait(w).map_err(|e| format!("{label}: {e}"))?;
        if l.memory.is_none() {
            return Err(format!(
                "{label}: only applies with {} (it says how long an allocation refused under the quota waits)",
                n.name("memory")
            ));
        }
        top.memory_wait_ms = Some(ms);
    }
    if let Some(b) = &l.compute_burst_ms {
        let ms = config::parse_burst(b)
            .map_err(|e| format!("{}: {e}", n.label("compute-burst-ms", b)))?;
        if m.is_none() {
            return Err(format!(
                "{}: only applies with {} (it shapes how a ceiling is enforced)",
                n.label("compute-burst-ms", b),
                n.name("compute-max")
            ));
        }
        top.compute_burst_ms = Some(ms);
    }
    if l.latency {
        if c.is_none() && m.is_none() {
            return Err(format!(
                "{}{}: only applies with {} or {} (a latency tenant's GPU time counts against its share)",
                n.what,
                n.name("latency"),
                n.name("compute"),
                n.name("compute-max")
            ));
        }
        top.latency = true;
    }
    Ok((top, table))
}
