//! A slice's memory segment, opened for the watch to write (restore its
//! quota): never through a link a session's user planted.

use super::*;

/// The memory segment of a slice, as the watch may write it: see
/// [`Slice::open_mem_seg_for_repair`].
#[derive(Debug)]
pub struct RepairTarget {
    /// A session's: its directory pinned, and its user, whose the file
    /// must be (None: a container's or a claim's, by path, root's).
    pinned: Option<(PinnedSegment, u32)>,
    /// The file, as the slice names it.
    path: PathBuf,
}

impl RepairTarget {
    /// The file, as the slice names it.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The segment, mapped read-write: a session's opened from its pinned
    /// directory without following a link, checked its user's on the
    /// descriptor it is mapped from.
    pub fn open(&self) -> Result<Segment, String> {
        match &self.pinned {
            Some((s, uid)) => s.open_owned(true, Some((*uid, SESSION))),
            None => Segment::open_existing(&self.path).map_err(|e| e.to_string()),
        }
    }
}

impl Slice {
    /// This slice's memory segment for the watch to write (restore its
    /// quota), or why not: the slice may not be repaired (a session whose
    /// quota file is not what `cuslice run` wrote), or (a session) the
    /// segment, its directory or the session's directory is a link or not
    /// the run process's user's. Each step is opened from the one above
    /// without following links and checked on the open descriptor, and the
    /// segment's directory stays open: what is written is a file in a
    /// directory of the session's user, never one reached through a link
    /// they planted.
    pub fn open_mem_seg_for_repair(&self) -> Result<RepairTarget, String> {
        if !self.repair {
            return Err("its quota file is not what `cuslice run` wrote".into());
        }
        let path = self.mem_seg.as_deref().ok_or("no memory segment")?;
        let Some(uid) = self.mem_seg_owner else {
            return Ok(RepairTarget {
                pinned: None,
                path: path.to_path_buf(),
            });
        };
        let Some(run_dir) = path.parent().and_then(Path::parent) else {
            return Err("no memory segment".into());
        };
        let (Some(base), Some(run_name)) = (run_dir.parent(), run_dir.file_name()) else {
            return Err("no memory segment".into());
        };
        let owner = Some((uid, SESSION));
        // The session's directory: in its base, wherever the base leads
        // (the user's XDG_RUNTIME_DIR may be a link), not itself a link,
        // the user's own; its segment directory likewise, held open.
        let s = discover::run(base, run_name, run_dir, Some(uid))?.segment(owner)?;
        s.check(owner)?;
        Ok(RepairTarget {
            pinned: Some((s, uid)),
            path: path.to_path_buf(),
        })
    }
}
