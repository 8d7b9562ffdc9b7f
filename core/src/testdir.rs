//! For the unit tests: a fresh directory under the temporary directory,
//! removed when dropped, and a GPU segment in one.

use std::path::{Path, PathBuf};

use crate::gpu::GpuSegment;

/// `cuslice-<tag>-<pid>-<name>` under the temporary directory, made empty
/// now and removed when dropped.
pub(crate) struct TestDir(PathBuf);

impl TestDir {
    pub(crate) fn new(tag: &str, name: &str) -> TestDir {
        let d = std::env::temp_dir().join(format!("cuslice-{tag}-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        TestDir(d)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A GPU segment (`gpu.seg`) in a fresh [`TestDir`].
pub(crate) fn gpu_segment(tag: &str, name: &str) -> (TestDir, GpuSegment) {
    let d = TestDir::new(tag, name);
    let g = GpuSegment::open_or_create(&d.path().join("gpu.seg")).expect("open");
    (d, g)
}
