//! A tenant name is one container's: who else under the root holds it (a
//! live container or a DRA claim), checked under the root's lock.

use super::*;

/// Takes the root's lock (`<root>/hook.lock`, the layout's
/// [`LOCK_FILE`]), which the tenant check and the record write are made
/// under, making the root where missing (root's, 0700, as [`make_segments`]
/// keeps it).
pub(super) fn lock_root(root: &Path) -> Result<std::fs::File, String> {
    let dir = Dir::keep_root(root, 0o700)?;
    match dir.lock_within(LOCK_FILE, 0o600, LOCK_WAIT)? {
        Ok(f) => Ok(f),
        Err(_) => Err(format!(
            "{}: another container's hook still holds the tenant check's lock after {LOCK_WAIT:?}; try again",
            dir.join(LOCK_FILE).display()
        )),
    }
}

/// How long a hook waits for the tenant check's lock: it is held only
/// while one hook checks and writes two small files.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Who else under `root` has the tenant name `tenant`: a live container
/// other than `own_id` (`alive` says whether a record's init still runs;
/// a container of a DRA claim is the claim's) or a DRA claim, named for
/// the refusal; None when nobody. Records are read as the watch reads
/// them (no link followed, root's files, bounded); one that cannot be
/// read, or names no live init, takes no name.
pub(super) fn tenant_holder(
    root: &Path,
    own_id: &str,
    tenant: &str,
    alive: &dyn Fn(Option<(u32, u64)>) -> bool,
) -> Option<String> {
    use cuslice_host::container::ClaimRecord;
    use cuslice_host::layout::CLAIM_RECORD;
    use cuslice_host::text::clean;
    use std::ffi::OsStr;
    let root = Dir::open(root).ok()?;
    // A container's quota file where the layout has it (in its quota
    // directory, or where an older hook put it: such containers hold
    // their tenant names too), a claim's in its directory.
    let tenant_of = |d: &Dir, kind: SliceKind| -> Option<String> {
        let q = layout::open_quota_dir(d, kind, None).ok()?.dir;
        let text = q.read_file(QUOTA_FILE, config::MAX_FILE_BYTES).ok()?;
        let cfg = config::parse_file(&q.join(QUOTA_FILE), &text).ok()?;
        Some(cfg.tenant_name())
    };
    if let Ok(ctrs) = root.open_dir(CONTAINERS_DIR) {
        let mut ids: Vec<_> = ctrs.list().unwrap_or_default();
        ids.sort();
        for id in ids {
            if id == OsStr::new(own_id) {
                continue;
            }
            let Ok(d) = ctrs.open_dir(&id) else { continue };
            let Some(meta) = d
                .read_file(CONTAINER_RECORD, container::RECORD_MAX)
                .ok()
                .and_then(|t| serde_json::from_str::<ContainerMeta>(&t).ok())
            else {
                continue;
            };
            if meta.claim.is_some() || !alive(meta.init()) {
                continue;
            }
            if tenant_of(&d, SliceKind::Container).as_deref() == Some(tenant) {
                return Some(format!("container {}", clean(&id.to_string_lossy())));
            }
        }
    }
    if let Ok(claims) = root.open_dir(CLAIMS_DIR) {
        let mut uids: Vec<_> = claims.list().unwrap_or_default();
        uids.sort();
        for uid in uids {
            let Ok(d) = claims.open_dir(&uid) else {
                continue;
            };
            if tenant_of(&d, SliceKind::Claim).as_deref() != Some(tenant) {
                continue;
            }
            let uid = clean(&uid.to_string_lossy());
            let named = d
                .read_file(CLAIM_RECORD, container::CLAIM_RECORD_MAX)
                .ok()
                .and_then(|t| serde_json::from_str::<ClaimRecord>(&t).ok())
                .and_then(|r| r.namespaced_name());
            return Some(match named {
                Some(n) => format!("DRA claim {} ({uid})", clean(&n)),
                None => format!("DRA claim {uid}"),
            });
        }
    }
    None
}
