//! The quota file written: [`QuotaFile`] builds one from typed values (the
//! OCI hook's, the DRA plugin's, `cuslice run`'s), [`QuotaEdit`] changes
//! one limit of an existing one and keeps the rest (`cuslice resize`, the
//! DRA plugin keeping a resize). Both render TOML under one comment line
//! saying who wrote it, and check the text with the reader
//! ([`parse_file`]) before handing it out: a file cuslice writes loads,
//! and one the shim would refuse is refused here with the reader's one
//! line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use super::file::{parse_file, toml_syntax_error};
use super::types::{Config, ConfigError, Limits};
use super::units::format_uuid;

/// A quota file to write, field by field as [`Config`] reads them back.
/// Unset fields are left out of the file (the reader's defaults apply);
/// `latency` is written only when true, `[all]` only when it sets a limit,
/// each device entry always (an empty one limits nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QuotaFile {
    pub tenant: Option<String>,
    pub slice: Option<String>,
    /// An absolute path, as text (a quota file holds text: the caller
    /// decides what a path that is not UTF-8 means).
    pub segment_dir: Option<String>,
    pub gpu_segment_dir: Option<String>,
    /// Bytes.
    pub context_overhead: Option<u64>,
    pub compute_burst_ms: Option<u32>,
    pub compute_slice_ms: Option<u32>,
    pub latency: bool,
    /// Written as `"<ms>ms"`.
    pub memory_wait_ms: Option<u64>,
    /// `[all]`.
    pub all: Limits,
    /// `[device.<i>]`.
    pub by_index: BTreeMap<u32, Limits>,
    /// `[device.GPU-...]`, the UUID as [`format_uuid`] writes it.
    pub by_uuid: BTreeMap<[u8; 16], Limits>,
}

impl QuotaFile {
    /// The file's text under `# <comment>` (control characters dropped,
    /// so that it stays one line; none where empty), and the configuration
    /// the reader makes of it; `path` names the file in the reader's error.
    pub fn render(&self, comment: &str, path: &Path) -> Result<(String, Config), ConfigError> {
        render(comment, &self.table(), path)
    }

    /// The file's values as TOML.
    fn table(&self) -> Table {
        let mut t = Table::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                t.insert(k.into(), v);
            }
        };
        put("tenant", self.tenant.clone().map(Value::String));
        put("slice", self.slice.clone().map(Value::String));
        put("segment_dir", self.segment_dir.clone().map(Value::String));
        put(
            "gpu_segment_dir",
            self.gpu_segment_dir.clone().map(Value::String),
        );
        put("context_overhead", self.context_overhead.map(integer));
        put(
            "compute_burst_ms",
            self.compute_burst_ms.map(|v| integer(v.into())),
        );
        put(
            "compute_slice_ms",
            self.compute_slice_ms.map(|v| integer(v.into())),
        );
        put("latency", self.latency.then_some(Value::Boolean(true)));
        put(
            "memory_wait",
            self.memory_wait_ms
                .map(|ms| Value::String(format!("{ms}ms"))),
        );
        if !self.all.is_empty() {
            t.insert("all".into(), Value::Table(limits_table(&self.all)));
        }
        let mut devices = Table::new();
        for (i, l) in &self.by_index {
            devices.insert(i.to_string(), Value::Table(limits_table(l)));
        }
        for (u, l) in &self.by_uuid {
            devices.insert(format_uuid(u), Value::Table(limits_table(l)));
        }
        if !devices.is_empty() {
            t.insert("device".into(), Value::Table(devices));
        }
        t
    }
}

/// One limit of a limits table (`[all]`, `[device.<k>]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKey {
    Memory,
    MemoryMax,
    Compute,
    ComputeMax,
}

impl LimitKey {
    pub const ALL: [LimitKey; 4] = [
        LimitKey::Memory,
        LimitKey::MemoryMax,
        LimitKey::Compute,
        LimitKey::ComputeMax,
    ];

    /// Its key in the file.
    pub fn key(self) -> &'static str {
        match self {
            LimitKey::Memory => "memory",
            LimitKey::MemoryMax => "memory_max",
            LimitKey::Compute => "compute",
            LimitKey::ComputeMax => "compute_max",
        }
    }

    /// The limit named `key` in the file (None: no such limit).
    pub fn from_key(key: &str) -> Option<LimitKey> {
        LimitKey::ALL.into_iter().find(|k| k.key() == key)
    }

    /// Its value in `l`, as a number (bytes, percent).
    pub fn of(self, l: &Limits) -> Option<u64> {
        match self {
            LimitKey::Memory => l.memory,
            LimitKey::MemoryMax => l.memory_max,
            LimitKey::Compute => l.compute.map(u64::from),
            LimitKey::ComputeMax => l.compute_max.map(u64::from),
        }
    }
}

/// A limits table an edit changes: `[all]` or a GPU's own entry by UUID
/// (an index entry is never edited: which GPU it is depends on each
/// process's `CUDA_VISIBLE_DEVICES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitsEntry {
    All,
    Gpu([u8; 16]),
}

/// An existing quota file, read and checked, to change limits in: every
/// other value is kept as written (a size string stays that string, a
/// GPU's entry keeps its key's spelling), and the file is written anew
/// from its values: its first comment line is kept where the caller
/// passes it on ([`QuotaEdit::comment`]), other comments are not.
#[derive(Debug, Clone)]
pub struct QuotaEdit {
    path: PathBuf,
    table: Table,
    config: Config,
    comment: Option<String>,
}

impl QuotaEdit {
    /// `text` read as the shim reads it (its error, naming `path`, where
    /// it would not load).
    pub fn parse(path: &Path, text: &str) -> Result<QuotaEdit, ConfigError> {
        let config = parse_file(path, text)?;
        let table = text.parse::<Table>().map_err(|e| {
            ConfigError::new(format!(
                "{}: {}",
                path.display(),
                toml_syntax_error(text, &e)
            ))
        })?;
        let comment = text
            .lines()
            .next()
            .and_then(|l| l.strip_prefix('#'))
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_string);
        Ok(QuotaEdit {
            path: path.to_path_buf(),
            table,
            config,
            comment,
        })
    }

    /// The configuration the file held when read (edits do not change it).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Its first line's comment (who wrote it), without `#`.
    pub fn comment(&self) -> Option<&str> {
        self.comment.as_deref()
    }

    /// Whether the file has `entry` (`[all]`, or a GPU's entry in any
    /// spelling of its UUID).
    pub fn has(&self, entry: LimitsEntry) -> bool {
        match entry {
            LimitsEntry::All => self.table.contains_key("all"),
            LimitsEntry::Gpu(u) => self
                .table
                .get("device")
                .and_then(Value::as_table)
                .is_some_and(|d| device_key(d, &u).is_some()),
        }
    }

    /// Sets `key` of `entry` to `value` (bytes, percent), making the entry
    /// where the file has none (a GPU's as `GPU-...`). The value is checked
    /// when the file is rendered.
    pub fn set(
        &mut self,
        entry: LimitsEntry,
        key: LimitKey,
        value: u64,
    ) -> Result<(), ConfigError> {
        let shown = self.path.display().to_string();
        let not_table = |what: &str| ConfigError::new(format!("{shown}: {what}: not a table"));
        let slot = match entry {
            LimitsEntry::All => self
                .table
                .entry("all")
                .or_insert_with(|| Value::Table(Table::new())),
            LimitsEntry::Gpu(u) => {
                let devices = self
                    .table
                    .entry("device")
                    .or_insert_with(|| Value::Table(Table::new()))
                    .as_table_mut()
                    .ok_or_else(|| not_table("device"))?;
                let k = device_key(devices, &u).unwrap_or_else(|| format_uuid(&u));
                devices
                    .entry(k)
                    .or_insert_with(|| Value::Table(Table::new()))
            }
        };
        let limits = slot.as_table_mut().ok_or_else(|| {
            not_table(&match entry {
                LimitsEntry::All => "all".to_string(),
                LimitsEntry::Gpu(u) => format!("device.{}", format_uuid(&u)),
            })
        })?;
        limits.insert(key.key().into(), integer(value));
        Ok(())
    }

    /// The edited file's text under `# <comment>` and the configuration
    /// the reader makes of it (its error, naming the file, where it would
    /// not load).
    pub fn render(&self, comment: &str) -> Result<(String, Config), ConfigError> {
        render(comment, &self.table, &self.path)
    }
}

/// The key of GPU `uuid`'s entry among `devices` (in whatever case or
/// form the file spells it).
fn device_key(devices: &Table, uuid: &[u8; 16]) -> Option<String> {
    devices
        .keys()
        .find(|k| super::units::parse_uuid(k).ok().as_ref() == Some(uuid))
        .cloned()
}

/// A limits table's values.
fn limits_table(l: &Limits) -> Table {
    let mut t = Table::new();
    for k in LimitKey::ALL {
        if let Some(v) = k.of(l) {
            t.insert(k.key().into(), integer(v));
        }
    }
    t
}

/// A TOML integer; past i64 (never a valid value) the largest, which the
/// reader then refuses.
fn integer(v: u64) -> Value {
    Value::Integer(i64::try_from(v).unwrap_or(i64::MAX))
}

/// `table` as quota-file text under its comment line, checked by the reader.
fn render(comment: &str, table: &Table, path: &Path) -> Result<(String, Config), ConfigError> {
    let body = toml::to_string(table).map_err(|e| {
        ConfigError::new(format!(
            "{}: cannot write the quota file: {e}",
            path.display()
        ))
    })?;
    // A comment runs to the end of its line: one line, whatever it names.
    let comment: String = comment.chars().filter(|c| !c.is_control()).collect();
    let text = if comment.is_empty() {
        body
    } else {
        format!("# {comment}\n{body}")
    };
    let config = parse_file(path, &text)?;
    Ok((text, config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{
        CONTAINER_CONFIG_DIR, DEFAULT_CONFIG_PATH, Source, parse_file, parse_uuid,
    };

    const P: &str = "/r/quota.toml";
    const U1: &str = "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b";
    const U2: &str = "GPU-00000000-1111-2222-3333-444444444444";
    const GIB: u64 = 1 << 30;

    fn uuid(s: &str) -> [u8; 16] {
        parse_uuid(s).expect("uuid")
    }

    fn limits(memory: Option<u64>, compute: Option<u8>) -> Limits {
        Limits {
            memory,
            compute,
            ..Limits::default()
        }
    }

    /// Every key the reader knows, set.
    fn everything() -> QuotaFile {
        QuotaFile {
            tenant: Some("team-a/trainer".into()),
            slice: Some("claim-0b1c:2d/3e".into()),
            segment_dir: Some("/run/a \"b\" \\ c\té/segment".into()),
            gpu_segment_dir: Some("/run/cuslice/gpu".into()),
            context_overhead: Some(300 << 20),
            compute_burst_ms: Some(150),
            compute_slice_ms: Some(10),
            latency: true,
            memory_wait_ms: Some(1500),
            all: Limits {
                memory: Some(4 * GIB),
                memory_max: Some(9 * GIB),
                compute: Some(20),
                compute_max: Some(40),
            },
            by_index: [
                (0, limits(Some(8 * GIB), None)),
                (63, limits(None, Some(30))),
            ]
            .into(),
            by_uuid: [
                (uuid(U1), limits(Some(8 * GIB), Some(40))),
                (
                    uuid(U2),
                    Limits {
                        memory: Some(6 * GIB),
                        memory_max: Some(10 * GIB),
                        compute: Some(25),
                        compute_max: Some(50),
                    },
                ),
            ]
            .into(),
        }
    }

    #[test]
    fn what_is_built_is_read_back_as_built_for_every_key() {
        let q = everything();
        let (text, c) = q
            .render("written by a test", Path::new(P))
            .expect("renders");
        assert_eq!(c, parse_file(Path::new(P), &text).expect("reads"));
        assert_eq!(c.source, Source::File(PathBuf::from(P)));
        assert_eq!(c.tenant, q.tenant);
        assert_eq!(c.slice, q.slice);
        assert_eq!(c.segment_dir.to_str(), q.segment_dir.as_deref());
        assert_eq!(c.gpu_segment_dir.to_str(), q.gpu_segment_dir.as_deref());
        assert_eq!(c.context_overhead, q.context_overhead);
        assert_eq!(c.compute_burst_ms, q.compute_burst_ms);
        assert_eq!(c.compute_slice_ms, q.compute_slice_ms);
        assert_eq!(c.latency, q.latency);
        assert_eq!(c.memory_wait_ms, q.memory_wait_ms);
        assert_eq!(c.all, q.all);
        assert_eq!(c.by_index, q.by_index);
        assert_eq!(c.by_uuid, q.by_uuid);
        assert!(text.starts_with("# written by a test\n"), "{text}");
        // Nothing set: an empty file, which means no limits.
        let (text, c) = QuotaFile::default()
            .render("", Path::new(P))
            .expect("renders");
        assert_eq!(text, "");
        assert!(!c.has_limits() && !c.latency);
        // An empty device entry is written (it limits nothing), an empty
        // [all] is not.
        let q = QuotaFile {
            by_uuid: [(uuid(U1), Limits::default())].into(),
            ..QuotaFile::default()
        };
        let (text, c) = q.render("c", Path::new(P)).expect("renders");
        assert_eq!(text, format!("# c\n[device.{U1}]\n"));
        assert_eq!(c.by_uuid, q.by_uuid);
    }

    #[test]
    fn the_text_is_the_toml_crates_keys_sorted_under_one_comment_line() {
        let q = QuotaFile {
            tenant: Some("t".into()),
            slice: Some("ctr-1".into()),
            segment_dir: Some(crate::config::CONTAINER_SEGMENT_DIR.into()),
            gpu_segment_dir: Some(crate::config::CONTAINER_GPU_SEGMENT_DIR.into()),
            memory_wait_ms: Some(30_000),
            all: limits(Some(GIB), Some(30)),
            ..QuotaFile::default()
        };
        let (text, _) = q
            .render("written by x\nfor \u{1b}y", Path::new(P))
            .expect("renders");
        assert_eq!(
            text,
            "# written by xfor y\n\
             gpu_segment_dir = \"/run/cuslice/gpu\"\n\
             memory_wait = \"30000ms\"\n\
             segment_dir = \"/run/cuslice/segment\"\n\
             slice = \"ctr-1\"\n\
             tenant = \"t\"\n\
             \n\
             [all]\n\
             compute = 30\n\
             memory = 1073741824\n"
        );
        assert_eq!(
            DEFAULT_CONFIG_PATH,
            format!("{CONTAINER_CONFIG_DIR}/quota.toml")
        );
    }

    #[test]
    fn a_value_the_reader_refuses_is_refused_with_its_line() {
        let p = Path::new(P);
        let cases: [(QuotaFile, &str); 6] = [
            (
                QuotaFile {
                    all: limits(None, Some(130)),
                    ..QuotaFile::default()
                },
                "[all]\ncompute = 130\n",
            ),
            (
                QuotaFile {
                    tenant: Some("a\"b".into()),
                    ..QuotaFile::default()
                },
                "tenant = 'a\"b'\n",
            ),
            (
                QuotaFile {
                    gpu_segment_dir: Some("gpu".into()),
                    ..QuotaFile::default()
                },
                "gpu_segment_dir = \"gpu\"\n",
            ),
            (
                QuotaFile {
                    all: Limits {
                        compute: Some(50),
                        compute_max: Some(40),
                        ..Limits::default()
                    },
                    ..QuotaFile::default()
                },
                "[all]\ncompute = 50\ncompute_max = 40\n",
            ),
            (
                QuotaFile {
                    memory_wait_ms: Some(1000),
                    all: limits(None, Some(30)),
                    ..QuotaFile::default()
                },
                "memory_wait = \"1000ms\"\n[all]\ncompute = 30\n",
            ),
            (
                QuotaFile {
                    by_uuid: [(uuid(U1), limits(Some(u64::MAX), None))].into(),
                    ..QuotaFile::default()
                },
                "[device.GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b]\nmemory = 9223372036854775807\n",
            ),
        ];
        for (q, text) in cases {
            let e = q.render("c", p).expect_err(text);
            let want = parse_file(p, text).expect_err("the reader refuses it");
            assert_eq!(e, want, "{text}");
            assert!(
                e.0.starts_with("/r/quota.toml: ") && !e.0.contains('\n'),
                "{e}"
            );
        }
    }

    const FILE: &str = "# written by cuslice oci-hook for container abc\n\
        # a second comment\n\
        tenant = \"t\"\n\
        [all]\n\
        memory = \"8GiB\"\n\
        compute = 30\n\
        [device.\"gpu-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b\"]\n\
        memory = \"2GiB\"\n\
        [device.\"GPU-00000000-1111-2222-3333-444444444444\"]\n\
        memory = \"3GiB\"\n\
        compute_max = 50\n";

    #[test]
    fn editing_one_gpus_memory_keeps_everything_else_as_written() {
        let mut e = QuotaEdit::parse(Path::new(P), FILE).expect("reads");
        assert_eq!(
            e.comment(),
            Some("written by cuslice oci-hook for container abc")
        );
        assert_eq!(e.config().by_uuid[&uuid(U1)].memory, Some(2 * GIB));
        assert!(e.has(LimitsEntry::All) && e.has(LimitsEntry::Gpu(uuid(U1))));
        e.set(LimitsEntry::Gpu(uuid(U1)), LimitKey::Memory, 5 * GIB)
            .expect("set");
        // Read as it was: the edit is in the text to render.
        assert_eq!(e.config().by_uuid[&uuid(U1)].memory, Some(2 * GIB));
        let (text, c) = e.render("written by x; resized").expect("renders");
        assert_eq!(
            text,
            "# written by x; resized\n\
             tenant = \"t\"\n\
             \n\
             [all]\n\
             compute = 30\n\
             memory = \"8GiB\"\n\
             \n\
             [device.GPU-00000000-1111-2222-3333-444444444444]\n\
             compute_max = 50\n\
             memory = \"3GiB\"\n\
             \n\
             [device.gpu-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b]\n\
             memory = 5368709120\n"
        );
        let was = parse_file(Path::new(P), FILE).expect("reads");
        assert_eq!(c.by_uuid[&uuid(U1)].memory, Some(5 * GIB));
        assert_eq!(c.by_uuid[&uuid(U2)], was.by_uuid[&uuid(U2)]);
        assert_eq!((c.all, c.tenant.clone()), (was.all, was.tenant.clone()));
    }

    #[test]
    fn an_entry_missing_is_made_and_a_refused_value_is_the_readers_line() {
        let text = "[all]\nmemory = \"1GiB\"\ncompute = 40\n";
        let mut e = QuotaEdit::parse(Path::new(P), text).expect("reads");
        assert_eq!(e.comment(), None);
        let u = uuid(&U1.to_lowercase());
        assert!(!e.has(LimitsEntry::Gpu(u)));
        e.set(LimitsEntry::Gpu(u), LimitKey::Memory, 3 * GIB)
            .expect("set");
        let (text, c) = e.render("resized").expect("renders");
        assert!(
            text.contains(&format!("[device.{U1}]\nmemory = 3221225472\n")),
            "{text}"
        );
        assert_eq!(c.limits_for(0, &u).memory, Some(3 * GIB));
        assert_eq!(c.all.memory, Some(GIB));
        // A ceiling below the share: refused as the reader refuses it.
        e.set(LimitsEntry::All, LimitKey::ComputeMax, 30)
            .expect("set");
        let err = e.render("resized").expect_err("below the share");
        assert_eq!(
            err,
            parse_file(
                Path::new(P),
                "[all]\nmemory = \"1GiB\"\ncompute = 40\ncompute_max = 30\n"
            )
            .expect_err("the reader refuses it")
        );
        // A file the reader refuses is not edited.
        let err = QuotaEdit::parse(Path::new(P), "[all]\ncompute = 0\n").expect_err("refused");
        assert!(err.0.starts_with("/r/quota.toml: all.compute: "), "{err}");
        // Limits by key.
        for k in LimitKey::ALL {
            assert_eq!(LimitKey::from_key(k.key()), Some(k));
        }
        assert_eq!(LimitKey::from_key("memory_wait"), None);
    }
}
