//! ABI conformance of cuslice's own declarations (`cuda-headers/`) against
//! NVIDIA's real `cuda.h`, `nvml.h` and `cupti.h`.
//!
//! Both sides are parsed with bindgen under the same configuration (the real
//! `cuda.h` with `-D__CUDA_API_VERSION_INTERNAL`, so that every versioned,
//! legacy and `_ptsz`/`_ptds` entry point is declared under its own exported
//! name). Then, for every item our headers declare:
//!
//! 1. functions: the real header declares it, with the same number of
//!    parameters, and every parameter and the return type are the same
//!    canonical type (aliases resolved on each side with that side's own
//!    typedefs, enums reduced to their integer type, integers compared by
//!    size and signedness on this target, pointee const-ness kept, named
//!    structs and unions compared by name, function pointers structurally);
//! 2. typedefs: declared there too, resolving to the same canonical type;
//!    for an enum, that is its underlying integer type;
//! 3. constants: defined there with the same value, and an enum constant
//!    belongs to the enum of the same name there;
//! 4. structs and unions we give a body: same kind, size and alignment, and
//!    every field at the same offset with the same canonical type;
//!    anonymous members are matched by offset and compared structurally,
//!    never by bindgen's generated names. A struct of ours listed in
//!    `SUBSET_RECORDS` describes only part of a real one under our own name:
//!    same size and alignment, and each of its fields not named
//!    `reserved*` is the real one's field of that name, at the same offset
//!    with the same type. Layouts are computed from
//!    bindgen's `#[repr(C)]` output and cross-checked against bindgen's
//!    layout assertions (clang's figures). Structs we declare without a
//!    body only have to exist there.
//!
//! Every mismatch is reported, one line each. Where the real headers come
//! from: see `abi/headers.rs` (`$CUSLICE_CUDA_INCLUDE`,
//! `/usr/local/cuda/include`, or PyPI wheels cached under the target dir).

#[path = "abi/headers.rs"]
mod headers;
#[path = "abi/model.rs"]
mod model;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use model::{Canon, Declared, Input, Model, RecordLayout};

/// `-D__CUDA_API_VERSION_INTERNAL`: declare every entry point under its own
/// exported name instead of `#define cuMemAlloc cuMemAlloc_v2` and co.
const CUDA_ARGS: &[&str] = &["-D__CUDA_API_VERSION_INTERNAL"];

/// `-DNVML_NO_UNVERSIONED_FUNC_DEFS`: the same for `nvml.h` (the legacy
/// entry points, `nvmlDeviceGetComputeRunningProcesses` and its `_v2`,
/// declared under their own names instead of `#define`d to the newest).
const NVML_ARGS: &[&str] = &["-DNVML_NO_UNVERSIONED_FUNC_DEFS"];

/// (our struct, the real struct it is part of): see the module comment.
const SUBSET_RECORDS: &[(&str, &str)] = &[
    // The fields of a kernel activity record that cuslice reads, at CUDA
    // 13.0's offsets and size (later CUPTI versions append fields).
    ("cuslice_cupti_kernel_record", "CUpti_ActivityKernel10"),
];

struct Real {
    cuda: Model,
    nvml: Model,
    cupti: Model,
    /// e.g. "cuda.h 13.5 (CUDA_VERSION 13050), nvml.h and cupti.h from ..."
    description: String,
}

/// NVIDIA's headers, parsed once per test binary.
fn real() -> &'static Real {
    static REAL: OnceLock<Result<Real, String>> = OnceLock::new();
    let r = REAL.get_or_init(|| {
        let h = headers::locate()?;
        let cuda_args: Vec<String> = CUDA_ARGS.iter().map(|s| s.to_string()).collect();
        let cuda = model::parse(&Input::File(&h.cuda_h), &cuda_args)?;
        let nvml_args: Vec<String> = NVML_ARGS.iter().map(|s| s.to_string()).collect();
        let nvml = model::parse(&Input::File(&h.nvml_h), &nvml_args)?;
        // Without CUDA_ARGS: under __CUDA_API_VERSION_INTERNAL cupti.h
        // redefines the _v1 structs that cuda.h then declares too. With
        // cupti_profiler_target.h, which cupti.h does not include (ours
        // declares cuptiProfilerInitialize, which the shim exports).
        let cupti_dir = h.cupti_h.parent().unwrap_or(Path::new("."));
        let cupti = model::parse(
            &Input::Contents {
                name: "cupti_and_profiler_target.h",
                text: "#include <cupti.h>\n#include <cupti_profiler_target.h>\n",
            },
            &[format!("-I{}", cupti_dir.display())],
        )?;
        let version = match cuda.consts.get("CUDA_VERSION").map(|c| &c.value) {
            Some(model::Value::Int(v)) => {
                format!("{}.{} (CUDA_VERSION {v})", v / 1000, v % 1000 / 10)
            }
            _ => "(no CUDA_VERSION)".to_string(),
        };
        Ok(Real {
            description: format!(
                "cuda.h {version} at {}, nvml.h at {} and cupti.h (+ cupti_profiler_target.h) at {}, from {}",
                h.cuda_h.display(),
                h.nvml_h.display(),
                h.cupti_h.display(),
                h.origin
            ),
            cuda,
            nvml,
            cupti,
        })
    });
    match r {
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    }
}

fn our_headers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join("cuda-headers")
}

/// One of our headers: the names it declares and its full model.
struct Ours {
    label: String,
    declared: Declared,
    model: Model,
}

fn ours(input: Input) -> Result<Ours, String> {
    Ok(Ours {
        label: match &input {
            Input::File(p) => p.file_name().unwrap().to_string_lossy().into_owned(),
            Input::Contents { name, .. } => name.to_string(),
        },
        declared: model::declared(&input, &[])?,
        model: model::parse(&input, &[])?,
    })
}

/// What was compared, for the summary line.
#[derive(Default, Debug)]
struct Counts {
    functions: usize,
    aliases: usize,
    consts: usize,
    records: usize,
}

/// Compares one of our headers with the real one it mirrors; returns one
/// line per mismatch.
struct Checker<'a> {
    ours: &'a Model,
    real: &'a Model,
    /// "cuda.h" or "nvml.h", for messages.
    real_label: &'a str,
}

impl Checker<'_> {
    fn same(&self, a: &Canon, b: &Canon) -> bool {
        match (a, b) {
            (Canon::Void, Canon::Void) => true,
            (Canon::Prim { abi: x, .. }, Canon::Prim { abi: y, .. }) => x == y,
            (
                Canon::Ptr {
                    is_const: c1,
                    to: t1,
                },
                Canon::Ptr {
                    is_const: c2,
                    to: t2,
                },
            ) => c1 == c2 && self.same(t1, t2),
            (Canon::Array { elem: e1, len: l1 }, Canon::Array { elem: e2, len: l2 }) => {
                l1 == l2 && self.same(e1, e2)
            }
            (Canon::Record(x), Canon::Record(y)) if model::is_anon(x) && model::is_anon(y) => {
                self.compare_bodies(x, y, "").is_empty()
            }
            (Canon::Record(x), Canon::Record(y)) => x == y,
            (
                Canon::Fn {
                    params: p1,
                    ret: r1,
                    variadic: v1,
                },
                Canon::Fn {
                    params: p2,
                    ret: r2,
                    variadic: v2,
                },
            ) => {
                v1 == v2
                    && p1.len() == p2.len()
                    && p1.iter().zip(p2).all(|(x, y)| self.same(x, y))
                    && self.same(r1, r2)
            }
            _ => false,
        }
    }

    fn check_all(&self, d: &Declared, counts: &mut Counts) -> Vec<String> {
        let mut out = Vec::new();
        for f in &d.functions {
            counts.functions += 1;
            self.check_function(f, &mut out);
        }
        let enums = self.ours.enum_names();
        for a in &d.aliases {
            counts.aliases += 1;
            self.check_alias(a, enums.contains(a), &mut out);
        }
        for c in &d.consts {
            counts.consts += 1;
            self.check_const(c, &mut out);
        }
        for r in &d.records {
            counts.records += 1;
            self.check_record(r, &mut out);
        }
        out
    }

    fn check_function(&self, name: &str, out: &mut Vec<String>) {
        let rl = self.real_label;
        let o = &self.ours.functions[name];
        let Some(r) = self.real.functions.get(name) else {
            out.push(format!("{name}: function not declared in {rl}"));
            return;
        };
        let (ro, rr) = (self.ours.canon(&o.ret), self.real.canon(&r.ret));
        if !self.same(&ro, &rr) {
            out.push(format!("{name}: returns {ro} in ours, {rr} in {rl}"));
        }
        if o.variadic != r.variadic {
            let v = |b: bool| if b { "variadic" } else { "not variadic" };
            out.push(format!(
                "{name}: {} in ours, {} in {rl}",
                v(o.variadic),
                v(r.variadic)
            ));
        }
        if o.params.len() != r.params.len() {
            let sig = |m: &Model, p: &[(String, model::Ty)]| {
                p.iter()
                    .map(|(_, t)| m.canon(t).to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            out.push(format!(
                "{name}: {} params in ours ({}), {} in {rl} ({})",
                o.params.len(),
                sig(self.ours, &o.params),
                r.params.len(),
                sig(self.real, &r.params)
            ));
            return;
        }
        for (i, ((pname, po), (_, pr))) in o.params.iter().zip(&r.params).enumerate() {
            let (co, cr) = (self.ours.canon(po), self.real.canon(pr));
            if !self.same(&co, &cr) {
                out.push(format!(
                    "{name}: param {} ({pname}) is {co} in ours, {cr} in {rl}",
                    i + 1
                ));
            }
        }
    }

    fn check_alias(&self, name: &str, is_enum: bool, out: &mut Vec<String>) {
        let rl = self.real_label;
        let what = if is_enum { "enum" } else { "typedef" };
        let Some(r) = self.real.aliases.get(name) else {
            out.push(format!("{what} {name}: not declared in {rl}"));
            return;
        };
        let (co, cr) = (
            self.ours.canon(&self.ours.aliases[name]),
            self.real.canon(r),
        );
        if !self.same(&co, &cr) {
            let is = if is_enum { "has underlying type" } else { "is" };
            out.push(format!("{what} {name}: {is} {co} in ours, {cr} in {rl}"));
        }
    }

    fn check_const(&self, name: &str, out: &mut Vec<String>) {
        let rl = self.real_label;
        let o = &self.ours.consts[name];
        let Some(r) = self.real.consts.get(name) else {
            out.push(format!("{name}: constant not defined in {rl}"));
            return;
        };
        if o.value != r.value {
            out.push(format!(
                "{name}: value {} in ours, {} in {rl}",
                o.value, r.value
            ));
        }
        let (eo, er) = (self.ours.enum_of(o), self.real.enum_of(r));
        if eo != er {
            let show = |e: Option<String>| {
                e.map_or("no enum (a #define)".to_string(), |e| format!("enum {e}"))
            };
            out.push(format!(
                "{name}: belongs to {} in ours, {} in {rl}",
                show(eo),
                show(er)
            ));
        }
    }

    fn check_record(&self, name: &str, out: &mut Vec<String>) {
        let rl = self.real_label;
        let o = &self.ours.records[name];
        if let Some((_, real_name)) = SUBSET_RECORDS.iter().find(|(ours, _)| *ours == name) {
            match self.real.records.get(*real_name) {
                None => out.push(format!(
                    "{} {name}: mirrors {real_name}, which is not declared in {rl}",
                    o.kind
                )),
                Some(r) if r.opaque || o.opaque => out.push(format!(
                    "{name}: mirrors {real_name}, but one of them has no body"
                )),
                Some(_) => out.extend(self.compare_subset(name, real_name)),
            }
            return;
        }
        let Some(r) = self.real.records.get(name) else {
            let kind = o.kind;
            out.push(format!("{kind} {name}: not declared in {rl}"));
            return;
        };
        if o.opaque {
            return; // declared without a body: existence is all we can check
        }
        if r.opaque {
            out.push(format!(
                "{name}: has a body in ours, but {rl} declares it without one"
            ));
            return;
        }
        out.extend(self.compare_bodies(name, name, name));
    }

    /// Layout of a record on one side, or the reason it cannot be computed,
    /// plus any disagreement with bindgen's own assertions.
    fn layout(
        &self,
        m: &Model,
        side: &str,
        name: &str,
        path: &str,
        out: &mut Vec<String>,
    ) -> Option<RecordLayout> {
        match m.layout(name, 0) {
            Ok(l) => {
                for e in m.verify_layout(name, &l) {
                    out.push(format!("{path}: internal error, layout computed for {side} disagrees with bindgen: {e}"));
                }
                Some(l)
            }
            Err(e) => {
                out.push(format!("{path}: cannot compute its layout in {side}: {e}"));
                None
            }
        }
    }

    /// Structural comparison of two struct/union bodies; `path` names the
    /// item in messages ("" when only equality matters).
    fn compare_bodies(&self, o_name: &str, r_name: &str, path: &str) -> Vec<String> {
        let rl = self.real_label;
        let mut out = Vec::new();
        let (Some(lo), Some(lr)) = (
            self.layout(self.ours, "ours", o_name, path, &mut out),
            self.layout(self.real, rl, r_name, path, &mut out),
        ) else {
            return out;
        };
        if lo.kind != lr.kind {
            out.push(format!(
                "{path}: is a {} in ours, a {} in {rl}",
                lo.kind, lr.kind
            ));
        }
        if lo.size != lr.size {
            out.push(format!(
                "{path}: size {} in ours, {} in {rl}",
                lo.size, lr.size
            ));
        }
        if lo.align != lr.align {
            out.push(format!(
                "{path}: alignment {} in ours, {} in {rl}",
                lo.align, lr.align
            ));
        }

        let real_named: HashMap<&str, &model::FieldLayout> = lr
            .fields
            .iter()
            .filter(|f| !f.synthetic && !model::is_anon_member(&f.name))
            .map(|f| (f.name.as_str(), f))
            .collect();
        let mut matched_real_anon = Vec::new();
        for fo in lo.fields.iter().filter(|f| !f.synthetic) {
            if model::is_anon_member(&fo.name) {
                // Anonymous member: matched by offset, compared structurally.
                let here = format!(
                    "{path}.<anonymous {} at offset {}>",
                    kind_of(self.ours, &fo.canon),
                    fo.offset
                );
                let counterpart = lr.fields.iter().enumerate().find(|(i, fr)| {
                    model::is_anon_member(&fr.name)
                        && fr.offset == fo.offset
                        && !matched_real_anon.contains(i)
                });
                match counterpart {
                    Some((i, fr)) => {
                        matched_real_anon.push(i);
                        out.extend(self.compare_field_types(&here, fo, fr));
                    }
                    None => out.push(format!(
                        "{here}: no anonymous member at that offset in {rl}"
                    )),
                }
                continue;
            }
            let here = format!("{path}.{}", fo.name);
            let Some(fr) = real_named.get(fo.name.as_str()) else {
                out.push(format!("{here}: field not in {rl}"));
                continue;
            };
            if fo.offset != fr.offset {
                out.push(format!(
                    "{here}: offset {} in ours, {} in {rl}",
                    fo.offset, fr.offset
                ));
            }
            out.extend(self.compare_field_types(&here, fo, fr));
        }
        let ours_named: Vec<&str> = lo.fields.iter().map(|f| f.name.as_str()).collect();
        for (i, fr) in lr.fields.iter().enumerate().filter(|(_, f)| !f.synthetic) {
            if model::is_anon_member(&fr.name) {
                if !matched_real_anon.contains(&i) {
                    out.push(format!(
                        "{path}: anonymous {} at offset {} in {rl} is missing in ours",
                        kind_of(self.real, &fr.canon),
                        fr.offset
                    ));
                }
            } else if !ours_named.contains(&fr.name.as_str()) {
                out.push(format!(
                    "{path}.{}: field missing in ours ({rl} has it at offset {}, type {})",
                    fr.name, fr.offset, fr.canon
                ));
            }
        }
        out
    }

    /// Our record `o_name` as a part of the real `r_name` (SUBSET_RECORDS).
    fn compare_subset(&self, o_name: &str, r_name: &str) -> Vec<String> {
        let rl = self.real_label;
        let mut out = Vec::new();
        let (Some(lo), Some(lr)) = (
            self.layout(self.ours, "ours", o_name, o_name, &mut out),
            self.layout(self.real, rl, r_name, o_name, &mut out),
        ) else {
            return out;
        };
        if lo.kind != lr.kind {
            out.push(format!(
                "{o_name}: is a {} in ours, {r_name} a {} in {rl}",
                lo.kind, lr.kind
            ));
        }
        if lo.size != lr.size {
            out.push(format!(
                "{o_name}: size {} in ours, {r_name} is {} in {rl}",
                lo.size, lr.size
            ));
        }
        if lo.align != lr.align {
            out.push(format!(
                "{o_name}: alignment {} in ours, {r_name} has {} in {rl}",
                lo.align, lr.align
            ));
        }
        for fo in lo
            .fields
            .iter()
            .filter(|f| !f.synthetic && !f.name.starts_with("reserved"))
        {
            let here = format!("{o_name}.{}", fo.name);
            let Some(fr) = lr.fields.iter().find(|f| !f.synthetic && f.name == fo.name) else {
                out.push(format!("{here}: field not in {r_name} in {rl}"));
                continue;
            };
            if fo.offset != fr.offset {
                out.push(format!(
                    "{here}: offset {} in ours, {} in {r_name} in {rl}",
                    fo.offset, fr.offset
                ));
            }
            out.extend(self.compare_field_types(&here, fo, fr));
        }
        out
    }

    fn compare_field_types(
        &self,
        here: &str,
        fo: &model::FieldLayout,
        fr: &model::FieldLayout,
    ) -> Vec<String> {
        let rl = self.real_label;
        match (&fo.canon, &fr.canon) {
            // Anonymous struct/union types (an anonymous member, or a named
            // field of an anonymous type like `struct {..} allocFlags`).
            (Canon::Record(a), Canon::Record(b)) if model::is_anon(a) && model::is_anon(b) => {
                self.compare_bodies(a, b, here)
            }
            (co, cr) if !self.same(co, cr) => {
                vec![format!("{here}: type {co} in ours, {cr} in {rl}")]
            }
            _ => vec![],
        }
    }
}

fn kind_of(m: &Model, c: &Canon) -> String {
    match c {
        Canon::Record(n) => m
            .records
            .get(n)
            .map_or("member".into(), |r| r.kind.to_string()),
        _ => "member".into(),
    }
}

/// Checks one of our headers against a real one.
fn check(ours: &Ours, real: &Model, real_label: &str, counts: &mut Counts) -> Vec<String> {
    let checker = Checker {
        ours: &ours.model,
        real,
        real_label,
    };
    checker
        .check_all(&ours.declared, counts)
        .into_iter()
        .map(|l| format!("{}: {l}", ours.label))
        .collect()
}

#[test]
fn our_headers_match_nvidia_headers() {
    let started = std::time::Instant::now();
    let real = real();
    let dir = our_headers_dir();
    let mut counts = Counts::default();
    let mut mismatches = Vec::new();
    for (file, real_model, real_label) in [
        ("cuslice_cuda.h", &real.cuda, "cuda.h"),
        ("cuslice_nvml.h", &real.nvml, "nvml.h"),
        // What the host side calls beyond the shim's (host/build.rs).
        ("cuslice_nvml_host.h", &real.nvml, "nvml.h"),
        ("cuslice_cupti.h", &real.cupti, "cupti.h"),
    ] {
        let path = dir.join(file);
        let ours = ours(Input::File(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            !ours.declared.functions.is_empty(),
            "{}: bindgen found no function declarations; is the header empty or filtered out?",
            path.display()
        );
        mismatches.extend(check(&ours, real_model, real_label, &mut counts));
    }
    eprintln!(
        "ABI check against {}: {} functions, {} typedefs/enums, {} constants, {} structs/unions compared in {:.1?}",
        real.description,
        counts.functions,
        counts.aliases,
        counts.consts,
        counts.records,
        started.elapsed()
    );
    if !mismatches.is_empty() {
        panic!(
            "{} ABI mismatch(es) between cuda-headers/ and NVIDIA's headers ({}):\n{}\n",
            mismatches.len(),
            real.description,
            mismatches.join("\n")
        );
    }
}

/// Proves the checker can fail: deliberately wrong declarations, checked
/// against the real cuda.h, must produce exactly these lines.
#[test]
fn checker_reports_every_mismatch() {
    const WRONG: &str = r#"
#include <stddef.h>
typedef unsigned long long CUdeviceptr;
typedef int CUdevice;                          /* right */
typedef struct CUstream_st *CUstream;          /* right */
typedef struct CUarray_st *CUarray;            /* right */
typedef unsigned int CUmemGenericAllocationHandle; /* wrong: unsigned long long */
typedef struct CUnotInCuda_st CUnotInCuda;     /* opaque, not in cuda.h */

typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_OUT_OF_MEMORY = 3,              /* wrong: 2 */
    CUDA_ERROR_MADE_UP = 12345                 /* not in cuda.h */
} CUresult;

typedef enum CUarray_format_enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_FLOAT = 0x20
} CUarray_format;

typedef enum CUmemLocationType_enum {           /* a negative value makes it signed */
    CU_MEM_LOCATION_TYPE_INVALID = 0,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEM_LOCATION_TYPE_BOGUS = -1
} CUmemLocationType;

/* wrong field order */
typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Height;
    size_t Width;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

/* anonymous union too wide, and missing `localized` */
typedef struct CUmemLocation_st {
    CUmemLocationType type;
    union {
        long long id;
    };
} CUmemLocation;

/* anonymous-typed field with a wrong member type */
typedef struct CUmemAllocationProp_st {
    unsigned int type;
    unsigned int requestedHandleTypes;
    struct { CUmemLocationType type; int id; } location;  /* wrong: a named struct */
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned int usage;                    /* wrong: unsigned short */
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUuuid_st { char bytes[16]; } CUuuid;  /* right */

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, unsigned int bytesize);
CUresult cuMemFree_v2(CUdeviceptr dptr, int extra);
CUresult cuArrayCreate_v2(CUarray *pHandle, CUDA_ARRAY_DESCRIPTOR *pAllocateArray);
CUresult cuNotARealFunction(void);
int cuStreamSynchronize(CUstream hStream);
CUresult cuMemGetInfo_v2(size_t *free, size_t *total);              /* right */
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);            /* right */
CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, unsigned long long flags); /* right */
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
"#;
    let real = real();
    let ours = ours(Input::Contents {
        name: "cuslice_wrong.h",
        text: WRONG,
    })
    .unwrap();
    let mut counts = Counts::default();
    let got = check(&ours, &real.cuda, "cuda.h", &mut counts);

    let expected = [
        "cuMemAlloc_v2: param 2 (bytesize) is c_uint in ours, usize in cuda.h",
        "cuMemFree_v2: 2 params in ours (c_ulonglong, c_int), 1 in cuda.h (c_ulonglong)",
        "cuArrayCreate_v2: param 2 (pAllocateArray) is *mut CUDA_ARRAY_DESCRIPTOR_st in ours, *const CUDA_ARRAY_DESCRIPTOR_st in cuda.h",
        "cuNotARealFunction: function not declared in cuda.h",
        "cuStreamSynchronize: returns c_int in ours, c_uint in cuda.h",
        "cuMemRelease: param 1 (handle) is c_uint in ours, c_ulonglong in cuda.h",
        "typedef CUmemGenericAllocationHandle: is c_uint in ours, c_ulonglong in cuda.h",
        "enum CUmemLocationType_enum: has underlying type c_int in ours, c_uint in cuda.h",
        "typedef CUmemLocationType: is c_int in ours, c_uint in cuda.h",
        "CUDA_ERROR_OUT_OF_MEMORY: value 3 in ours, 2 in cuda.h",
        "CUDA_ERROR_MADE_UP: constant not defined in cuda.h",
        "CU_MEM_LOCATION_TYPE_BOGUS: constant not defined in cuda.h",
        "typedef CUnotInCuda: not declared in cuda.h",
        "struct CUnotInCuda_st: not declared in cuda.h",
        "CUDA_ARRAY_DESCRIPTOR_st.Height: offset 0 in ours, 8 in cuda.h",
        "CUDA_ARRAY_DESCRIPTOR_st.Width: offset 8 in ours, 0 in cuda.h",
        "CUmemLocation_st: size 16 in ours, 8 in cuda.h",
        "CUmemLocation_st: alignment 8 in ours, 4 in cuda.h",
        "CUmemLocation_st.type_: type c_int in ours, c_uint in cuda.h",
        "CUmemLocation_st.<anonymous union at offset 8>: no anonymous member at that offset in cuda.h",
        "CUmemLocation_st: anonymous union at offset 4 in cuda.h is missing in ours",
        "CUmemAllocationProp_st.location: type <anonymous struct/union> in ours, CUmemLocation_st in cuda.h",
        "CUmemAllocationProp_st.allocFlags: alignment 4 in ours, 2 in cuda.h",
        "CUmemAllocationProp_st.allocFlags.usage: offset 4 in ours, 2 in cuda.h",
        "CUmemAllocationProp_st.allocFlags.usage: type c_uint in ours, c_ushort in cuda.h",
        "CUmemAllocationProp_st.allocFlags.reserved: field missing in ours (cuda.h has it at offset 4, type [c_uchar; 4])",
    ];
    let got_lines: Vec<String> = got
        .iter()
        .map(|l| l.strip_prefix("cuslice_wrong.h: ").unwrap_or(l).to_string())
        .collect();
    let missing: Vec<&&str> = expected
        .iter()
        .filter(|e| !got_lines.iter().any(|g| g == **e))
        .collect();
    let unexpected: Vec<&String> = got_lines
        .iter()
        .filter(|g| !expected.contains(&g.as_str()))
        .collect();
    assert!(
        missing.is_empty() && unexpected.is_empty(),
        "the checker's report differs from the expected one.\nexpected but not reported:\n  {}\nreported but not expected:\n  {}\nfull report:\n  {}",
        missing
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join("\n  "),
        unexpected
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join("\n  "),
        got_lines.join("\n  ")
    );
    // Right declarations are checked too, and are not reported.
    assert!(counts.functions >= 9 && counts.records >= 5, "{counts:?}");
}
