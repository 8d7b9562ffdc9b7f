//! `/etc/cuslice/watch.toml`: the watchdog's host policy. Parsed strictly,
//! like the quota file: an unknown key or a bad value is one line naming
//! the file, the key, what was expected and what was found; a missing file
//! means every default. Command-line flags override the file.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cuslice_core::config::{format_size, parse_size};

use cuslice_host::gpu::health::source as health_source;

pub const DEFAULT_CONFIG: &str = "/etc/cuslice/watch.toml";

/// What the watch does about a finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Policy {
    /// Log it, count it, show it; touch nothing.
    Report,
    /// SIGKILL the offending processes (memory: the newest first until the
    /// container is back under its quota).
    Kill,
    /// SIGSTOP a slice that takes more GPU time than it may, for
    /// `freeze_seconds`, then SIGCONT (memory and unregistered findings are
    /// reported).
    Freeze,
}

impl Policy {
    pub fn name(self) -> &'static str {
        match self {
            Policy::Report => "report",
            Policy::Kill => "kill",
            Policy::Freeze => "freeze",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct WatchConfig {
    /// Time between passes.
    pub interval: Duration,
    pub policy: Policy,
    /// Restore tampered segments (GPU segments: the lead's `repair`; memory
    /// segments: the per-GPU limit from the quota file).
    pub repair: bool,
    /// Device memory a container may use beyond its quota on a GPU, for the
    /// driver's own rounding and what the shim does not count.
    pub memory_tolerance: u64,
    /// And per process of it listed on that GPU (what a CUDA context or
    /// loaded kernels cost beyond the quota file's `context_overhead`).
    pub process_allowance: u64,
    /// Percentage points of GPU time over a ceiling or share before a
    /// tenant is held to have taken more.
    pub compute_margin: u32,
    /// Passes in a row a compute overuse must last.
    pub compute_sustain: u32,
    /// Percent of an interval another tenant must have waited for the GPU
    /// (its throttled time) to count as waiting.
    pub compute_wait: u32,
    /// How long `freeze` stops a slice.
    pub freeze: Duration,
    /// The hook's host directory (containers/, gpu/, watch/, health/).
    pub root: PathBuf,
    /// Run the GPU health source (`health`, default true): its cadence
    /// (`health_poll`, `health_check`) and quiet period (`health_quiet`).
    pub health: bool,
    pub health_poll: Duration,
    pub health_check: Duration,
    pub health_quiet: Duration,
    /// How long a guarantee root registered in a GPU memory pool (the
    /// hook's, the DRA plugin's) may have no container or claim of it on
    /// the host before the watch releases it (its maker vanished without
    /// poststop or unprepare): longer than the instant between the hook's
    /// registration and its record.
    pub orphan_grace: Duration,
}

impl Default for WatchConfig {
    fn default() -> Self {
        WatchConfig {
            interval: Duration::from_secs(1),
            policy: Policy::Report,
            repair: true,
            memory_tolerance: 64 << 20,
            process_allowance: 64 << 20,
            compute_margin: 10,
            compute_sustain: 2,
            compute_wait: 10,
            freeze: Duration::from_secs(5),
            root: PathBuf::from(cuslice_host::layout::DEFAULT_ROOT),
            health: true,
            health_poll: health_source::DEFAULT_POLL,
            health_check: health_source::DEFAULT_CHECK,
            health_quiet: health_source::DEFAULT_QUIET,
            orphan_grace: Duration::from_secs(60),
        }
    }
}

const KEYS: [&str; 15] = [
    "interval",
    "policy",
    "repair",
    "memory_tolerance",
    "process_allowance",
    "compute_margin",
    "compute_sustain",
    "compute_wait",
    "freeze_seconds",
    "root",
    "health",
    "health_poll",
    "health_check",
    "health_quiet",
    "orphan_grace",
];

const MIN_INTERVAL: Duration = Duration::from_millis(10);
const MAX_INTERVAL: Duration = Duration::from_secs(3600);

/// `1s`, `200ms`, `0.5s`, or a number of seconds; 10 ms to 1 h.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else {
        (t, 1.0)
    };
    let v: f64 = num
        .trim()
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite())
        .ok_or_else(|| format!("expected a duration like 1s or 200ms, got {s:?}"))?;
    let d = Duration::from_secs_f64((v * scale).clamp(0.0, 1e9));
    if d < MIN_INTERVAL || d > MAX_INTERVAL {
        return Err(format!(
            "expected a duration from 10ms to 1h (like 1s or 200ms), got {s:?}"
        ));
    }
    Ok(d)
}

fn shown(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => format!("{s:?}"),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => format!("{f:?}"),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Datetime(d) => format!("a date-time {d}"),
        toml::Value::Array(_) => "an array".into(),
        toml::Value::Table(_) => "a table".into(),
    }
}

fn duration_value(v: &toml::Value) -> Result<Duration, String> {
    match v {
        toml::Value::String(s) => parse_duration(s),
        toml::Value::Integer(i) => parse_duration(&i.to_string()),
        toml::Value::Float(f) => parse_duration(&f.to_string()),
        v => Err(format!(
            "expected a duration like 1s or 200ms, got {}",
            shown(v)
        )),
    }
}

/// A health cadence: a duration like `5s` or `10m`, or seconds, within
/// `bounds`.
fn health_duration(v: &toml::Value, bounds: (Duration, Duration)) -> Result<Duration, String> {
    match v {
        toml::Value::String(s) => health_source::parse_duration(s, bounds),
        toml::Value::Integer(i) => health_source::parse_duration(&i.to_string(), bounds),
        toml::Value::Float(f) => health_source::parse_duration(&f.to_string(), bounds),
        v => health_source::parse_duration(&shown(v), bounds),
    }
}

fn size_value(v: &toml::Value) -> Result<u64, String> {
    let s = match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(i) if *i >= 0 => i.to_string(),
        v => return Err(format!("expected a size like 64MiB, got {}", shown(v))),
    };
    let b = parse_size(&s).map_err(|_| format!("expected a size like 64MiB, got {s:?}"))?;
    if b > 1 << 40 {
        return Err(format!("expected a size of at most 1TiB, got {s:?}"));
    }
    Ok(b)
}

fn int_value(v: &toml::Value, lo: i64, hi: i64, what: &str) -> Result<u32, String> {
    match v {
        toml::Value::Integer(i) if (lo..=hi).contains(i) => Ok(*i as u32),
        v => Err(format!(
            "expected {what} from {lo} to {hi}, got {}",
            shown(v)
        )),
    }
}

pub fn policy_value(s: &str) -> Result<Policy, String> {
    match s {
        "report" => Ok(Policy::Report),
        "kill" => Ok(Policy::Kill),
        "freeze" => Ok(Policy::Freeze),
        _ => Err(format!("expected report, kill or freeze, got {s:?}")),
    }
}

/// Parses watch.toml's text (`path` for messages). Errors are one line:
/// `PATH: KEY: expected ..., got ...`.
pub fn parse(path: &Path, text: &str) -> Result<WatchConfig, String> {
    let at = |m: String| format!("{}: {m}", path.display());
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| at(cuslice_core::config::toml_syntax_error(text, &e)))?;
    let mut c = WatchConfig::default();
    for (k, v) in &table {
        let r: Result<(), String> = match k.as_str() {
            "interval" => duration_value(v).map(|d| c.interval = d),
            "policy" => match v {
                toml::Value::String(s) => policy_value(s).map(|p| c.policy = p),
                v => Err(format!("expected report, kill or freeze, got {}", shown(v))),
            },
            "repair" => match v {
                toml::Value::Boolean(b) => {
                    c.repair = *b;
                    Ok(())
                }
                v => Err(format!("expected true or false, got {}", shown(v))),
            },
            "memory_tolerance" => size_value(v).map(|b| c.memory_tolerance = b),
            "process_allowance" => size_value(v).map(|b| c.process_allowance = b),
            "compute_margin" => {
                int_value(v, 0, 100, "percentage points").map(|n| c.compute_margin = n)
            }
            "compute_sustain" => {
                int_value(v, 1, 100, "a number of passes").map(|n| c.compute_sustain = n)
            }
            "compute_wait" => {
                int_value(v, 1, 100, "a percentage of the interval").map(|n| c.compute_wait = n)
            }
            "freeze_seconds" => match v {
                toml::Value::Integer(i) if (1..=3600).contains(i) => {
                    c.freeze = Duration::from_secs(*i as u64);
                    Ok(())
                }
                v => Err(format!(
                    "expected whole seconds from 1 to 3600, got {}",
                    shown(v)
                )),
            },
            "root" => match v {
                toml::Value::String(s) if Path::new(s).is_absolute() && !s.contains('\0') => {
                    c.root = PathBuf::from(s);
                    Ok(())
                }
                v => Err(format!(
                    "expected an absolute path like /run/cuslice, got {}",
                    shown(v)
                )),
            },
            "health" => match v {
                toml::Value::Boolean(b) => {
                    c.health = *b;
                    Ok(())
                }
                v => Err(format!("expected true or false, got {}", shown(v))),
            },
            "health_poll" => {
                health_duration(v, health_source::POLL_BOUNDS).map(|d| c.health_poll = d)
            }
            "health_check" => {
                health_duration(v, health_source::CHECK_BOUNDS).map(|d| c.health_check = d)
            }
            "health_quiet" => {
                health_duration(v, health_source::QUIET_BOUNDS).map(|d| c.health_quiet = d)
            }
            "orphan_grace" => duration_value(v).map(|d| c.orphan_grace = d),
            other => Err(format!(
                "expected one of the keys {}, got unknown key {other:?}",
                KEYS.join(", ")
            )),
        };
        r.map_err(|m| {
            if KEYS.contains(&k.as_str()) {
                at(format!("{k}: {m}"))
            } else {
                at(m)
            }
        })?;
    }
    Ok(c)
}

/// Reads the file (absent: the defaults, unless it was named explicitly).
pub fn load(path: &Path, explicit: bool) -> Result<WatchConfig, String> {
    match std::fs::read(path) {
        Ok(bytes) => {
            if bytes.len() > 1 << 20 {
                return Err(format!(
                    "{}: expected a file of at most 1MiB",
                    path.display()
                ));
            }
            let text = String::from_utf8(bytes)
                .map_err(|_| format!("{}: expected UTF-8 text", path.display()))?;
            parse(path, &text)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
            Ok(WatchConfig::default())
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

impl WatchConfig {
    /// One line: what the watch runs with.
    pub fn describe(&self) -> String {
        format!(
            "interval {:?}, policy {}, repair {}, memory tolerance {} + {} per process, compute margin {} points over {} passes (others waiting {}% of an interval), freeze {}s, root {}, GPU health {}",
            self.interval,
            self.policy.name(),
            if self.repair { "on" } else { "off" },
            format_size(self.memory_tolerance),
            format_size(self.process_allowance),
            self.compute_margin,
            self.compute_sustain,
            self.compute_wait,
            self.freeze.as_secs(),
            self.root.display(),
            if self.health { "on" } else { "off" }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(text: &str) -> Result<WatchConfig, String> {
        parse(Path::new("/etc/cuslice/watch.toml"), text)
    }

    #[test]
    fn an_empty_file_is_every_default() {
        assert_eq!(p(""), Ok(WatchConfig::default()));
        let d = WatchConfig::default();
        assert_eq!(d.interval, Duration::from_secs(1));
        assert_eq!(d.policy, Policy::Report);
        assert!(d.repair);
        assert_eq!(
            (d.memory_tolerance, d.process_allowance),
            (64 << 20, 64 << 20)
        );
    }

    #[test]
    fn every_key_is_read() {
        let c = p(r#"
interval = "200ms"
policy = "kill"
repair = false
memory_tolerance = "32MiB"
process_allowance = 0
compute_margin = 15
compute_sustain = 3
compute_wait = 20
freeze_seconds = 10
root = "/srv/cuslice"
health = false
health_poll = "2s"
health_check = 60
health_quiet = "10m"
orphan_grace = "30s"
"#)
        .expect("parses");
        assert_eq!(
            c,
            WatchConfig {
                interval: Duration::from_millis(200),
                policy: Policy::Kill,
                repair: false,
                memory_tolerance: 32 << 20,
                process_allowance: 0,
                compute_margin: 15,
                compute_sustain: 3,
                compute_wait: 20,
                freeze: Duration::from_secs(10),
                root: PathBuf::from("/srv/cuslice"),
                health: false,
                health_poll: Duration::from_secs(2),
                health_check: Duration::from_secs(60),
                health_quiet: Duration::from_secs(600),
                orphan_grace: Duration::from_secs(30),
            }
        );
        assert_eq!(
            p("interval = 2").map(|c| c.interval),
            Ok(Duration::from_secs(2))
        );
        assert_eq!(
            p("interval = 0.5").map(|c| c.interval),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(
            p("policy = \"freeze\"").map(|c| c.policy),
            Ok(Policy::Freeze)
        );
    }

    #[test]
    fn bad_lines_name_file_key_and_value() {
        for (text, want) in [
            (
                "polcy = \"kill\"",
                "/etc/cuslice/watch.toml: expected one of the keys interval, policy, repair, memory_tolerance, process_allowance, compute_margin, compute_sustain, compute_wait, freeze_seconds, root, health, health_poll, health_check, health_quiet, orphan_grace, got unknown key \"polcy\"",
            ),
            (
                "policy = \"nuke\"",
                "/etc/cuslice/watch.toml: policy: expected report, kill or freeze, got \"nuke\"",
            ),
            (
                "policy = 1",
                "/etc/cuslice/watch.toml: policy: expected report, kill or freeze, got 1",
            ),
            (
                "interval = \"1 fortnight\"",
                "/etc/cuslice/watch.toml: interval: expected a duration like 1s or 200ms, got \"1 fortnight\"",
            ),
            (
                "interval = \"1ms\"",
                "/etc/cuslice/watch.toml: interval: expected a duration from 10ms to 1h (like 1s or 200ms), got \"1ms\"",
            ),
            (
                "repair = \"yes\"",
                "/etc/cuslice/watch.toml: repair: expected true or false, got \"yes\"",
            ),
            (
                "memory_tolerance = \"lots\"",
                "/etc/cuslice/watch.toml: memory_tolerance: expected a size like 64MiB, got \"lots\"",
            ),
            (
                "compute_margin = 101",
                "/etc/cuslice/watch.toml: compute_margin: expected percentage points from 0 to 100, got 101",
            ),
            (
                "compute_sustain = 0",
                "/etc/cuslice/watch.toml: compute_sustain: expected a number of passes from 1 to 100, got 0",
            ),
            (
                // 0 would count every tenant under its share, an idle one
                // included, as waiting.
                "compute_wait = 0",
                "/etc/cuslice/watch.toml: compute_wait: expected a percentage of the interval from 1 to 100, got 0",
            ),
            (
                "freeze_seconds = \"5\"",
                "/etc/cuslice/watch.toml: freeze_seconds: expected whole seconds from 1 to 3600, got \"5\"",
            ),
            (
                "root = \"run/cuslice\"",
                "/etc/cuslice/watch.toml: root: expected an absolute path like /run/cuslice, got \"run/cuslice\"",
            ),
            (
                "health = 1",
                "/etc/cuslice/watch.toml: health: expected true or false, got 1",
            ),
            (
                "health_quiet = \"0.5s\"",
                "/etc/cuslice/watch.toml: health_quiet: expected a duration from 1s to 604800s (like 5s, 500ms, 10m, 1h), got \"0.5s\"",
            ),
            (
                "health_poll = true",
                "/etc/cuslice/watch.toml: health_poll: expected a duration from 100ms to 60s (like 5s, 500ms, 10m, 1h), got \"true\"",
            ),
        ] {
            assert_eq!(p(text), Err(want.to_string()), "{text}");
        }
        let e = p("interval = ").expect_err("syntax");
        assert!(
            e.starts_with("/etc/cuslice/watch.toml: line 1: TOML syntax error: "),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn a_missing_file_is_the_defaults_unless_named() {
        let missing = Path::new("/nonexistent/cuslice/watch.toml");
        assert_eq!(load(missing, false), Ok(WatchConfig::default()));
        let e = load(missing, true).expect_err("named");
        assert!(e.starts_with("/nonexistent/cuslice/watch.toml: "), "{e}");
    }
}
