//! Which slice a host PID belongs to: a container by its PID namespace,
//! else its cgroup (the most specific; a process several containers claim
//! alike is no one's); else a `cuslice run` session by ancestry. Cached
//! under (PID, start time).

use super::*;

/// The one slice that every record of `records` belongs to (containers of
/// one DRA claim are one slice); None for none or several.
fn one_slice(records: &[&Slice]) -> Option<SliceId> {
    let first = records.first()?.owner();
    records[1..]
        .iter()
        .all(|c| c.owner() == first)
        .then_some(first)
}

/// The slices `records` belong to, each once, in order.
fn owner_ids(records: &[&Slice]) -> Vec<SliceId> {
    let set: std::collections::BTreeSet<SliceId> = records.iter().map(|c| c.owner()).collect();
    set.into_iter().collect()
}

/// Of `slices`, those whose recorded cgroup holds `cg` (the same or an
/// ancestor of it), the most specific only (the longest path): a process
/// in `/pod/b` is `b`'s even if another container recorded `/pod`.
fn most_specific<'a>(cg: Option<&str>, slices: Vec<&'a Slice>) -> Vec<&'a Slice> {
    let Some(cg) = cg else { return vec![] };
    let within: Vec<(&'a Slice, usize)> = slices
        .into_iter()
        .filter_map(|c| {
            let mine = c.cgroup.as_deref()?.trim_end_matches('/');
            (!mine.is_empty()
                && (cg == mine || cg.strip_prefix(mine).is_some_and(|r| r.starts_with('/'))))
            .then_some((c, mine.len()))
        })
        .collect();
    let best = within.iter().map(|(_, n)| *n).max().unwrap_or(0);
    within
        .into_iter()
        .filter(|(_, n)| *n == best)
        .map(|(c, _)| c)
        .collect()
}

/// Whether `/etc/cuslice/quota.toml` exists as the run process `pid` sees
/// it (the shim then follows it).
fn host_wide_quota(p: &dyn ProcSource, pid: u32) -> bool {
    let path = p.in_root(pid, Path::new(config::DEFAULT_CONFIG_PATH));
    !matches!(std::fs::metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound)
}

impl Slices {
    fn is_run(&mut self, p: &dyn ProcSource, pid: u32, start: u64) -> bool {
        if let Some((s, yes)) = self.run_check.get(&pid)
            && *s == start
        {
            return *yes;
        }
        let yes = p.exe_name(pid).as_deref() == Some("cuslice")
            && p.cmdline(pid).get(1).map(String::as_str) == Some("run");
        self.run_check.insert(pid, (start, yes));
        yes
    }

    /// The slice of host PID `pid` and its start time; None: no such
    /// process. The slice is None for a process outside any slice or
    /// claimed by several ([`Slices::owner_of`] tells which).
    #[cfg(test)]
    pub fn slice_of(&mut self, p: &dyn ProcSource, pid: u32) -> Option<(u64, Option<SliceId>)> {
        self.owner_of(p, pid)
            .map(|(start, o)| (start, o.slice().cloned()))
    }

    /// Whose host PID `pid` is, and its start time; None: no such process.
    pub fn owner_of(&mut self, p: &dyn ProcSource, pid: u32) -> Option<(u64, Owner)> {
        let st = p.stat(pid)?;
        if let Some((s, o)) = self.cache.get(&pid)
            && *s == st.start
        {
            return Some((st.start, o.clone()));
        }
        let o = self.classify(p, pid, st.start);
        self.cache.insert(pid, (st.start, o.clone()));
        Some((st.start, o))
    }

    fn classify(&mut self, p: &dyn ProcSource, pid: u32, start: u64) -> Owner {
        let host = self.host_ns;
        let namespaces = p.pid_namespaces(pid);
        let cg = p.cgroup(pid);
        for ns in &namespaces {
            if Some(*ns) == host {
                break;
            }
            let owners: Vec<&Slice> = self
                .containers
                .values()
                .filter(|c| c.pid_ns == Some(*ns) && c.pid_ns != host)
                .collect();
            if owners.is_empty() {
                continue;
            }
            // One container, or containers of one DRA claim (a pod's
            // containers sharing its PID namespace): one slice.
            if let Some(id) = one_slice(&owners) {
                return Owner::Slice(id);
            }
            // Containers of several slices sharing a PID namespace (`--pid
            // container:`, a pod's shareProcessNamespace): told apart by
            // cgroup; a process none or several claim alike is no one's,
            // never acted on.
            let by_cg = most_specific(cg.as_deref(), owners.clone());
            if let Some(id) = one_slice(&by_cg) {
                return Owner::Slice(id);
            }
            let names: Vec<&str> = by_cg.iter().map(|c| c.label.as_str()).collect();
            self.notes.push(format!(
                "pid {pid}: in a PID namespace that several containers share, and its cgroup ({}) does not tell which of them it belongs to{}: not checked",
                cg.as_deref().unwrap_or("unknown"),
                if names.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", names.join(", "))
                }
            ));
            let claim = if by_cg.is_empty() { owners } else { by_cg };
            return Owner::Ambiguous(owner_ids(&claim));
        }
        let all: Vec<&Slice> = self.containers.values().collect();
        let by_cg = most_specific(cg.as_deref(), all);
        if let Some(id) = one_slice(&by_cg) {
            return Owner::Slice(id);
        }
        if !by_cg.is_empty() {
            let names: Vec<&str> = by_cg.iter().map(|c| c.label.as_str()).collect();
            self.notes.push(format!(
                "pid {pid}: its cgroup ({}) is recorded by several containers ({}): not checked",
                cg.as_deref().unwrap_or("unknown"),
                names.join(", ")
            ));
            return Owner::Ambiguous(owner_ids(&by_cg));
        }
        // A process in a PID namespace of its own that is no container's
        // (`unshare -Urpf` needs no privilege) is walked up like any
        // other: /proc/<pid>/stat, read here, gives its parent in host
        // PIDs.
        let (mut cur, mut cur_start) = (pid, start);
        for _ in 0..4096 {
            if self.is_run(p, cur, cur_start) {
                let key = (cur, cur_start);
                if self.shared_runs.contains(&key) {
                    return Owner::Nobody;
                }
                if !self.runs.contains_key(&key) {
                    if host_wide_quota(p, cur) {
                        // The shim follows that file, not the session's:
                        // so does the watch (no slice of its own).
                        self.notes.push(format!(
                            "cuslice run {cur} ({}): {} exists, its processes follow it, not the session's quota file: not checked as a slice of its own",
                            run_command(&p.cmdline(cur)),
                            config::DEFAULT_CONFIG_PATH
                        ));
                        self.shared_runs.insert(key);
                        return Owner::Nobody;
                    }
                    let s = self.load_run(p, cur, cur_start);
                    self.runs.insert(key, s);
                }
                return Owner::Slice(SliceId::Run {
                    pid: cur,
                    start: cur_start,
                });
            }
            let Some(st) = p.stat(cur) else {
                return Owner::Nobody;
            };
            if st.ppid <= 1 {
                return Owner::Nobody;
            }
            let Some(parent) = p.stat(st.ppid) else {
                return Owner::Nobody;
            };
            (cur, cur_start) = (st.ppid, parent.start);
        }
        Owner::Nobody
    }
}
