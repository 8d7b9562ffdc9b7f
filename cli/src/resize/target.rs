//! Which slice a resize target names: a container (its id or a prefix of
//! it), a DRA claim (its UID, a prefix, or namespace/name), a `cuslice
//! run` session (its run process or any process of it), found as
//! `cuslice status` and the watch find them (`host::discover`).

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::path::Path;

use cuslice_host::container::short_id;
use cuslice_host::discover::{self, Found, Places};
use cuslice_host::layout;
use cuslice_host::{proc, text};

/// A slice found, and what is needed to write it.
pub(super) struct Target {
    pub(super) found: Found,
    /// For messages: `container 3f2a9c8b7d6e (web-1)`, `DRA claim
    /// team-a/trainer (0b1c2d3e-000)`, `cuslice run 4242`.
    pub(super) label: String,
    /// A session's user (uid, gid): the files are theirs.
    pub(super) user: Option<(u32, u32)>,
}

/// The slices a target matched.
type Matched = Vec<Target>;

/// The containers under `places` whose id is `want` or starts with it
/// (an exact id alone where there is one).
fn containers(places: &Places, want: &str) -> Matched {
    let all = places.containers();
    let exact = all.iter().any(|f| f.name == want);
    all.into_iter()
        .filter(|f| {
            if exact {
                f.name == want
            } else {
                f.name.starts_with(want)
            }
        })
        .map(|f| {
            let rec = f.record().ok().flatten();
            let label = match rec
                .as_ref()
                .filter(|m| m.name.is_some() || m.image.is_some())
            {
                Some(m) => format!(
                    "container {} ({})",
                    text::clean(&short_id(&f.name)),
                    cuslice_host::container::describe(m)
                ),
                None => format!("container {}", text::clean(&short_id(&f.name))),
            };
            Target {
                found: f,
                label,
                user: None,
            }
        })
        .collect()
}

/// The DRA claims whose UID is `want` or starts with it, or (with a `/`)
/// whose namespace/name is `want`.
fn claims(places: &Places, want: &str) -> Matched {
    let all = places.claims();
    let exact = all.iter().any(|f| f.name == want);
    all.into_iter()
        .filter(|f| {
            if want.contains('/') {
                f.claim_record()
                    .and_then(|r| r.namespaced_name())
                    .is_some_and(|n| n == want)
            } else if exact {
                f.name == want
            } else {
                f.name.starts_with(want)
            }
        })
        .map(|f| {
            let shown = text::clean(&short_id(&f.name));
            let label = match f.claim_record().and_then(|r| r.namespaced_name()) {
                Some(n) => format!("DRA claim {} ({shown})", text::clean(&n)),
                None => format!("DRA claim {shown}"),
            };
            Target {
                found: f,
                label,
                user: None,
            }
        })
        .collect()
}

/// The `cuslice run` process `pid` is or runs under (its parent chain:
/// `run` is a child subreaper, so every process of the session is its
/// descendant); None: no such process, or none of its ancestors is one.
fn run_process_of(pid: u32) -> Option<u32> {
    let mut cur = pid;
    for _ in 0..4096 {
        let st = proc::stat(cur)?;
        // Another user's executable cannot be read (its `exe` link needs
        // ptrace access): its command line then says, so that the user is
        // told the session is not theirs (nothing is read or written).
        let argv = proc::cmdline(cur);
        let exe = proc::exe_name(cur).or_else(|| {
            argv.first()
                .and_then(|a| Path::new(a).file_name())
                .map(|n| n.to_string_lossy().into_owned())
        });
        if exe.as_deref() == Some("cuslice") && argv.get(1).map(String::as_str) == Some("run") {
            return Some(cur);
        }
        if st.ppid <= 1 {
            return None;
        }
        cur = st.ppid;
    }
    None
}

/// The session of the `cuslice run` process `run`: its directory found
/// as the watch finds it (the one it holds open, named for its PID as it
/// sees itself, in its `$XDG_RUNTIME_DIR`, else `$TMPDIR`, else /tmp),
/// opened from its base without following a link and checked to be the
/// run process's user's.
fn session(run: u32) -> Result<Target, String> {
    let label = format!("cuslice run {run}");
    let inner = proc::inner_pid(run).unwrap_or(run);
    let env = |k: &str| proc::environ(run, k).filter(|v| !v.is_empty());
    let base = layout::run_base(|k| env(k).map(OsString::from));
    if !base.is_absolute() {
        return Err(format!(
            "{label}: its runtime directory {} is not an absolute path",
            base.display()
        ));
    }
    let uid = proc::uid(run).ok_or_else(|| format!("{label}: cannot read its user"))?;
    let me = cuslice_host::sys::euid();
    if me != 0 && me != uid {
        return Err(format!(
            "{label}: the session is uid {uid}'s: only that user or root may resize it"
        ));
    }
    let in_root = proc::in_root(run, &base);
    let same = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        let id = |q: &Path| std::fs::metadata(q).ok().map(|m| (m.dev(), m.ino()));
        p == base || id(&proc::in_root(run, p)).is_some_and(|i| id(&in_root) == Some(i))
    };
    let names: Vec<OsString> = proc::fd_paths(run)
        .into_iter()
        .filter(|d| {
            d.file_name()
                .is_some_and(|n| layout::is_run_dir_of(n, inner))
                && d.parent().is_some_and(same)
        })
        .filter_map(|d| d.file_name().map(OsString::from))
        .collect();
    let [name] = names.as_slice() else {
        return Err(format!(
            "{label}: no run directory {}* among its open files (a session started without limits has no quota to resize)",
            base.join(layout::run_name_prefix(inner)).display()
        ));
    };
    let found = discover::run(&in_root, name, &base.join(name), Some(uid))?;
    let gid = found
        .dir
        .as_ref()
        .ok()
        .and_then(|d| cuslice_host::sys::fstat(d.as_fd()).ok())
        .map(|st| st.st_gid)
        .ok_or_else(|| format!("{label}: cannot stat its directory"))?;
    Ok(Target {
        found,
        label,
        user: Some((uid, gid)),
    })
}

/// The slice `target` names (see [`ResizeArgs::target`]); one line naming
/// what matched where it is none or several.
pub(super) fn resolve(places: &Places, target: &str) -> Result<Target, String> {
    let t = target.trim();
    let pid_session = |s: &str| -> Result<Option<Target>, String> {
        let Ok(pid) = s.parse::<u32>() else {
            return Err(format!("{target:?}: expected run:PID"));
        };
        match run_process_of(pid) {
            Some(run) => session(run).map(Some),
            None => Ok(None),
        }
    };
    let mut matched: Matched = if let Some(id) = t.strip_prefix("container:") {
        containers(places, id)
    } else if let Some(c) = t.strip_prefix("claim:") {
        claims(places, c)
    } else if let Some(p) = t.strip_prefix("run:") {
        pid_session(p)?.into_iter().collect()
    } else if t.is_empty() {
        vec![]
    } else {
        let mut m = containers(places, t);
        m.extend(claims(places, t));
        if t.bytes().all(|b| b.is_ascii_digit()) {
            m.extend(pid_session(t)?);
        }
        m
    };
    match matched.len() {
        1 => Ok(matched.remove(0)),
        0 => Err(format!(
            "{target:?}: matches no container in {}, no DRA claim in {} and no cuslice run process (targets: a container id or its prefix, claim:UID, claim:NAMESPACE/NAME, run:PID)",
            places.containers_dir().display(),
            places.layout().claims_dir().display()
        )),
        _ => Err(format!(
            "{target:?}: matches {}: say which",
            matched
                .iter()
                .map(|m| m.label.clone())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}
