//! Each kind's slice, read from its files: a container (its record and
//! quota file), a DRA claim (the claim's quota file and record, for the
//! containers whose records name it), a `cuslice run` session (its run
//! directory found from the run process; only the limits taken from its
//! quota file).

use super::*;

impl RunQuota {
    /// The identity of the quota file now (None: not reached).
    pub(super) fn now(&self) -> Option<FileId> {
        discover::run(&self.base, &self.name, &self.shown, Some(self.uid))
            .ok()?
            .quota_id()
    }
}

/// A slice's resize record (`Found::resize`): a bad one is a note, and
/// none.
fn resize_of(f: &Found, label: &str, notes: &mut Vec<String>) -> Option<ResizeRecord> {
    match f.resize() {
        Ok(r) => r,
        Err(e) => {
            notes.push(format!(
                "{label}: {e}: the grace of its last resize is not given"
            ));
            None
        }
    }
}

/// `cuslice run [flags] -- prog args`: `prog args`, escaped and cut to 60
/// characters (the user's command goes into one-line log messages).
pub(super) fn run_command(args: &[String]) -> String {
    let after = args
        .iter()
        .position(|a| a == "--")
        .map_or(args.get(2..).unwrap_or(&[]), |i| &args[i + 1..]);
    let mut v: Vec<String> = after.to_vec();
    if let Some(first) = v.first_mut()
        && let Some(n) = Path::new(first.as_str()).file_name()
    {
        *first = n.to_string_lossy().into_owned();
    }
    text::clean_to(&v.join(" "), 60)
}

/// The run directory of the run process `pid` (`inner`: its PID as it
/// sees itself) in `base` (as it sees it), as a path it sees: the one it
/// holds open (`cuslice run` keeps it open for its whole life) whose name
/// is `inner`'s run directory's and whose parent is `base`, by path or, a
/// base reached through a link, by device and inode. Named `base` + its
/// name, as `run` named it in the quota file.
fn find_run_dir(p: &dyn ProcSource, pid: u32, inner: u32, base: &Path) -> Option<PathBuf> {
    // A stat of the base as the run process sees it, its links followed
    // on purpose (the base may be reached through one): no open.
    let id = |d: &Path| {
        std::fs::metadata(p.in_root(pid, d))
            .ok()
            .map(|m| (m.dev(), m.ino()))
    };
    let mut base_id = None;
    p.fd_paths(pid).into_iter().find_map(|d| {
        let name = d.file_name()?;
        if !layout::is_run_dir_of(name, inner) {
            return None;
        }
        let parent = d.parent()?;
        let same = parent == base || {
            let b = *base_id.get_or_insert_with(|| id(base));
            b.is_some() && id(parent) == b
        };
        same.then(|| base.join(name))
    })
}

impl Slices {
    /// The claims the loaded container records name: those no record
    /// names any more are forgotten, a new one or one whose quota file or
    /// record changed is read. Whether anything changed.
    pub(super) fn refresh_claims(&mut self) -> bool {
        let mut named: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for c in self.containers.values() {
            if let Some(uid) = &c.claim {
                named.entry(uid.clone()).or_default().push(c.label.clone());
            }
        }
        let before = self.claims.len();
        self.claims.retain(|uid, _| named.contains_key(uid));
        self.claim_ids.retain(|uid, _| named.contains_key(uid));
        let mut changed = before != self.claims.len();
        let claims = self.places.open_claims();
        for (uid, members) in named {
            // Taken before the files are read: a change meanwhile is read
            // at the next pass.
            let f = match &claims {
                Ok(c) => self.places.claim_in(c, &uid),
                // Err in the claim's `dir`: why not.
                Err(_) => self.places.claim(&uid),
            };
            let now = (f.entry, f.quota_id(), f.record_id());
            if self.claims.contains_key(&uid) && self.claim_ids.get(&uid) == Some(&now) {
                continue;
            }
            let s = self.load_claim(&f, &members);
            self.claim_ids.insert(uid.clone(), now);
            self.claims.insert(uid, s);
            changed = true;
        }
        changed
    }

    /// Claim `uid`'s slice, `members` the labels of the containers whose
    /// records name it (for the note on a claim that cannot be checked).
    fn load_claim(&mut self, f: &Found, members: &[String]) -> Slice {
        let uid = f.name.as_str();
        let shown = text::clean(&short_id(uid));
        // The plugin's record, for the label: best effort (a claim is
        // judged whatever its record says).
        let record = f.claim_record().and_then(|r| r.namespaced_name());
        let label = match record {
            Some(n) => format!("DRA claim {} ({shown})", text::clean(&n)),
            None => format!("DRA claim {shown}"),
        };
        // Root's (the watch's own), not followed, bounded: as `status`
        // reads it (`host::discover`).
        let quota = f.quota().and_then(|cfg| {
            if !cfg.has_limits() {
                // What the hook refuses to give a container.
                return Err(format!("{}: no limit in it", f.paths.quota().display()));
            }
            Ok(cfg)
        });
        let quota = match quota {
            Ok(c) => Some(c),
            Err(e) => {
                self.notes.push(format!(
                    "{label} (named by {}): {e}: its containers are not checked",
                    members.join(", ")
                ));
                None
            }
        };
        let claim = self.layout.claim(uid);
        let resize = quota
            .as_ref()
            .and_then(|_| resize_of(f, &label, &mut self.notes));
        Slice {
            id: SliceId::Claim(uid.to_string()),
            resize,
            run_quota: None,
            tenant: quota
                .as_ref()
                .map_or_else(|| format!("claim-{uid}"), Config::tenant_name),
            tag: quota.as_ref().map_or(0, Config::slice_tag),
            label,
            mem_seg: quota
                .as_ref()
                .filter(|c| c.has_memory())
                .map(|_| claim.memory_segment()),
            quota,
            gpu_dir: self.layout.gpu_dir(),
            pid_ns: None,
            cgroup: None,
            init: None,
            repair: true,
            mem_seg_owner: None,
            claim: None,
        }
    }

    pub(super) fn stale_note(&mut self, label: &str, meta: &Path) {
        self.notes.push(format!(
            "{label}: the init process {} records is gone (a container stopped but not deleted, or a record left behind): its record matches no process until it is written again",
            meta.display()
        ));
    }

    /// The container `ctr` found (`<root>/containers/<id>`, opened
    /// without following a link): its record and (a container not of a
    /// claim) its quota file are read as `host::discover` reads a
    /// container's (no link followed, never blocking, bounded; both
    /// root's).
    pub(super) fn load_container(&mut self, ctr: &Found) -> Option<Slice> {
        let id = ctr.name.as_str();
        let paths = self.layout.container(id);
        let record = paths.record().unwrap_or_default();
        // The hook writes the quota file, then container.json: until both
        // are there, try again at the next pass.
        let meta = ctr.record().ok()?;
        // A container of a DRA claim is judged with the claim's other
        // containers, against the claim's quota file (`refresh_claims`):
        // its own copy is not read.
        let claim = meta.as_ref().and_then(|m| m.claim.clone());
        let quota = match claim {
            Some(_) => None,
            None => match ctr.quota() {
                Ok(c) => Some(c),
                Err(e) => {
                    self.notes
                        .push(format!("container {}: {e}: not checked", short_id(id)));
                    None
                }
            },
        };
        // The name, pod and image are annotations, the command the spec's:
        // the tenant's, escaped by `describe`.
        let label = match &meta {
            Some(m) if m.name.is_some() || m.pod.is_some() || m.image.is_some() => {
                format!("container {} ({})", describe(m), short_id(id))
            }
            _ => format!("container {}", short_id(id)),
        };
        let (pid_ns, cgroup) = meta
            .as_ref()
            .map_or((None, None), |m| (m.pid_ns, m.cgroup.clone()));
        let init = meta
            .as_ref()
            .and_then(|m| Some((m.init_pid?, m.init_start?)));
        let resize = quota
            .as_ref()
            .and_then(|_| resize_of(ctr, &label, &mut self.notes));
        let older = "(made by an older cuslice oci-hook)";
        let no_init = if init.is_none() {
            "; nor its init process: a record left behind is not told from a live one"
        } else {
            ""
        };
        if pid_ns.is_none() && cgroup.is_none() {
            self.notes.push(format!(
                "{label}: {} records no PID namespace or cgroup {older}: its processes cannot be told apart, it is not checked",
                record.display()
            ));
        } else if pid_ns.is_none() {
            self.notes.push(format!(
                "{label}: {} records no PID namespace {older}: its processes are found by cgroup{no_init}",
                record.display()
            ));
        } else if init.is_none() {
            self.notes.push(format!(
                "{label}: {} records no init process {older}: a record left behind is not told from a live one",
                record.display()
            ));
        }
        Some(Slice {
            id: SliceId::Container(id.to_string()),
            resize,
            run_quota: None,
            tenant: match (&quota, &claim) {
                (Some(c), _) => c.tenant_name(),
                // A claim's container registers as the claim's tenant.
                (None, Some(_)) => String::new(),
                (None, None) => format!("ctr-{}", short_id(id)),
            },
            tag: quota.as_ref().map_or(0, Config::slice_tag),
            label,
            mem_seg: quota
                .as_ref()
                .filter(|c| c.has_memory())
                .map(|_| paths.memory_segment()),
            quota,
            gpu_dir: self.layout.gpu_dir(),
            pid_ns,
            cgroup,
            init,
            repair: true,
            mem_seg_owner: None,
            claim,
        })
    }

    /// A session, its files found by the rule `cuslice run` follows (the
    /// host file layer's `layout`); only the limits are taken from its
    /// quota file.
    pub(super) fn load_run(&mut self, p: &dyn ProcSource, pid: u32, start: u64) -> Slice {
        let inner = p.inner_pid(pid).unwrap_or(pid);
        // As `cuslice run`: empty counts as unset.
        let env = |k: &str| p.environ(pid, k).filter(|v| !v.is_empty());
        let base = layout::run_base(|k| env(k).map(OsString::from));
        let gpu = env("CUSLICE_GPU_SEGMENT_DIR").map_or_else(
            || PathBuf::from(config::DEFAULT_GPU_SEGMENT_DIR),
            PathBuf::from,
        );
        let tenant = format!("run-{inner}");
        let label = format!("cuslice run {pid} ({})", run_command(&p.cmdline(pid)));
        let uid = p.uid(pid);
        let mut slice = Slice {
            id: SliceId::Run { pid, start },
            resize: None,
            run_quota: None,
            tenant: tenant.clone(),
            tag: 0,
            label: label.clone(),
            quota: None,
            mem_seg: None,
            gpu_dir: p.in_root(pid, &gpu),
            pid_ns: None,
            cgroup: None,
            init: None,
            repair: false,
            mem_seg_owner: uid,
            claim: None,
        };
        let Some(uid) = uid else {
            self.notes
                .push(format!("{label}: cannot read its user: not checked"));
            return slice;
        };
        if !base.is_absolute() || !gpu.is_absolute() {
            // `cuslice run` itself refuses such a quota file.
            self.notes.push(format!(
                "{label}: its runtime or GPU segment directory ({}, {}) is not an absolute path: not checked",
                base.display(),
                gpu.display()
            ));
            return slice;
        }
        let Some(run_dir) = find_run_dir(p, pid, inner, &base) else {
            self.notes.push(format!(
                "{label}: no run directory {}* among the run process's open files: not checked",
                base.join(layout::run_name_prefix(inner)).display()
            ));
            return slice;
        };
        let paths = SliceDir::run(&run_dir);
        let seg_dir = paths.segment_dir();
        let shown = paths.quota();
        // The run directory as the watch reaches it: its base through the
        // run process's root (links on the way followed: the user's), the
        // directory itself not a link and the user's, its quota file read
        // from its descriptor.
        let name = run_dir.file_name().unwrap_or_default();
        let found = discover::run(&p.in_root(pid, &base), name, &run_dir, Some(uid));
        slice.run_quota = Some(RunQuota {
            base: p.in_root(pid, &base),
            name: name.to_os_string(),
            shown: run_dir.clone(),
            uid,
            id: found.as_ref().ok().and_then(Found::quota_id),
        });
        let cfg = match found.as_ref().map_err(Clone::clone).and_then(Found::quota) {
            Ok(c) => c,
            Err(e) => {
                // `run` without limits writes no quota file (it becomes the
                // program): nothing to hold it to.
                self.notes.push(format!("{label}: {e}: not checked"));
                return slice;
            }
        };
        // Only a slice with the same tenant *and* slice tag is the same
        // entry of the GPU segment (a session's own slice is unique, so
        // this takes a file written by hand or by an older `cuslice run`).
        let tag = cfg.slice_tag();
        if let Some(c) = self
            .containers
            .values()
            .filter(|c| c.claim.is_none())
            .chain(self.claims.values())
            .find(|c| c.tenant == tenant && c.tag == tag)
        {
            self.notes.push(format!(
                "{label}: its tenant {tenant} is also {}'s: not checked",
                c.label
            ));
            return slice;
        }
        let mut wrong = vec![];
        if cfg.tenant.as_deref() != Some(tenant.as_str()) {
            wrong.push(format!(
                "tenant {:?} (`cuslice run` wrote {tenant:?})",
                cfg.tenant_name()
            ));
        }
        // `run-<its run directory's name>`; none from an older `cuslice
        // run`.
        let want_slice = run_dir
            .file_name()
            .map(|n| format!("run-{}", n.to_string_lossy()));
        if let Some(have) = &cfg.slice
            && Some(have) != want_slice.as_ref()
        {
            wrong.push(format!(
                "slice {have:?} (`cuslice run` wrote {:?})",
                want_slice.unwrap_or_default()
            ));
        }
        for (key, have, want) in [
            ("segment_dir", &cfg.segment_dir, &seg_dir),
            ("gpu_segment_dir", &cfg.gpu_segment_dir, &gpu),
        ] {
            if have != want {
                wrong.push(format!(
                    "{key} {:?} (`cuslice run` wrote {:?})",
                    have.display().to_string(),
                    want.display().to_string()
                ));
            }
        }
        if !wrong.is_empty() {
            // Held to the limits there (the user could have asked `run` for
            // any), as tenant run-<pid> at the places `run` gave it: a
            // process registered elsewhere is unregistered here. Its
            // segments are never written by the watch.
            self.notes.push(format!(
                "{label}: {}: {} not what `cuslice run` wrote: its segments are not repaired; it is checked against the file's limits as tenant {tenant} with its memory segment in {}",
                shown.display(),
                wrong.join(", "),
                seg_dir.display()
            ));
        }
        slice.repair = wrong.is_empty();
        slice.tag = tag;
        if let Ok(f) = &found {
            slice.resize = resize_of(f, &label, &mut self.notes);
        }
        slice.mem_seg = cfg
            .has_memory()
            .then(|| p.in_root(pid, &paths.memory_segment()));
        slice.quota = Some(cfg);
        slice
    }
}
