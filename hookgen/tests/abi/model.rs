//! A C header, as bindgen sees it, reduced to what the ABI check compares:
//! functions, typedefs, enum constants, structs and unions, and the layout
//! figures bindgen's layout tests assert. Types are canonicalised (aliases
//! resolved, enums reduced to their integer type, integers reduced to their
//! size and signedness on this target) and struct layouts are computed from
//! bindgen's `#[repr(C)]` output, cross-checked against bindgen's own
//! layout assertions (which clang computed).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::path::Path;

use syn::{Expr, ForeignItem, Item, Lit, Type, UseTree};

/// What bindgen reads: a file on disk or an in-memory header.
pub enum Input<'a> {
    File(&'a Path),
    Contents { name: &'a str, text: &'a str },
}

impl Input<'_> {
    fn file_name(&self) -> String {
        match self {
            Input::File(p) => p.file_name().unwrap().to_string_lossy().into_owned(),
            Input::Contents { name, .. } => name.to_string(),
        }
    }
}

/// Both sides go through the same bindgen configuration, so that their
/// outputs are comparable (same enum style in particular).
fn builder(input: &Input, clang_args: &[String]) -> bindgen::Builder {
    let mut b = bindgen::Builder::default()
        .layout_tests(true)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .prepend_enum_name(false)
        .derive_debug(false)
        .derive_default(false)
        .generate_comments(false)
        .formatter(bindgen::Formatter::None);
    b = match input {
        Input::File(p) => {
            if let Some(dir) = p.parent() {
                b = b.clang_arg(format!("-I{}", dir.display()));
            }
            b.header(p.to_string_lossy())
        }
        Input::Contents { name, text } => b.header_contents(name, text),
    };
    b.clang_args(clang_args)
}

fn run(b: bindgen::Builder, what: &str) -> Result<syn::File, String> {
    let out = b
        .generate()
        .map_err(|e| format!("bindgen failed on {what}: {e}"))?
        .to_string();
    syn::parse_file(&out).map_err(|e| format!("cannot parse bindgen's output for {what}: {e}"))
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if "\\.+*?()|[]{}^$".contains(c) {
                vec!['\\', c]
            } else {
                vec![c]
            }
        })
        .collect()
}

/// A Rust type from bindgen's output, as plain data (syn's types are not
/// `Send`, and the parsed headers are shared between tests).
#[derive(Clone, Debug)]
pub enum Ty {
    Ptr {
        is_const: bool,
        to: Box<Ty>,
    },
    Array {
        elem: Box<Ty>,
        len: Option<u64>,
    },
    /// Last path segment and its generic type arguments.
    Path {
        name: String,
        args: Vec<Ty>,
    },
    BareFn {
        params: Vec<Ty>,
        ret: Box<Ty>,
        variadic: bool,
    },
    Unit,
    Other(String),
}

fn tokens<T: quote::ToTokens>(t: &T) -> String {
    t.to_token_stream().to_string()
}

impl Ty {
    fn from_syn(ty: &Type) -> Ty {
        match ty {
            Type::Ptr(p) => Ty::Ptr {
                is_const: p.const_token.is_some(),
                to: Box::new(Ty::from_syn(&p.elem)),
            },
            Type::Array(a) => Ty::Array {
                elem: Box::new(Ty::from_syn(&a.elem)),
                len: array_len(&a.len),
            },
            Type::Paren(p) => Ty::from_syn(&p.elem),
            Type::Group(g) => Ty::from_syn(&g.elem),
            Type::Tuple(t) if t.elems.is_empty() => Ty::Unit,
            Type::BareFn(f) => Ty::BareFn {
                params: f.inputs.iter().map(|a| Ty::from_syn(&a.ty)).collect(),
                ret: Box::new(ret_ty(&f.output)),
                variadic: f.variadic.is_some(),
            },
            Type::Path(p) => {
                let seg = p.path.segments.last().unwrap();
                Ty::Path {
                    name: seg.ident.to_string(),
                    args: generic_args(seg).into_iter().map(Ty::from_syn).collect(),
                }
            }
            other => Ty::Other(tokens(other)),
        }
    }

    fn named(name: &str) -> Ty {
        Ty::Path {
            name: name.to_string(),
            args: vec![],
        }
    }
}

fn ret_ty(r: &syn::ReturnType) -> Ty {
    match r {
        syn::ReturnType::Default => Ty::Unit,
        syn::ReturnType::Type(_, t) => Ty::from_syn(t),
    }
}

/// Parses a header completely (everything it includes too).
pub fn parse(input: &Input, clang_args: &[String]) -> Result<Model, String> {
    let what = input.file_name();
    Ok(Model::from_file(&run(builder(input, clang_args), &what)?))
}

/// The names of the items declared in the header file itself (not in what
/// it includes), in declaration order.
pub fn declared(input: &Input, clang_args: &[String]) -> Result<Declared, String> {
    let what = input.file_name();
    let b = builder(input, clang_args)
        .allowlist_file(format!(".*{}", regex_escape(&what)))
        .allowlist_recursively(false)
        .layout_tests(false);
    let m = Model::from_file(&run(b, &what)?);
    Ok(Declared {
        functions: m.fn_order,
        aliases: m.alias_order,
        records: m.record_order.into_iter().filter(|r| !is_anon(r)).collect(),
        consts: m.const_order,
    })
}

pub struct Declared {
    pub functions: Vec<String>,
    pub aliases: Vec<String>,
    pub records: Vec<String>,
    pub consts: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kind {
    Struct,
    Union,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(match self {
            Kind::Struct => "struct",
            Kind::Union => "union",
        })
    }
}

pub struct Record {
    pub kind: Kind,
    /// Declared without a body (bindgen's `_unused: [u8; 0]`).
    pub opaque: bool,
    pub fields: Vec<(String, Ty)>,
    pub packed: Option<u64>,
    pub align: Option<u64>,
}

pub struct FnSig {
    pub params: Vec<(String, Ty)>,
    pub ret: Ty,
    pub variadic: bool,
}

#[derive(Clone, PartialEq, Debug)]
pub enum Value {
    Int(i128),
    Other(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            Value::Other(s) => f.write_str(s),
        }
    }
}

pub struct Const {
    pub ty: Ty,
    pub value: Value,
}

#[derive(Default)]
pub struct Model {
    pub aliases: HashMap<String, Ty>,
    pub records: HashMap<String, Record>,
    pub functions: HashMap<String, FnSig>,
    pub consts: HashMap<String, Const>,
    /// bindgen's layout assertions: "Size of X", "Alignment of X",
    /// "Offset of field: X::f" -> value.
    pub asserted: HashMap<String, u64>,
    fn_order: Vec<String>,
    alias_order: Vec<String>,
    record_order: Vec<String>,
    const_order: Vec<String>,
}

/// bindgen's name for an anonymous struct, union or enum.
pub fn is_anon(name: &str) -> bool {
    name.contains("_bindgen_ty_")
}

/// bindgen's helper types, not part of the header.
fn is_bindgen_helper(name: &str) -> bool {
    name.starts_with("__Bindgen")
        || name == "__IncompleteArrayField"
        || name == "__BindgenUnionField"
}

impl Model {
    fn from_file(file: &syn::File) -> Model {
        let mut m = Model::default();
        for item in &file.items {
            match item {
                Item::Type(t) => {
                    let name = t.ident.to_string();
                    m.alias_order.push(name.clone());
                    m.aliases.insert(name, Ty::from_syn(&t.ty));
                }
                Item::Use(u) => {
                    // `pub use self::cudaError_enum as CUresult;`
                    let mut tree = &u.tree;
                    while let UseTree::Path(p) = tree {
                        tree = &p.tree;
                    }
                    if let UseTree::Rename(r) = tree {
                        let name = r.rename.to_string();
                        m.alias_order.push(name.clone());
                        m.aliases.insert(name, Ty::named(&r.ident.to_string()));
                    }
                }
                Item::Struct(s) if !is_bindgen_helper(&s.ident.to_string()) => {
                    let name = s.ident.to_string();
                    let fields: Vec<(String, Ty)> = s
                        .fields
                        .iter()
                        .map(|f| {
                            (
                                f.ident.as_ref().map(|i| i.to_string()).unwrap_or_default(),
                                Ty::from_syn(&f.ty),
                            )
                        })
                        .collect();
                    let opaque = fields.len() == 1 && fields[0].0 == "_unused";
                    // A union bindgen could not emit as a Rust union.
                    let emulated_union = fields.iter().any(|(n, _)| n == "bindgen_union_field");
                    let (packed, align) = repr(&s.attrs);
                    let kind = if emulated_union {
                        Kind::Union
                    } else {
                        Kind::Struct
                    };
                    m.record_order.push(name.clone());
                    m.records.insert(
                        name,
                        Record {
                            kind,
                            opaque,
                            fields: if opaque { vec![] } else { fields },
                            packed,
                            align,
                        },
                    );
                }
                Item::Union(u) => {
                    let name = u.ident.to_string();
                    let fields = u
                        .fields
                        .named
                        .iter()
                        .map(|f| (f.ident.as_ref().unwrap().to_string(), Ty::from_syn(&f.ty)))
                        .collect();
                    let (packed, align) = repr(&u.attrs);
                    m.record_order.push(name.clone());
                    m.records.insert(
                        name,
                        Record {
                            kind: Kind::Union,
                            opaque: false,
                            fields,
                            packed,
                            align,
                        },
                    );
                }
                Item::Const(c) if c.ident == "_" => collect_asserts(&c.expr, &mut m.asserted),
                Item::Const(c) => {
                    let name = c.ident.to_string();
                    m.const_order.push(name.clone());
                    m.consts.insert(
                        name,
                        Const {
                            ty: Ty::from_syn(&c.ty),
                            value: const_value(&c.expr),
                        },
                    );
                }
                Item::ForeignMod(fm) => {
                    for fi in &fm.items {
                        if let ForeignItem::Fn(f) = fi {
                            let params = f
                                .sig
                                .inputs
                                .iter()
                                .map(|a| match a {
                                    syn::FnArg::Typed(pt) => {
                                        (tokens(&pt.pat), Ty::from_syn(&pt.ty))
                                    }
                                    syn::FnArg::Receiver(_) => {
                                        unreachable!("bindgen emits no methods for C")
                                    }
                                })
                                .collect();
                            let ret = ret_ty(&f.sig.output);
                            let name = f.sig.ident.to_string();
                            m.fn_order.push(name.clone());
                            m.functions.insert(
                                name,
                                FnSig {
                                    params,
                                    ret,
                                    variadic: f.sig.variadic.is_some(),
                                },
                            );
                        }
                    }
                }
                _ => {}
            }
        }
        m
    }
}

fn repr(attrs: &[syn::Attribute]) -> (Option<u64>, Option<u64>) {
    let (mut packed, mut align) = (None, None);
    for a in attrs.iter().filter(|a| a.path().is_ident("repr")) {
        let _ = a.parse_nested_meta(|meta| {
            let n = if meta.input.peek(syn::token::Paren) {
                let content;
                syn::parenthesized!(content in meta.input);
                Some(content.parse::<syn::LitInt>()?.base10_parse::<u64>()?)
            } else {
                None
            };
            if meta.path.is_ident("packed") {
                packed = Some(n.unwrap_or(1));
            } else if meta.path.is_ident("align") {
                align = n;
            }
            Ok(())
        });
    }
    (packed, align)
}

fn const_value(e: &Expr) -> Value {
    match e {
        Expr::Lit(l) => match &l.lit {
            Lit::Int(i) => i
                .base10_parse::<i128>()
                .map(Value::Int)
                .unwrap_or_else(|_| Value::Other(i.to_string())),
            other => Value::Other(tokens(other)),
        },
        Expr::Unary(u) if matches!(u.op, syn::UnOp::Neg(_)) => match const_value(&u.expr) {
            Value::Int(v) => Value::Int(-v),
            Value::Other(s) => Value::Other(format!("-{s}")),
        },
        Expr::Paren(p) => const_value(&p.expr),
        other => Value::Other(tokens(other)),
    }
}

/// Reads `["Size of X"][size_of::<X>() - 16usize];` and the like.
fn collect_asserts(e: &Expr, out: &mut HashMap<String, u64>) {
    let Expr::Block(b) = e else { return };
    for stmt in &b.block.stmts {
        let expr = match stmt {
            syn::Stmt::Expr(e, _) => e,
            _ => continue,
        };
        let Expr::Index(ix) = expr else { continue };
        let Expr::Array(arr) = &*ix.expr else {
            continue;
        };
        let Some(Expr::Lit(syn::ExprLit {
            lit: Lit::Str(label),
            ..
        })) = arr.elems.first()
        else {
            continue;
        };
        let Expr::Binary(bin) = &*ix.index else {
            continue;
        };
        let Expr::Lit(syn::ExprLit {
            lit: Lit::Int(n), ..
        }) = &*bin.right
        else {
            continue;
        };
        if let Ok(n) = n.base10_parse::<u64>() {
            out.insert(label.value(), n);
        }
    }
}

// ---------------------------------------------------------------------------
// Canonical types

/// A type with every alias resolved.
#[derive(Clone, Debug)]
pub enum Canon {
    Void,
    /// `abi` is the integer/float class on this target (`u64` for
    /// `c_ulong`, `usize` and `c_ulonglong` alike); `spelled` is bindgen's
    /// name for it, for messages.
    Prim {
        abi: &'static str,
        spelled: String,
        size: u64,
        align: u64,
    },
    Ptr {
        is_const: bool,
        to: Box<Canon>,
    },
    Array {
        elem: Box<Canon>,
        len: u64,
    },
    /// A named struct or union (anonymous ones carry bindgen's name, see
    /// [`is_anon`]); enums never get here, they reduce to `Prim`.
    Record(String),
    Fn {
        params: Vec<Canon>,
        ret: Box<Canon>,
        variadic: bool,
    },
    Unresolved(String),
}

impl fmt::Display for Canon {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        match self {
            Canon::Void => f.write_str("c_void"),
            Canon::Prim { spelled, .. } => f.write_str(spelled),
            Canon::Ptr { is_const, to } => {
                write!(f, "*{} {to}", if *is_const { "const" } else { "mut" })
            }
            Canon::Array { elem, len } => write!(f, "[{elem}; {len}]"),
            Canon::Record(n) if is_anon(n) => f.write_str("<anonymous struct/union>"),
            Canon::Record(n) => f.write_str(n),
            Canon::Fn {
                params,
                ret,
                variadic,
            } => {
                f.write_str("fn(")?;
                for (i, p) in params.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{p}")?;
                }
                if *variadic {
                    f.write_str(", ...")?;
                }
                write!(f, ") -> {ret}")
            }
            Canon::Unresolved(n) => write!(f, "{n} (unresolved)"),
        }
    }
}

fn int_class(signed: bool, size: usize) -> &'static str {
    match (signed, size) {
        (true, 1) => "i8",
        (true, 2) => "i16",
        (true, 4) => "i32",
        (true, 8) => "i64",
        (true, 16) => "i128",
        (false, 1) => "u8",
        (false, 2) => "u16",
        (false, 4) => "u32",
        (false, 8) => "u64",
        (false, 16) => "u128",
        _ => "int?",
    }
}

/// Primitive types as bindgen spells them, with their class, size and
/// alignment on this target (bindgen parses for the host target).
fn primitive(name: &str) -> Option<(&'static str, u64, u64)> {
    use std::mem::{align_of, size_of};
    use std::os::raw::*;
    macro_rules! int {
        ($t:ty) => {
            Some((
                int_class(<$t>::MIN != 0, size_of::<$t>()),
                size_of::<$t>() as u64,
                align_of::<$t>() as u64,
            ))
        };
    }
    match name {
        "c_char" => int!(c_char),
        "c_schar" => int!(c_schar),
        "c_uchar" => int!(c_uchar),
        "c_short" => int!(c_short),
        "c_ushort" => int!(c_ushort),
        "c_int" => int!(c_int),
        "c_uint" => int!(c_uint),
        "c_long" => int!(c_long),
        "c_ulong" => int!(c_ulong),
        "c_longlong" => int!(c_longlong),
        "c_ulonglong" => int!(c_ulonglong),
        "i8" => int!(i8),
        "i16" => int!(i16),
        "i32" => int!(i32),
        "i64" => int!(i64),
        "i128" => int!(i128),
        "u8" => int!(u8),
        "u16" => int!(u16),
        "u32" => int!(u32),
        "u64" => int!(u64),
        "u128" => int!(u128),
        "isize" => int!(isize),
        "usize" => int!(usize),
        "f32" | "c_float" => Some(("f32", 4, align_of::<f32>() as u64)),
        "f64" | "c_double" => Some(("f64", 8, align_of::<f64>() as u64)),
        "bool" => Some(("bool", 1, 1)),
        _ => None,
    }
}

fn array_len(e: &Expr) -> Option<u64> {
    match e {
        Expr::Lit(syn::ExprLit {
            lit: Lit::Int(i), ..
        }) => i.base10_parse().ok(),
        Expr::Paren(p) => array_len(&p.expr),
        Expr::Group(g) => array_len(&g.expr),
        _ => None,
    }
}

fn generic_args(seg: &syn::PathSegment) -> Vec<&Type> {
    match &seg.arguments {
        syn::PathArguments::AngleBracketed(a) => a
            .args
            .iter()
            .filter_map(|g| match g {
                syn::GenericArgument::Type(t) => Some(t),
                _ => None,
            })
            .collect(),
        _ => vec![],
    }
}

impl Model {
    /// Resolves `ty` with this model's own aliases.
    pub fn canon(&self, ty: &Ty) -> Canon {
        self.canon_depth(ty, 0)
    }

    fn canon_depth(&self, ty: &Ty, depth: u32) -> Canon {
        if depth > 64 {
            return Canon::Unresolved(format!("{ty:?} (alias loop)"));
        }
        let d = depth + 1;
        match ty {
            Ty::Ptr { is_const, to } => Canon::Ptr {
                is_const: *is_const,
                to: Box::new(self.canon_depth(to, d)),
            },
            Ty::Array {
                elem,
                len: Some(len),
            } => Canon::Array {
                elem: Box::new(self.canon_depth(elem, d)),
                len: *len,
            },
            Ty::Array { elem, len: None } => Canon::Unresolved(format!("[{elem:?}; ?]")),
            Ty::Unit => Canon::Void,
            Ty::BareFn {
                params,
                ret,
                variadic,
            } => Canon::Fn {
                params: params.iter().map(|p| self.canon_depth(p, d)).collect(),
                ret: Box::new(self.canon_depth(ret, d)),
                variadic: *variadic,
            },
            Ty::Path { name, args } => match (name.as_str(), args.as_slice()) {
                // Function pointers are `Option<unsafe extern "C" fn(..)>`.
                ("Option", [t]) => self.canon_depth(t, d),
                ("__BindgenUnionField", [t]) => self.canon_depth(t, d),
                ("__IncompleteArrayField", [t]) => Canon::Array {
                    elem: Box::new(self.canon_depth(t, d)),
                    len: 0,
                },
                // Storage of a run of bitfields: compared as bytes.
                ("__BindgenBitfieldUnit", [t]) => self.canon_depth(t, d),
                ("c_void", []) => Canon::Void,
                (n, []) => {
                    if let Some((abi, size, align)) = primitive(n) {
                        Canon::Prim {
                            abi,
                            spelled: n.to_string(),
                            size,
                            align,
                        }
                    } else if let Some(t) = self.aliases.get(n) {
                        self.canon_depth(t, d)
                    } else if self.records.contains_key(n) {
                        Canon::Record(n.to_string())
                    } else {
                        Canon::Unresolved(n.to_string())
                    }
                }
                (n, _) => Canon::Unresolved(format!("{n}<..>")),
            },
            Ty::Other(s) => Canon::Unresolved(s.clone()),
        }
    }

    /// The enum a constant belongs to (bindgen types enum constants with the
    /// enum's name), or None for a `#define`d constant.
    pub fn enum_of(&self, c: &Const) -> Option<String> {
        match &c.ty {
            Ty::Path { name, args } if args.is_empty() => {
                (primitive(name).is_none() && self.aliases.contains_key(name)).then(|| name.clone())
            }
            _ => None,
        }
    }

    pub fn enum_names(&self) -> HashSet<String> {
        self.consts
            .values()
            .filter_map(|c| self.enum_of(c))
            .collect()
    }
}

// ---------------------------------------------------------------------------
// Layout

pub struct FieldLayout {
    /// bindgen's field name (`__bindgen_anon_N` for an anonymous member).
    pub name: String,
    pub canon: Canon,
    pub offset: u64,
    /// bindgen's own padding / union storage / bitfield alignment fields:
    /// part of the layout, never compared by name.
    pub synthetic: bool,
}

pub struct RecordLayout {
    pub kind: Kind,
    pub size: u64,
    pub align: u64,
    pub fields: Vec<FieldLayout>,
}

fn round_up(n: u64, a: u64) -> u64 {
    n.div_ceil(a.max(1)) * a.max(1)
}

pub fn is_anon_member(field: &str) -> bool {
    field.starts_with("__bindgen_anon_")
}

fn is_synthetic(field: &str) -> bool {
    field == "bindgen_union_field"
        || field.starts_with("__bindgen_padding_")
        || field.starts_with("_bitfield_align_")
}

const PTR: (u64, u64) = (
    std::mem::size_of::<*const u8>() as u64,
    std::mem::align_of::<*const u8>() as u64,
);

impl Model {
    /// (size, alignment) of a canonical type.
    pub fn size_align(&self, c: &Canon, depth: u32) -> Result<(u64, u64), String> {
        match c {
            Canon::Prim { size, align, .. } => Ok((*size, *align)),
            Canon::Ptr { .. } | Canon::Fn { .. } => Ok(PTR),
            Canon::Array { elem, len } => {
                let (s, a) = self.size_align(elem, depth + 1)?;
                Ok((s * len, a))
            }
            Canon::Record(n) => {
                let l = self.layout(n, depth + 1)?;
                Ok((l.size, l.align))
            }
            Canon::Void => Err("c_void has no size".into()),
            Canon::Unresolved(n) => Err(format!("unresolved type {n}")),
        }
    }

    /// The `#[repr(C)]` layout of a struct or union as bindgen emitted it.
    pub fn layout(&self, name: &str, depth: u32) -> Result<RecordLayout, String> {
        if depth > 32 {
            return Err(format!("{name}: nested too deeply"));
        }
        let rec = self
            .records
            .get(name)
            .ok_or_else(|| format!("no struct or union {name}"))?;
        if rec.opaque {
            return Err(format!("{name} is opaque (declared without a body)"));
        }
        let mut fields = Vec::new();
        let (mut end, mut max_align) = (0u64, 1u64);
        for (fname, ty) in &rec.fields {
            let canon = self.canon(ty);
            let (size, mut align) = self
                .size_align(&canon, depth)
                .map_err(|e| format!("{name}.{fname}: {e}"))?;
            if let Some(p) = rec.packed {
                align = align.min(p);
            }
            let offset = match rec.kind {
                Kind::Struct => round_up(end, align),
                Kind::Union => 0,
            };
            end = end.max(offset + size);
            max_align = max_align.max(align);
            fields.push(FieldLayout {
                name: fname.clone(),
                canon,
                offset,
                synthetic: is_synthetic(fname),
            });
        }
        if let Some(a) = rec.align {
            max_align = max_align.max(a);
        }
        Ok(RecordLayout {
            kind: rec.kind,
            size: round_up(end, max_align),
            align: max_align,
            fields,
        })
    }

    /// Differences between a computed layout and what bindgen (i.e. clang)
    /// asserted for it. Empty unless this test's layout arithmetic is wrong.
    pub fn verify_layout(&self, name: &str, l: &RecordLayout) -> Vec<String> {
        let mut out = Vec::new();
        if !self.asserted.contains_key(&format!("Size of {name}")) {
            out.push(format!(
                "bindgen emitted no layout assertions for {name}, nothing to cross-check against"
            ));
        }
        let mut chk = |label: String, computed: u64| match self.asserted.get(&label) {
            Some(&v) if v != computed => {
                out.push(format!("{label}: computed {computed}, bindgen asserts {v}"))
            }
            _ => {}
        };
        chk(format!("Size of {name}"), l.size);
        chk(format!("Alignment of {name}"), l.align);
        for f in &l.fields {
            chk(format!("Offset of field: {name}::{}", f.name), f.offset);
        }
        out
    }
}
