//! A simulated host: one fake GPU shared by every process started on it,
//! the GPU segment directory every tenant mounts, and per tenant (a
//! container) its quota file and its own memory segment directory.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use cuslice_core::config::format_uuid;
use cuslice_core::gpu::GpuSegment;

use super::{Opts, wait_for};

/// The UUID of the fake driver's GPU 0 (tests/fake/fake_common.h,
/// `fake_uuid_bytes`): the name of its GPU segment.
pub const FAKE_UUID: [u8; 16] = [
    0xc5, 0x11, 0xce, 0x00, 0xfa, 0x4e, 0x40, 0x00, 0x80, 0, 0, 0, 0, 0, 0, 0,
];

/// The fake GPU's memory page on a [`Host`] (`FAKE_CUDA_ALLOC_GRANULARITY`):
/// the suites that use one size their allocations in whole MiB around a
/// 1 MiB context and count them to the byte, which 64 KiB pages keep exact
/// while the driver still takes whole pages (the shim asks it their size).
pub const PAGE: u64 = 64 << 10;

/// The host's files live in a fresh temporary directory, removed when the
/// `Host` is dropped (unless `keep` was called):
///
/// | path | what |
/// |---|---|
/// | `fake-gpu.state` | the fake GPU's shared state (`FAKE_CUDA_STATE`) |
/// | `gpu/` | the GPU segment directory (`gpu_segment_dir`) |
/// | `<tenant>.toml` | a tenant's quota file |
/// | `mem-<tenant>/` | a tenant's memory segment directory (`segment_dir`) |
pub struct Host {
    pub dir: PathBuf,
    /// What a context costs: on the fake GPU (`FAKE_CUDA_CTX_OVERHEAD`) and
    /// in every quota file (`context_overhead`). None: the defaults.
    context: Option<&'static str>,
    keep: bool,
}

impl Host {
    /// `suite` (the test file) and `name` (the test) make the directory
    /// unique: `cuslice-<suite>-<pid>-<name>`.
    pub fn new(suite: &str, name: &str) -> Host {
        let dir =
            std::env::temp_dir().join(format!("cuslice-{suite}-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        Host {
            dir,
            context: None,
            keep: false,
        }
    }

    /// A context costs `size` (e.g. "1MiB") on the fake GPU, and every quota
    /// file charges exactly that.
    pub fn context_overhead(mut self, size: &'static str) -> Host {
        self.context = Some(size);
        self
    }

    /// Leaves the directory in place when dropped (logs of a failure).
    pub fn keep(&mut self) {
        self.keep = true;
    }

    pub fn fake_state(&self) -> PathBuf {
        self.dir.join("fake-gpu.state")
    }

    pub fn gpu_dir(&self) -> PathBuf {
        self.dir.join("gpu")
    }

    /// The GPU segment of the fake GPU 0.
    pub fn gpu_seg(&self) -> PathBuf {
        self.gpu_dir()
            .join(format!("{}.seg", format_uuid(&FAKE_UUID)))
    }

    pub fn mem_dir(&self, tenant: &str) -> PathBuf {
        self.dir.join(format!("mem-{tenant}"))
    }

    pub fn mem_seg(&self, tenant: &str) -> PathBuf {
        self.mem_dir(tenant).join("memory.seg")
    }

    /// Writes `tenant`'s quota file: its name, its own memory segment
    /// directory, the host's GPU segment directory, the context overhead,
    /// the top-level keys `top` (lines), and `limits` (lines) under `[all]`.
    pub fn quota(&self, tenant: &str, top: &str, limits: &str) -> PathBuf {
        let q = self.dir.join(format!("{tenant}.toml"));
        let context = self
            .context
            .map(|c| format!("context_overhead = \"{c}\"\n"))
            .unwrap_or_default();
        let text = format!(
            "tenant = \"{tenant}\"\nsegment_dir = \"{}\"\ngpu_segment_dir = \"{}\"\n{context}{top}\n[all]\n{limits}\n",
            self.mem_dir(tenant).display(),
            self.gpu_dir().display()
        );
        std::fs::write(&q, text).expect("write quota");
        q
    }

    /// The environment of a process on this host's fake GPU, under `quota`
    /// (None: no quota file), logging warnings only. The fake GPU's memory
    /// pages are [`PAGE`] (tests/memory.rs varies them).
    pub fn env(&self, quota: Option<&Path>) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("FAKE_CUDA_STATE", self.fake_state().display().to_string()),
            ("FAKE_CUDA_ALLOC_GRANULARITY", PAGE.to_string()),
            ("CUSLICE_LOG", "warn".to_string()),
        ];
        if let Some(c) = self.context {
            env.push(("FAKE_CUDA_CTX_OVERHEAD", c.to_string()));
        }
        if let Some(q) = quota {
            env.push(("CUSLICE_CONFIG", q.display().to_string()));
        }
        env
    }

    /// Starts test program `app` under the shim on this host, under `quota`,
    /// with `extra` added to (or replacing in) its environment; its output
    /// is piped.
    pub fn spawn(
        &self,
        app: &str,
        quota: Option<&Path>,
        args: &[&str],
        extra: &[(&'static str, &str)],
    ) -> Child {
        let mut env = self.env(quota);
        for (k, v) in extra {
            set_env(&mut env, k, v);
        }
        let opts = Opts {
            args: args.iter().map(|a| a.to_string()).collect(),
            env,
            ..Opts::default()
        };
        super::spawn(app, &opts)
    }

    /// The host's GPU segment, once a process has created it.
    pub fn gpu(&self) -> GpuSegment {
        let path = self.gpu_seg();
        wait_for(
            || format!("no GPU segment appeared at {}", path.display()),
            Duration::from_secs(10),
            || path.exists().then_some(()),
        );
        GpuSegment::open_or_create(&path).expect("GPU segment")
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Sets `key` in an environment list, replacing an earlier value.
pub fn set_env(env: &mut Vec<(&'static str, String)>, key: &'static str, value: &str) {
    env.retain(|(k, _)| *k != key);
    env.push((key, value.to_string()));
}
