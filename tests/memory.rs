//! Memory quotas against the fake driver: exact boundaries for every
//! allocation family, spoofed memory queries, processes racing for one
//! quota, SIGKILL reclaim, multiple GPUs, and fail-closed configuration.
//!
//! The fake is a driver the shim does not know: a context costs it
//! [`FAKE_CTX`], not the [`CHARGED_CTX`] the quota files charge, and it
//! takes whole pages (`FAKE_CUDA_ALLOC_GRANULARITY`, set by each test that
//! depends on it) for large linear allocations. Figures the driver counts
//! are derived from that configuration; figures the quota counts from the
//! quota file.

mod common;

use std::io::{BufRead, BufReader};

use common::{Host, Opts, run};

const MIB: u64 = 1 << 20;

/// What a context costs the fake driver in these tests
/// (`FAKE_CUDA_CTX_OVERHEAD`), unless a test says otherwise...
const FAKE_CTX: u64 = 3 * MIB;
/// ... and what the quota files charge for one (`context_overhead`): not
/// the same, as a quota file cannot know a driver's context cost exactly.
const CHARGED_CTX: u64 = MIB;

/// A host with one container: its quota file (`quota.toml`, whatever text
/// a test gives) and its segment directory (`seg/`) in the host's
/// directory, beside the fake GPU's state.
struct Scene {
    host: Host,
}

impl Scene {
    fn new(name: &str, quota_toml: &str) -> Scene {
        let host = Host::new("mem", name);
        // Both directories named: the shim's defaults are the host's own
        // (/dev/shm/cuslice), which no test may write.
        let text = format!(
            "segment_dir = \"{}\"\ngpu_segment_dir = \"{}\"\n{quota_toml}",
            host.dir.join("seg").display(),
            host.gpu_dir().display()
        );
        std::fs::write(host.dir.join("quota.toml"), text).expect("write quota");
        Scene { host }
    }

    fn env(&self, extra: &[(&'static str, String)]) -> Vec<(&'static str, String)> {
        let mut v = self.host.env(Some(&self.host.dir.join("quota.toml")));
        v.push(("FAKE_CUDA_MEM", "16GiB".to_string()));
        // The fake's default page (2 MiB, as current GPUs), unless a test
        // sets another.
        common::set_env(
            &mut v,
            "FAKE_CUDA_ALLOC_GRANULARITY",
            &(2 * MIB).to_string(),
        );
        v.push(("FAKE_CUDA_CTX_OVERHEAD", FAKE_CTX.to_string()));
        for (k, val) in extra {
            common::set_env(&mut v, k, val);
        }
        v
    }

    /// 40 MiB on each of two GPUs (`memtest devices`), which must run.
    fn run_on_two_gpus(&self) -> common::Run {
        let r = self.run(
            &["devices", &(40 * MIB).to_string(), &(40 * MIB).to_string()],
            &[("FAKE_CUDA_DEVICES", "2".into())],
        );
        r.assert_ok();
        r
    }

    fn run(&self, args: &[&str], extra: &[(&'static str, String)]) -> common::Run {
        run_args(
            "memtest",
            args,
            Opts {
                env: self.env(extra),
                ..Opts::default()
            },
        )
    }
}

fn run_args(prog: &str, args: &[&str], opts: Opts<'_>) -> common::Run {
    run(
        prog,
        Opts {
            args: args.iter().map(|a| a.to_string()).collect(),
            ..opts
        },
    )
}

/// A 65 MiB quota charging [`CHARGED_CTX`] for a context: 64 MiB usable.
const QUOTA: &str = "context_overhead = \"1MiB\"\n[all]\nmemory = \"65MiB\"\n";
const QUOTA_BYTES: u64 = 65 * MIB;
const USABLE: u64 = QUOTA_BYTES - CHARGED_CTX;

/// What the fake driver takes for a linear allocation of `size` bytes
/// with pages of `page` bytes (`FAKE_CUDA_ALLOC_GRANULARITY`): whole pages
/// from one page up, else `size`.
fn pages(size: u64, page: u64) -> u64 {
    if size < page {
        size
    } else {
        size.div_ceil(page) * page
    }
}

#[test]
fn every_family_stops_exactly_at_the_quota() {
    let s = Scene::new("boundary", QUOTA);
    for family in [
        "alloc", "alloc_v1", "managed", "pitch", "pitch_v1", "async", "pool", "vmm", "array",
        "array3d", "mipmap",
    ] {
        let r = s.run(&["boundary", family, &USABLE.to_string()], &[]);
        r.assert_ok();
        // fill fits to the byte, one more unit is OUT_OF_MEMORY (2), the
        // free credits everything back.
        assert_eq!(
            r.results(),
            vec![format!("R {family} fill=0 over=2 free=0 refill=0 plain=0").as_str()],
            "{family}:\n{}",
            r.stderr
        );
        assert!(
            r.stderr.contains("out of memory under the quota on GPU 0"),
            "{family}: the first refusal is explained:\n{}",
            r.stderr
        );
    }
}

#[test]
fn host_memory_made_by_cumemcreate_is_not_charged_to_the_gpus_quota() {
    // cuMemCreate with location HOST makes pinned host memory a kernel
    // reaches through a mapping (what evictable burst would move a
    // borrower's memory into): not the GPU's. Held at twice the quota, the
    // whole quota is still there for a plain allocation; charged as device
    // memory (the mutant: the location not checked), the host memory
    // alone would be refused.
    let s = Scene::new("host-vmm", QUOTA);
    let r = s.run(
        &[
            "hostvmm",
            &(2 * QUOTA_BYTES).to_string(),
            &USABLE.to_string(),
        ],
        &[],
    );
    r.assert_ok();
    assert_eq!(
        r.results(),
        vec!["R hostvmm create=0 map=0 plain=0 release=0"],
        "{}",
        r.stderr
    );
}

#[test]
fn pitched_rows_are_charged_what_the_driver_padded_them_to_whatever_its_alignment() {
    // Rows of 2200 bytes, padded by the (fake) driver to its pitch
    // alignment: below the shim's admission bound (512-byte rows), equal
    // to it, or above it (the charge then grows after the call). The
    // quota must account exactly pitch x rows, through the legacy entry
    // point too: not the requested width, not the shim's bound, not
    // nothing.
    // With the driver's pages (64 KiB, 2 MiB) on top: 2.2 to 3.1 MB in
    // whole pages.
    let s = Scene::new("pitch-align", QUOTA);
    let rows: u64 = 1000;
    for page in [64 << 10, 2 * MIB] {
        for align in [256u64, 512, 1024] {
            let pitch = 2200u64.div_ceil(align) * align;
            let used = CHARGED_CTX + pages(pitch * rows, page);
            for entry in ["v1", "v2"] {
                let r = s.run(
                    &["pitched", entry, &rows.to_string()],
                    &[
                        ("FAKE_CUDA_PITCH_ALIGN", align.to_string()),
                        ("FAKE_CUDA_ALLOC_GRANULARITY", page.to_string()),
                    ],
                );
                r.assert_ok();
                assert_eq!(
                    r.results(),
                    vec![format!("R pitched r=0 pitch={pitch} used={used}").as_str()],
                    "page {page}, alignment {align}, {entry}:\n{}",
                    r.stderr
                );
            }
        }
    }
}

#[test]
fn every_memory_query_reports_the_quota() {
    let s = Scene::new("info", QUOTA);
    let r = s.run(&["info", &(10 * MIB).to_string()], &[]);
    r.assert_ok();
    // The quota, and what it charges: the context (its file's figure, not
    // the driver's) + 10 MiB allocated.
    let (total, used) = (QUOTA_BYTES, CHARGED_CTX + 10 * MIB);
    let free = total - used;
    assert_eq!(
        r.results(),
        vec![
            format!("R cuMemGetInfo_v2 free={free} total={total}").as_str(),
            &format!("R cuMemGetInfo free={free} total={total}"),
            &format!("R cuDeviceTotalMem_v2 {total}"),
            &format!("R cuDeviceTotalMem {total}"),
            &format!("R nvmlDeviceGetMemoryInfo 0 total={total} used={used} free={free}"),
            &format!("R nvmlDeviceGetMemoryInfo_v2 0 total={total} used={used} free={free}"),
        ],
        "{}",
        r.stderr
    );
}

#[test]
fn without_a_quota_memory_queries_pass_through() {
    let s = Scene::new("noquota", "");
    let r = s.run(&["info", &(10 * MIB).to_string()], &[]);
    r.assert_ok();
    let total = 16u64 << 30;
    assert!(
        r.results()
            .contains(&format!("R cuDeviceTotalMem_v2 {total}").as_str()),
        "{}",
        r.stdout
    );
    // The driver's own figures: its context's cost, 10 MiB allocated.
    assert!(
        r.results().contains(
            &format!(
                "R cuMemGetInfo_v2 free={} total={total}",
                total - FAKE_CTX - 10 * MIB
            )
            .as_str()
        ),
        "{}",
        r.stdout
    );
}

#[test]
fn saturating_info_when_usage_tops_the_quota() {
    // Usage exactly at the quota: free is 0, total the quota, no error.
    let s = Scene::new(
        "saturate",
        "context_overhead = 0\n[all]\nmemory = \"64MiB\"\n",
    );
    let r = s.run(&["info", &(64 * MIB).to_string()], &[]);
    r.assert_ok();
    assert!(
        r.results()[0].starts_with("R cuMemGetInfo_v2 free=0 total=67108864"),
        "{}",
        r.stdout
    );
}

#[test]
fn two_processes_racing_never_exceed_the_quota() {
    let s = Scene::new("race", QUOTA);
    // Chunks of 24 MiB (whole pages): at most two fit in what is left
    // after the contexts; the fake's device-wide usage (ground truth) is
    // checked after every operation against what the quota allows the
    // driver to hold: the quota, plus what each of the two contexts costs
    // the driver beyond its charge, plus the context of a process that has
    // given its slot back at exit while the driver still holds its context
    // (docs/threat-model.md: memory is credited at a normal exit slightly
    // before the driver frees it).
    let quota = QUOTA_BYTES + 2 * (FAKE_CTX - CHARGED_CTX) + CHARGED_CTX;
    let args = ["race", "1000", &(24 * MIB).to_string(), &quota.to_string()];
    let opts = || Opts {
        args: args.iter().map(|a| a.to_string()).collect(),
        env: s.env(&[("CUSLICE_LOG", "warn".into())]),
        ..Opts::default()
    };
    let a = common::spawn("memtest", &opts());
    let b = common::spawn("memtest", &opts());
    for child in [a, b] {
        let out = child.wait_with_output().expect("wait");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("R violations=0"), "{stdout}");
        let line = stdout
            .lines()
            .find(|l| l.starts_with("D grants="))
            .expect("counts");
        assert!(
            !line.ends_with("refusals=0"),
            "the race must hit the quota: {line}"
        );
    }
}

#[test]
fn sigkilled_process_gives_its_memory_back() {
    let s = Scene::new("kill", QUOTA);
    let holder = Opts {
        args: vec!["hold".into(), (48 * MIB).to_string()],
        env: s.env(&[]),
        ..Opts::default()
    };
    let mut child = common::spawn("memtest", &holder);
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(|l| l.ok()).as_deref(), Some("R held"));
    // While it lives, its 48 MiB count against the container.
    let r = s.run(&["alloc", &(48 * MIB).to_string()], &[]);
    assert_eq!(r.results(), vec!["R alloc=2"], "{}", r.stderr);
    child.kill().expect("kill -9");
    child.wait().expect("wait");
    // Its slot lock died with it: the next process reclaims its usage.
    let r = s.run(&["alloc", &(48 * MIB).to_string()], &[]);
    assert_eq!(r.results(), vec!["R alloc=0"], "{}", r.stderr);
}

#[test]
fn each_gpu_has_its_own_quota() {
    let s = Scene::new(
        "multi",
        "context_overhead = \"1MiB\"\n[all]\nmemory = \"65MiB\"\n[device.1]\nmemory = \"33MiB\"\n",
    );
    let r = s.run_on_two_gpus();
    assert_eq!(
        r.results(),
        vec![
            format!("R dev0 alloc=0 total={}", 65 * MIB).as_str(),
            &format!("R dev1 alloc=2 total={}", 33 * MIB),
        ],
        "{}",
        r.stderr
    );
}

#[test]
fn bad_quota_file_fails_cuinit_with_one_line() {
    let s = Scene::new("bad", "[all]\nmemory = \"4 potatoes\"\n");
    let r = s.run(&["alloc", "1024"], &[]);
    assert_fails_closed_with(&r, "quota.toml: all.memory: expected a size like 4GiB");
}

/// cuInit refused (so the program fails), with one error line, holding
/// `what`.
fn assert_fails_closed_with(r: &common::Run, what: &str) {
    assert!(!r.out.status.success(), "{}", r.stderr);
    assert!(
        r.stderr.contains("cuInit(0) -> 800"),
        "cuInit must fail closed: {}",
        r.stderr
    );
    let errors: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains(": error: "))
        .collect();
    assert_eq!(errors.len(), 1, "{}", r.stderr);
    assert!(errors[0].contains(what), "{}", errors[0]);
}

#[test]
fn a_misspelt_limit_variable_fails_cuinit_with_one_line() {
    // Without a quota file, CUSLICE_MEMORY_64 (device indices end at 63)
    // would be a limit dropped without a word: cuInit refuses instead.
    let s = Scene::new("typo", "");
    let mut env = s.host.env(None);
    env.extend([
        ("CUSLICE_CONFIG", String::new()),
        ("CUSLICE_MEMORY", "1GiB".to_string()),
        ("CUSLICE_MEMORY_64", "1GiB".to_string()),
    ]);
    let r = run_args(
        "memtest",
        &["alloc", "1024"],
        Opts {
            env,
            ..Opts::default()
        },
    );
    assert_fails_closed_with(&r, "CUSLICE_MEMORY_64: not a variable cuslice reads");
}

#[test]
fn a_limit_variable_in_another_case_fails_cuinit_naming_its_spelling() {
    // `cuslice_memory=1GiB` alone would leave the program unlimited
    // without a word (names are read as spelt): cuInit refuses, naming
    // the variable and its upper-case spelling.
    for (name, value) in [
        ("cuslice_memory", "1GiB"),
        ("Cuslice_Memory", "1GiB"),
        ("cuda_device_memory_limit", "2g"),
    ] {
        let s = Scene::new(&format!("case-{name}"), "");
        let mut env = s.host.env(None);
        env.extend([("CUSLICE_CONFIG", String::new()), (name, value.to_string())]);
        let r = run_args(
            "memtest",
            &["alloc", "1024"],
            Opts {
                env,
                ..Opts::default()
            },
        );
        assert_fails_closed_with(
            &r,
            &format!(
                "{name}: not a variable cuslice reads (names are upper-case), so its limit would be dropped: expected {}",
                name.to_ascii_uppercase()
            ),
        );
    }
}

#[test]
fn a_device_entry_no_visible_gpu_matches_is_said_not_dropped_silently() {
    // [device.3] in a process that sees two GPUs limits nothing: the shim
    // says so at the default log level, and the entries that match apply.
    let s = Scene::new(
        "unmatched",
        "context_overhead = \"1MiB\"\n[device.1]\nmemory = \"33MiB\"\n[device.3]\nmemory = \"64MiB\"\n",
    );
    let r = s.run_on_two_gpus();
    let said: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains(": warning: "))
        .collect();
    assert_eq!(said.len(), 1, "{}", r.stderr);
    assert!(
        said[0].contains(
            "quota.toml: device.3 matches none of the 2 GPUs this process sees (CUDA_VISIBLE_DEVICES unset): its limits apply to no GPU here"
        ),
        "{}",
        said[0]
    );
    assert_eq!(
        r.results(),
        vec![
            "R dev0 alloc=0 total=17179869184",
            &format!("R dev1 alloc=2 total={}", 33 * MIB),
        ],
        "{}",
        r.stderr
    );
}

#[test]
fn a_quota_below_the_context_overhead_is_said_at_the_start() {
    // 512 MiB under the default 640 MiB charged per context: the first
    // context is refused; the shim says why before it is.
    let s = Scene::new("small", "[all]\nmemory = \"512MiB\"\n");
    let r = s.run(&["alloc", "1024"], &[]);
    let said: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains(": warning: "))
        .collect();
    assert_eq!(said.len(), 1, "{}", r.stderr);
    assert!(
        said[0].contains(
            "the memory quota 512MiB is below the 640MiB each process is charged for its CUDA context (context_overhead)"
        ),
        "{}",
        said[0]
    );
}

#[test]
fn environment_quota_applies_without_a_file() {
    let s = Scene::new("env", "");
    let seg = s.host.dir.join("seg").display().to_string();
    let mut env = s.host.env(None);
    env.extend([
        ("CUSLICE_CONFIG", String::new()),
        ("CUDA_DEVICE_MEMORY_LIMIT", "65m".to_string()),
        ("CUSLICE_CONTEXT_OVERHEAD", "1MiB".to_string()),
        ("CUSLICE_SEGMENT_DIR", seg),
    ]);
    let r = run_args(
        "memtest",
        &["boundary", "alloc", &USABLE.to_string()],
        Opts {
            env,
            ..Opts::default()
        },
    );
    assert_eq!(
        r.results(),
        vec!["R alloc fill=0 over=2 free=0 refill=0 plain=0"],
        "{}",
        r.stderr
    );
}

#[test]
fn a_file_is_not_raised_by_the_environment() {
    let s = Scene::new("authoritative", QUOTA);
    let r = s.run(
        &["alloc", &(100 * MIB).to_string()],
        &[("CUDA_DEVICE_MEMORY_LIMIT", "8g".into())],
    );
    assert_eq!(r.results(), vec!["R alloc=2"], "{}", r.stderr);
    assert!(
        r.stderr
            .contains("CUDA_DEVICE_MEMORY_LIMIT is set but ignored"),
        "{}",
        r.stderr
    );
}

/// A process whose configuration gives another quota than the one a
/// running container's segment holds (a `cuslice resize` it raced, a file
/// edited by hand) is held to the segment's, and says so.
#[test]
fn a_process_whose_quota_differs_from_its_segments_is_held_to_the_segments() {
    let s = Scene::new("mismatch", QUOTA);
    let holder = Opts {
        args: vec!["hold".into(), MIB.to_string()],
        env: s.env(&[]),
        ..Opts::default()
    };
    let mut child = common::spawn("memtest", &holder);
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    assert_eq!(lines.next().and_then(|l| l.ok()).as_deref(), Some("R held"));
    std::fs::write(
        s.host.dir.join("other.toml"),
        format!(
            "segment_dir = \"{}\"\ngpu_segment_dir = \"{}\"\ncontext_overhead = \"1MiB\"\n[all]\nmemory = \"1GiB\"\n",
            s.host.dir.join("seg").display(),
            s.host.gpu_dir().display()
        ),
    )
    .expect("write");
    let other = [(
        "CUSLICE_CONFIG",
        s.host.dir.join("other.toml").display().to_string(),
    )];
    // Within the segment's quota (QUOTA, 65 MiB): granted; past it, though
    // within the 1 GiB this process's file says: refused.
    let r = s.run(&["alloc", &(MIB).to_string()], &other);
    let r2 = s.run(&["alloc", &(128 * MIB).to_string()], &other);
    child.kill().expect("kill");
    let _ = child.wait();
    assert_eq!(r.results(), vec!["R alloc=0"], "{}", r.stderr);
    assert!(
        r.stderr.contains(&format!(
            "the container's memory quota is {QUOTA_BYTES} bytes in its segment"
        )),
        "{}",
        r.stderr
    );
    assert_eq!(r2.results(), vec!["R alloc=2"], "{}", r2.stderr);
    assert!(
        r2.stderr.contains("out of memory under the quota"),
        "{}",
        r2.stderr
    );
}

/// Issue 41 item 7: jobs one after another in one segment directory with
/// bare LD_PRELOAD and a quota each from the environment: each is told,
/// and held to, its own (the second was told the first's 2 GiB, with a
/// warning that "the segment's applies"), silently.
#[test]
fn sequential_jobs_in_one_segment_get_each_its_own_quota() {
    let s = Scene::new("sequential", "");
    let seg = s.host.dir.join("seg").display().to_string();
    let job = |limit: &str| {
        let mut env = s.host.env(None);
        env.extend([
            ("CUSLICE_CONFIG", String::new()),
            ("CUDA_DEVICE_MEMORY_LIMIT", limit.to_string()),
            ("CUSLICE_CONTEXT_OVERHEAD", "1MiB".to_string()),
            ("CUSLICE_SEGMENT_DIR", seg.clone()),
            ("FAKE_CUDA_MEM", "16GiB".to_string()),
        ]);
        run_args(
            "memtest",
            &["info", "0"],
            Opts {
                env,
                ..Opts::default()
            },
        )
    };
    for (limit, bytes) in [("2g", 2u64 << 30), ("8g", 8 << 30), ("1g", 1 << 30)] {
        let r = job(limit);
        r.assert_ok();
        assert!(
            r.results()
                .contains(&format!("R cuDeviceTotalMem_v2 {bytes}").as_str()),
            "{limit}: {}\n{}",
            r.stdout,
            r.stderr
        );
        assert!(
            !r.stderr.contains("the segment's applies"),
            "{limit}: {}",
            r.stderr
        );
    }
}

/// The array table (16384 entries) full: the next array is destroyed again
/// and refused, and its charge given back at once, not kept until exit;
/// destroying the rest credits everything.
#[test]
fn an_array_the_full_table_cannot_record_is_refused_and_not_charged() {
    let s = Scene::new("arrays", QUOTA);
    let r = s.run(&["arrays", "20000"], &[("CUSLICE_LOG", "warn".into())]);
    r.assert_ok();
    // 16384 one-byte arrays on top of the context's charge.
    assert_eq!(
        r.results(),
        vec![
            format!(
                "R arrays created=16384 refused=2 used={} after={CHARGED_CTX} errors=0",
                CHARGED_CTX + 16384
            )
            .as_str()
        ],
        "{}",
        r.stderr
    );
    let full: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains("array table is full"))
        .collect();
    assert_eq!(full.len(), 1, "{}", r.stderr);
    assert!(
        full[0].contains("(1 bytes on GPU 0) was freed again, its charge given back to the quota"),
        "{}",
        r.stderr
    );
}

/// One `memtest fill CHUNK`: (allocations, last status, the driver's
/// count, the quota's count).
fn fill(s: &Scene, chunk: u64, extra: &[(&'static str, String)]) -> (u64, i32, u64, u64) {
    let r = s.run(&["fill", &chunk.to_string()], extra);
    r.assert_ok();
    let line = r
        .results()
        .into_iter()
        .find_map(|l| l.strip_prefix("R fill "))
        .unwrap_or_else(|| panic!("no fill line:\n{}\n{}", r.stdout, r.stderr))
        .to_string();
    let v: Vec<u64> = line
        .split(' ')
        .map(|kv| {
            kv.split_once('=')
                .and_then(|(_, v)| v.parse::<i64>().ok())
                .unwrap_or_else(|| panic!("{line}")) as u64
        })
        .collect();
    (v[0], v[1] as i32, v[2], v[3])
}

/// The driver takes whole pages for a large allocation (2 MiB on current
/// GPUs): a quota that counted the bytes asked for would let chunks just
/// over a page hold twice the quota in the driver's own count. Whatever
/// the page (64 KiB, 2 MiB, 8 MiB) and the chunk (just over a page, a page
/// and a half, half a page: sub-allocated, taken as asked), the shim
/// charges what the driver takes, to the byte: the driver never holds more
/// than the quota plus what the context costs it beyond its charge, and
/// the next chunk would not have fit.
#[test]
fn the_driver_never_holds_more_than_the_quota_whatever_its_page() {
    let s = Scene::new("pages", QUOTA);
    for page in [64 << 10, 2 * MIB, 8 * MIB] {
        let extra = [("FAKE_CUDA_ALLOC_GRANULARITY", page.to_string())];
        for chunk in [page + 1, page + page / 2, page / 2] {
            let what = format!("page {page}, chunks of {chunk}");
            let (n, r, truth, charged) = fill(&s, chunk, &extra);
            let taken = pages(chunk, page);
            assert_eq!(r, 2, "{what}: stopped by the quota (OUT_OF_MEMORY)");
            assert_eq!(truth, FAKE_CTX + n * taken, "{what}: the driver's count");
            assert_eq!(charged, CHARGED_CTX + n * taken, "{what}: charged");
            assert!(
                truth <= QUOTA_BYTES + FAKE_CTX - CHARGED_CTX,
                "{what}: the driver holds {truth} bytes"
            );
            assert!(
                charged + taken > QUOTA_BYTES,
                "{what}: refused with {charged} of {QUOTA_BYTES} charged"
            );
        }
    }
}

/// A context costs what the driver takes; the quota charges its file's
/// `context_overhead` (docs/memory-quota.md). When the two differ, by 44
/// MiB either way (300 vs 256 MiB): the quota's figures (what a program
/// sees, what admission holds) carry the file's charge, the driver's carry
/// its own cost, and the driver holds at most the quota plus what the
/// context costs beyond its charge (less, by the overcharge, when the
/// context costs less).
#[test]
fn a_context_is_charged_its_files_figure_whatever_it_costs_the_driver() {
    for (cost, charge) in [(300 * MIB, 256 * MIB), (256 * MIB, 300 * MIB)] {
        let what = format!("a context costing {cost}, charged {charge}");
        let s = Scene::new(
            "context",
            &format!("context_overhead = {charge}\n[all]\nmemory = \"1GiB\"\n"),
        );
        let quota = 1u64 << 30;
        let chunk = 64 * MIB;
        let (n, r, truth, charged) = fill(
            &s,
            chunk,
            &[
                ("FAKE_CUDA_CTX_OVERHEAD", cost.to_string()),
                ("FAKE_CUDA_ALLOC_GRANULARITY", (2 * MIB).to_string()),
            ],
        );
        assert_eq!(r, 2, "{what}: stopped by the quota");
        assert_eq!(n, (quota - charge) / chunk, "{what}: chunks admitted");
        assert_eq!(charged, charge + n * chunk, "{what}: charged");
        assert_eq!(truth, cost + n * chunk, "{what}: the driver's count");
        assert!(
            truth <= quota + cost.saturating_sub(charge),
            "{what}: the driver holds {truth} bytes"
        );
    }
}
