use std::path::Path;

use cuslice_core::config::{self, Config};

use super::plan::Field;
use super::*;
use cuslice_host::resize::Change;

#[test]
fn a_grace_is_a_duration_as_memory_wait_takes_one() {
    assert_eq!(parse_grace("30s"), Ok(30.0));
    assert_eq!(parse_grace("500ms"), Ok(0.5));
    assert_eq!(parse_grace("2m"), Ok(120.0));
    assert_eq!(parse_grace("0"), Ok(0.0));
    assert_eq!(parse_grace("1h"), Ok(3600.0));
    for bad in ["", "-1s", "2h", "1.5s", "30", "30 potatoes"] {
        let e = parse_grace(bad).expect_err(bad);
        assert!(e.starts_with("--grace "), "{e}");
    }
}

fn cfg(text: &str) -> config::QuotaEdit {
    config::QuotaEdit::parse(Path::new("/r/quota.toml"), text).expect("quota")
}

const UUID: &str = "GPU-8f3c2a1e-5b7d-4c2e-9a1b-0c3d4e5f6a7b";
const G: u64 = 1 << 30;

fn planned(
    text: &str,
    entry: &Entry,
    fields: &[(Field, u64)],
) -> Result<(Vec<Change>, Config), String> {
    let mut t = cfg(text);
    let p = Path::new("/r/quota.toml");
    let c = plan(&mut t, entry, fields, p, "container x")?;
    let (new, _) = t.render("c").map_err(|e| e.to_string())?;
    Ok((
        c,
        config::parse_file(p, &new).expect("renders a valid file"),
    ))
}

#[test]
fn memory_for_all_gpus_changes_all_and_only_the_fields_given() {
    let all = Entry::All { named: false };
    let (c, new) = planned(
        "tenant = \"t\"\nslice = \"ctr-x\"\n[all]\nmemory = \"8GiB\"\ncompute = 30\n",
        &all,
        &[(Field::Memory, 4 * G)],
    )
    .expect("planned");
    assert_eq!(
        c,
        [Change {
            entry: "all".into(),
            field: "memory".into(),
            from: Some(8 * G),
            to: 4 * G
        }]
    );
    assert_eq!(new.all.memory, Some(4 * G));
    assert_eq!(new.all.compute, Some(30));
    assert_eq!(new.tenant.as_deref(), Some("t"));
    assert_eq!(new.slice.as_deref(), Some("ctr-x"));
    // Already so: nothing.
    let (c, _) = planned(
        "[all]\nmemory = \"8GiB\"\n",
        &all,
        &[(Field::Memory, 8 * G)],
    )
    .expect("planned");
    assert!(c.is_empty());
    // A share given by its ceiling alone: that is what it was.
    let (c, new) =
        planned("[all]\ncompute_max = 50\n", &all, &[(Field::Compute, 20)]).expect("planned");
    assert_eq!(c[0].from, Some(50));
    assert_eq!((new.all.compute, new.all.compute_max), (Some(20), Some(50)));
}

#[test]
fn what_a_resize_cannot_do_live_is_one_line_naming_why() {
    let all = Entry::All { named: false };
    // No memory quota: the processes registered none.
    let e = planned("[all]\ncompute = 30\n", &all, &[(Field::Memory, G)]).expect_err("none");
    assert_eq!(
        e,
        "container x has no memory quota for every GPU ([all]): its processes registered none, and cannot take one on while they run (--memory /r/quota.toml)"
    );
    let e = planned("[all]\nmemory = \"1GiB\"\n", &all, &[(Field::Compute, 30)]).expect_err("none");
    assert!(
        e.contains("has no compute share or ceiling for every GPU"),
        "{e}"
    );
    // Given by index.
    let e = planned(
        "[all]\nmemory = \"1GiB\"\n[device.0]\nmemory = \"2GiB\"\n",
        &Entry::Gpu(config::parse_uuid(UUID).expect("uuid")),
        &[(Field::Memory, G)],
    )
    .expect_err("index");
    assert!(
        e.starts_with("/r/quota.toml: memory is given by index in [device.0]: "),
        "{e}"
    );
    // Per GPU too, and no entry named.
    let text = format!("[all]\nmemory = \"1GiB\"\n[device.\"{UUID}\"]\nmemory = \"2GiB\"\n");
    let e = planned(&text, &all, &[(Field::Memory, G)]).expect_err("per GPU");
    assert_eq!(
        e,
        format!(
            "/r/quota.toml: memory is given per GPU in [device.\"{UUID}\"] as well as in [all]: say which entry with --device (all, or a GPU's UUID)"
        )
    );
    // A GPU's entry alone (a DRA claim's file): that one.
    let u = config::parse_uuid(UUID).expect("uuid");
    let (c, new) = planned(
        &format!("[device.\"{UUID}\"]\nmemory = \"2GiB\"\ncompute = 50\n"),
        &all,
        &[(Field::Memory, G), (Field::Compute, 40)],
    )
    .expect("the GPU's entry");
    assert_eq!(c[0].entry, format!("device.{UUID}"));
    assert_eq!(
        (new.limits_for(0, &u).memory, new.limits_for(0, &u).compute),
        (Some(G), Some(40))
    );
    assert_eq!(new.all.memory, None);
    // Named: [all] changes, the GPU's own entry keeps its value.
    let (_, new) = planned(
        &text,
        &Entry::All { named: true },
        &[(Field::Memory, 3 * G)],
    )
    .expect("named");
    let u = config::parse_uuid(UUID).expect("uuid");
    assert_eq!(new.all.memory, Some(3 * G));
    assert_eq!(new.limits_for(0, &u).memory, Some(2 * G));
    // A tenant that may burst: --memory is its guarantee, never past
    // its memory_max (the grammar's line).
    let (_, new) = planned(
        "[all]\nmemory = \"1GiB\"\nmemory_max = \"4GiB\"\n",
        &all,
        &[(Field::Memory, 2 * G)],
    )
    .expect("a guarantee");
    assert_eq!(
        (new.all.memory, new.all.memory_max),
        (Some(2 * G), Some(4 * G))
    );
    let e = planned(
        "[all]\nmemory = \"1GiB\"\nmemory_max = \"2GiB\"\n",
        &all,
        &[(Field::Memory, 3 * G)],
    )
    .expect_err("past memory_max");
    assert!(
        e.contains("all.memory_max: expected at least the guaranteed memory"),
        "{e}"
    );
    // A ceiling below the share: the grammar's line.
    let e = planned("[all]\ncompute = 40\n", &all, &[(Field::ComputeMax, 30)]).expect_err("below");
    assert!(e.contains("/r/quota.toml: all"), "{e}");
    // An index given as the entry.
    let e = Entry::parse(Some("0")).expect_err("index");
    assert!(
        e.starts_with("--device 0: a GPU by index cannot be resized live"),
        "{e}"
    );
}

#[test]
fn a_gpus_own_entry_is_changed_in_its_own_spelling_or_made() {
    let u = config::parse_uuid(UUID).expect("uuid");
    let lower = UUID.to_lowercase();
    let text = format!("[all]\nmemory = \"1GiB\"\n[device.\"{lower}\"]\nmemory = \"2GiB\"\n");
    let mut t = cfg(&text);
    let p = Path::new("/r/quota.toml");
    let c = plan(&mut t, &Entry::Gpu(u), &[(Field::Memory, 3 * G)], p, "x").expect("planned");
    assert_eq!(c[0].entry, format!("device.{UUID}"));
    assert_eq!(c[0].from, Some(2 * G));
    // The one entry, in its own spelling (bare: a UUID needs no quotes).
    let (new, _) = t.render("c").expect("renders");
    assert_eq!(
        new.matches("[device.").collect::<Vec<_>>().len(),
        1,
        "{new}"
    );
    assert!(
        new.contains(&format!("[device.{lower}]\nmemory = 3221225472\n")),
        "{new}"
    );
    // Made from [all] where the GPU has no entry of its own.
    let (_, new) = planned(
        "[all]\nmemory = \"1GiB\"\n",
        &Entry::Gpu(u),
        &[(Field::Memory, 3 * G)],
    )
    .expect("made");
    assert_eq!(new.limits_for(0, &u).memory, Some(3 * G));
    assert_eq!(new.all.memory, Some(G));
}
