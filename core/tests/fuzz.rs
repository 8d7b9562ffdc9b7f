//! Hostile input: arbitrary quota files, environments and segment files
//! never panic or hang, and every rejection is one line that says where.
//! `cargo test` runs a short smoke; `scripts/fuzz.sh` runs it for longer
//! (PROPTEST_CASES).

use std::path::Path;

use cuslice_core::config;
use cuslice_core::gpu::GpuSegment;
use cuslice_core::segment::{self, Segment};
use proptest::prelude::*;

fn one_line(e: &str) -> bool {
    !e.is_empty() && !e.contains('\n')
}

/// Text shaped like quota files: keys and values of the grammar, mutated.
fn quota_like() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "tenant",
        "segment_dir",
        "gpu_segment_dir",
        "context_overhead",
        "memory",
        "compute",
        "compute_max",
        "memroy",
        "x",
    ]);
    let value = prop::sample::select(vec![
        "\"4GiB\"",
        "\"4 potatoes\"",
        "0",
        "-1",
        "1048576",
        "\"30%\"",
        "101",
        "true",
        "[1]",
        "\"/run/x\"",
        "\"rel\"",
        "\"GPU-00000000-0000-0000-0000-000000000000\"",
        "9223372036854775807",
        "\"1.5g\"",
        "\"\"",
    ]);
    let table = prop::sample::select(vec![
        "",
        "[all]\n",
        "[device.0]\n",
        "[device.99]\n",
        "[device.\"GPU-x\"]\n",
        "[[all]]\n",
    ]);
    prop::collection::vec((table, key, value), 0..8).prop_map(|v| {
        v.into_iter()
            .map(|(t, k, val)| format!("{t}{k} = {val}\n"))
            .collect::<String>()
    })
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics(text in ".{0,400}") {
        match config::parse_file(Path::new("/q.toml"), &text) {
            Ok(_) => {}
            Err(e) => prop_assert!(one_line(&e.0) && e.0.starts_with("/q.toml: "), "{}", e.0),
        }
    }

    #[test]
    fn quota_shaped_text_is_accepted_or_explained(text in quota_like()) {
        match config::parse_file(Path::new("/q.toml"), &text) {
            Ok(c) => {
                // Whatever parses is within the documented ranges.
                for l in std::iter::once(&c.all).chain(c.by_index.values()).chain(c.by_uuid.values()) {
                    if let Some(m) = l.memory { prop_assert!((config::MIN_MEMORY..=config::MAX_MEMORY).contains(&m)); }
                    if let Some(p) = l.compute { prop_assert!((1..=100).contains(&p)); }
                    if let (Some(a), Some(b)) = (l.compute, l.compute_max) { prop_assert!(b >= a); }
                }
            }
            Err(e) => prop_assert!(one_line(&e.0) && e.0.starts_with("/q.toml: "), "{}", e.0),
        }
    }

    #[test]
    fn arbitrary_environments_never_panic(
        vars in prop::collection::vec((prop::sample::select(vec![
            "CUSLICE_MEMORY", "CUSLICE_MEMORY_0", "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT_3",
            "CUDA_DEVICE_SM_LIMIT", "CUSLICE_COMPUTE", "CUSLICE_COMPUTE_MAX", "CUSLICE_SEGMENT_DIR", "CUSLICE_TENANT",
        ]), ".{0,24}"), 0..6)
    ) {
        let map: std::collections::BTreeMap<&str, String> = vars.into_iter().collect();
        // No quota file: CUSLICE_CONFIG unset, and a default path that does
        // not exist (not the host's /etc/cuslice/quota.toml: a host-wide
        // file once made this test pass every case without running one).
        let none = Path::new("/nonexistent/cuslice-fuzz/quota.toml");
        match config::load_with(&|k| map.get(k).cloned(), none) {
            Ok(_) => {}
            Err(e) => prop_assert!(one_line(&e.0), "{}", e.0),
        }
    }

    #[test]
    fn arbitrary_sizes_percents_and_uuids_parse_to_what_they_say(s in ".{0,32}") {
        // Whatever is accepted means one thing: a size is its byte count
        // again, a percentage is 1..=100, a UUID formats back to itself;
        // whatever is refused says so on one line.
        match config::parse_size(&s) {
            Ok(n) => prop_assert_eq!(config::parse_size(&n.to_string()), Ok(n)),
            Err(e) => prop_assert!(one_line(&e), "{}", e),
        }
        match config::parse_percent(&s) {
            Ok(p) => prop_assert!((1..=100).contains(&p), "{s:?} -> {p}"),
            Err(e) => prop_assert!(one_line(&e), "{}", e),
        }
        match config::parse_uuid(&s) {
            Ok(u) => prop_assert_eq!(config::parse_uuid(&config::format_uuid(&u)), Ok(u)),
            Err(e) => prop_assert!(one_line(&e), "{}", e),
        }
    }
}

// Segment files with arbitrary contents (right size, random bytes; or
// mutations of a valid header) are refused with one line, never used.
proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn corrupt_memory_segments_are_refused(flips in prop::collection::vec((0usize..128, any::<u8>()), 1..6)) {
        let dir = std::env::temp_dir().join(format!("cuslice-fuzz-{}-{}", std::process::id(), rand_tag(&flips)));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("memory.seg");
        let _ = std::fs::remove_file(&path);
        drop(Segment::open_or_create(&path).expect("fresh"));
        let original = std::fs::read(&path).expect("read");
        let mut bytes = original.clone();
        for (i, v) in &flips {
            bytes[*i] = *v;
        }
        std::fs::write(&path, &bytes).expect("write");
        let r = Segment::open_or_create(&path);
        let _ = std::fs::remove_dir_all(&dir);
        // The header's fields are its first 56 bytes (magic, version, sizes,
        // layout parameters); a change to any of them must be refused.
        // Later bytes are padding and shared data, which opening does not
        // judge (they are bounds-checked where read).
        let header_changed = (0..56).any(|i| original[i] != bytes[i]);
        match r {
            Ok(_) => prop_assert!(!header_changed, "a corrupted header was accepted"),
            Err(e) => prop_assert!(one_line(&e.0) && e.0.contains("memory.seg"), "{}", e.0),
        }
    }
}

fn rand_tag(v: &[(usize, u8)]) -> u64 {
    v.iter().fold(1469598103934665603u64, |h, (i, b)| {
        (h ^ (*i as u64) ^ ((*b as u64) << 8)).wrapping_mul(1099511628211)
    })
}

#[test]
fn truncated_zeroed_and_foreign_segment_files_are_refused() {
    let dir = std::env::temp_dir().join(format!("cuslice-fuzz-fixed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", vec![0u8; 100]),
        ("zero-filled", vec![0u8; segment::SIZE]),
        ("foreign", b"#!/bin/sh\necho hello\n".to_vec()),
    ];
    for (name, bytes) in cases {
        let p = dir.join(format!("{name}.seg"));
        std::fs::write(&p, &bytes).expect("write");
        let e = Segment::open_or_create(&p)
            .err()
            .unwrap_or_else(|| panic!("{name} must be refused"));
        assert!(
            one_line(&e.0) && e.0.contains(&format!("{name}.seg")),
            "{name}: {e}"
        );
        let e = GpuSegment::open_or_create(&p)
            .err()
            .unwrap_or_else(|| panic!("{name} must be refused"));
        assert!(one_line(&e.0), "{name}: {e}");
        // The file is left as it was: nothing is overwritten silently.
        assert_eq!(
            std::fs::read(&p).expect("read"),
            bytes,
            "{name} was modified"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
