//! hookgen: turns cuslice's annotated C declarations (`cuda-headers/`) into
//! the shim's hook table.
//!
//! bindgen parses each header with libclang and keeps the doc comments; the
//! `@hook <kind> [family]` line in each function's comment says how the
//! function is hooked (see `cuda-headers/README.md`). From that we emit:
//!
//! - `sys.rs`: the C types (newtype enums, structs, handles), without the
//!   function declarations (nothing may link against them);
//! - `hooks.rs`: per declared function an index (`id::NAME`), its name and
//!   library, the lazily resolved real function (`real::NAME`), and for every
//!   hooked function the exported symbol (`exports::NAME`) plus the table of
//!   export addresses the `dlsym` / `cuGetProcAddress` hooks hand out.
//!
//! The declarations are the single source of truth: there is no other list
//! of hooked names anywhere in the project.

use std::fmt;
use std::path::{Path, PathBuf};

use proc_macro2::{Ident, Span, TokenStream};
use quote::{format_ident, quote};

/// Which real library a declaration's function lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lib {
    Cuda,
    Nvml,
}

impl Lib {
    fn variant(self) -> TokenStream {
        match self {
            Lib::Cuda => quote!(crate::real::Lib::Cuda),
            Lib::Nvml => quote!(crate::real::Lib::Nvml),
        }
    }
}

/// How a declaration is hooked (the `@hook` annotation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Exported; calls the real function.
    Pass,
    /// Exported; `hooks::<family>::<name>(args) -> Result<(), R>` runs first.
    Pre,
    /// Exported; `hooks::<family>::<name>(result, args) -> R` runs after.
    Post,
    /// Exported; `hooks::<family>::<name>(args) -> R` does everything.
    Override,
    /// Not exported: the shim only calls the real function.
    Real,
}

impl Kind {
    fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "pass" => Kind::Pass,
            "pre" => Kind::Pre,
            "post" => Kind::Post,
            "override" => Kind::Override,
            "real" => Kind::Real,
            _ => return None,
        })
    }

    fn needs_family(self) -> bool {
        matches!(self, Kind::Pre | Kind::Post | Kind::Override)
    }

    pub fn is_exported(self) -> bool {
        self != Kind::Real
    }
}

/// One annotated header and the library its functions live in.
#[derive(Clone, Debug)]
pub struct Header {
    pub path: PathBuf,
    pub lib: Lib,
    /// Module name the header's types are generated into (`sys::<module>`).
    pub module: String,
}

/// One declared function, as read from bindgen's output.
#[derive(Clone, Debug)]
pub struct Func {
    pub name: String,
    pub lib: Lib,
    pub kind: Kind,
    pub family: Option<String>,
    pub params: Vec<(Ident, syn::Type)>,
    pub ret: syn::Type,
}

/// A generator error: names the header and the declaration at fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

fn err<T>(msg: impl Into<String>) -> Result<T, Error> {
    Err(Error(msg.into()))
}

/// The two generated files.
#[derive(Debug, Clone)]
pub struct Generated {
    pub sys: String,
    pub hooks: String,
    pub funcs: Vec<Func>,
}

/// Runs bindgen over one header and returns its Rust output.
pub fn bindgen_header(path: &Path) -> Result<String, Error> {
    let file = path.to_string_lossy().into_owned();
    run_bindgen(&file, &regex_escape(&file))
}

/// bindgen over `file` with cuslice's options, keeping the items declared
/// in the files `allow` (a regex) matches.
fn run_bindgen(file: &str, allow: &str) -> Result<String, Error> {
    let bindings = bindgen::Builder::default()
        .header(file.to_string())
        .allowlist_file(allow)
        .default_enum_style(bindgen::EnumVariation::NewType {
            is_bitfield: false,
            is_global: false,
        })
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(true)
        .derive_copy(true)
        .layout_tests(false)
        .generate_comments(true)
        .merge_extern_blocks(true)
        .ctypes_prefix("::core::ffi")
        .formatter(bindgen::Formatter::None)
        .generate()
        .map_err(|e| Error(format!("{file}: bindgen failed: {e}")))?;
    Ok(bindings.to_string())
}

/// Bindings for a program that loads the library itself with `dlopen` and
/// `dlsym` (the `cuslice` command and NVML): the types declared in
/// `header` and in the headers of its directory that it includes, and each
/// function declared there as a function-pointer type of the function's
/// own name (`pub type nvmlInit_v2 = unsafe extern "C" fn() -> nvmlReturn_t;`),
/// so that nothing links against the library and a pointer found with
/// `dlsym` is given exactly the declared signature. Functions need no
/// `@hook` annotation here.
pub fn loader_bindings(header: &Path) -> Result<String, Error> {
    let file = header.to_string_lossy().into_owned();
    let dir = header
        .parent()
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_default();
    let out = run_bindgen(&file, &format!("{}/[^/]*\\.h", regex_escape(&dir)))?;
    let parsed = syn::parse_file(&out)
        .map_err(|e| Error(format!("{file}: cannot parse bindgen output: {e}")))?;
    let mut items: Vec<syn::Item> = Vec::new();
    for item in parsed.items {
        let syn::Item::ForeignMod(fm) = item else {
            items.push(item);
            continue;
        };
        for fi in fm.items {
            let syn::ForeignItem::Fn(f) = fi else {
                return err(format!(
                    "{file}: only functions may be declared extern, found {}",
                    quote!(#fi)
                ));
            };
            let name = &f.sig.ident;
            if f.sig.variadic.is_some() {
                return err(format!("{file}: {name} is variadic"));
            }
            let mut tys = Vec::new();
            for input in &f.sig.inputs {
                let syn::FnArg::Typed(pt) = input else {
                    return err(format!("{file}: {name}: unexpected receiver"));
                };
                tys.push(&*pt.ty);
            }
            let ret = &f.sig.output;
            items.push(syn::parse_quote! {
                pub type #name = unsafe extern "C" fn(#(#tys),*) #ret;
            });
        }
    }
    let file_ast = syn::File {
        shebang: None,
        attrs: Vec::new(),
        items,
    };
    Ok(format!(
        "// @generated by hookgen::loader_bindings from {}. Do not edit.\n{}",
        header
            .file_name()
            .map_or(file.clone(), |f| f.to_string_lossy().into_owned()),
        prettyplease::unparse(&file_ast)
    ))
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Reads the `@hook` annotation out of a function's doc attributes.
fn annotation(
    header: &str,
    name: &str,
    attrs: &[syn::Attribute],
) -> Result<(Kind, Option<String>), Error> {
    let mut found: Option<(Kind, Option<String>)> = None;
    for attr in attrs {
        if !attr.path().is_ident("doc") {
            continue;
        }
        let syn::Meta::NameValue(nv) = &attr.meta else {
            continue;
        };
        let syn::Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        }) = &nv.value
        else {
            continue;
        };
        for line in s.value().lines() {
            let line = line.trim().trim_start_matches('*').trim();
            let Some(rest) = line.strip_prefix("@hook") else {
                continue;
            };
            let words: Vec<&str> = rest.split_whitespace().collect();
            if found.is_some() {
                return err(format!(
                    "{header}: {name} has more than one @hook annotation"
                ));
            }
            let Some(kind_word) = words.first() else {
                return err(format!(
                    "{header}: {name}: @hook needs a kind (pass, pre, post, override, real)"
                ));
            };
            let Some(kind) = Kind::parse(kind_word) else {
                return err(format!(
                    "{header}: {name}: unknown hook kind `{kind_word}` (expected pass, pre, post, override or real)"
                ));
            };
            let family = words.get(1).map(|s| s.to_string());
            if words.len() > 2 {
                return err(format!(
                    "{header}: {name}: @hook takes a kind and at most one family, got `{}`",
                    rest.trim()
                ));
            }
            if kind.needs_family() && family.is_none() {
                return err(format!(
                    "{header}: {name}: @hook {kind_word} needs a family (the module under src/hooks/)"
                ));
            }
            if !kind.needs_family() && family.is_some() {
                return err(format!(
                    "{header}: {name}: @hook {kind_word} takes no family"
                ));
            }
            if let Some(f) = &family
                && !f.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            {
                return err(format!(
                    "{header}: {name}: family `{f}` must be a lowercase module name"
                ));
            }
            found = Some((kind, family));
        }
    }
    match found {
        Some(a) => Ok(a),
        None => err(format!("{header}: {name} has no @hook annotation")),
    }
}

/// Splits bindgen's output into the type items (kept) and the annotated
/// function declarations (returned as [`Func`]s).
pub fn split(
    header: &str,
    lib: Lib,
    bindgen_out: &str,
) -> Result<(Vec<syn::Item>, Vec<Func>), Error> {
    let file = syn::parse_file(bindgen_out)
        .map_err(|e| Error(format!("{header}: cannot parse bindgen output: {e}")))?;
    let mut items = Vec::new();
    let mut funcs = Vec::new();
    for item in file.items {
        let syn::Item::ForeignMod(fm) = item else {
            items.push(item);
            continue;
        };
        for fi in fm.items {
            let syn::ForeignItem::Fn(f) = fi else {
                return err(format!(
                    "{header}: only functions may be declared extern, found {}",
                    quote!(#fi)
                ));
            };
            let name = f.sig.ident.to_string();
            let (kind, family) = annotation(header, &name, &f.attrs)?;
            if f.sig.variadic.is_some() {
                return err(format!("{header}: {name} is variadic; cannot hook it"));
            }
            let mut params = Vec::new();
            for (i, input) in f.sig.inputs.iter().enumerate() {
                let syn::FnArg::Typed(pt) = input else {
                    return err(format!("{header}: {name}: unexpected receiver"));
                };
                let ident = match &*pt.pat {
                    syn::Pat::Ident(pi) => pi.ident.clone(),
                    _ => format_ident!("arg{}", i + 1),
                };
                params.push((ident, (*pt.ty).clone()));
            }
            let ret = match &f.sig.output {
                syn::ReturnType::Type(_, t) => (**t).clone(),
                syn::ReturnType::Default => {
                    return err(format!(
                        "{header}: {name} returns void; hooks need a status return type"
                    ));
                }
            };
            funcs.push(Func {
                name,
                lib,
                kind,
                family,
                params,
                ret,
            });
        }
    }
    Ok((items, funcs))
}

/// Generates `sys.rs` and `hooks.rs` from the annotated headers.
pub fn generate(headers: &[Header]) -> Result<Generated, Error> {
    let mut sys_mods = Vec::new();
    let mut funcs = Vec::new();
    for h in headers {
        let display = h
            .path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| h.path.display().to_string());
        let out = bindgen_header(&h.path)?;
        let (items, mut fs) = split(&display, h.lib, &out)?;
        let module = format_ident!("{}", h.module);
        sys_mods.push(quote! {
            pub mod #module {
                #(#items)*
            }
            pub use #module::*;
        });
        funcs.append(&mut fs);
    }
    let sys_file: syn::File = syn::parse2(quote! { #(#sys_mods)* })
        .map_err(|e| Error(format!("generated sys.rs does not parse: {e}")))?;
    let sys = format!(
        "// @generated by hookgen from cuda-headers/. Do not edit.\n{}",
        prettyplease::unparse(&sys_file)
    );
    let hooks = render_hooks(&funcs)?;
    Ok(Generated { sys, hooks, funcs })
}

/// Renders the hook table for a list of functions (already annotated).
pub fn render_hooks(funcs: &[Func]) -> Result<String, Error> {
    let mut seen = std::collections::HashSet::new();
    for f in funcs {
        if !seen.insert(f.name.as_str()) {
            return err(format!("{} is declared twice", f.name));
        }
    }
    let n = funcs.len();
    let ids = funcs.iter().enumerate().map(|(i, f)| {
        let name = format_ident!("{}", f.name);
        quote! { pub const #name: usize = #i; }
    });
    let names = funcs.iter().map(|f| {
        let lit = syn::LitCStr::new(
            &std::ffi::CString::new(f.name.clone()).expect("C identifiers have no NUL"),
            Span::call_site(),
        );
        quote! { #lit }
    });
    let libs = funcs.iter().map(|f| f.lib.variant());
    let exported = funcs.iter().map(|f| f.kind.is_exported());
    let reals = funcs.iter().map(render_real);
    let exports = funcs
        .iter()
        .filter(|f| f.kind.is_exported())
        .map(render_export);
    let addr_arms = funcs.iter().filter(|f| f.kind.is_exported()).map(|f| {
        let name = format_ident!("{}", f.name);
        quote! { id::#name => exports::#name as *mut ::core::ffi::c_void, }
    });
    let tokens = quote! {
        /// Index of each declared function in the tables below.
        #[allow(non_upper_case_globals, dead_code)]
        pub mod id {
            #(#ids)*
        }

        /// Number of declared functions.
        pub const COUNT: usize = #n;

        /// Each declared function's symbol name, by index.
        pub static NAMES: [&::core::ffi::CStr; COUNT] = [#(#names),*];

        /// The library each declared function lives in, by index.
        pub static LIBS: [crate::real::Lib; COUNT] = [#(#libs),*];

        /// Whether the shim exports a hook for the function, by index.
        #[allow(dead_code)]
        pub static EXPORTED: [bool; COUNT] = [#(#exported),*];

        /// Calls into the real driver, resolved lazily per symbol. A symbol
        /// the real library lacks yields the library's "not found" status.
        #[allow(non_snake_case, dead_code, clippy::missing_safety_doc, clippy::too_many_arguments)]
        pub mod real {
            use crate::sys::*;
            #(#reals)*
        }

        /// The exported hooks.
        #[allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]
        pub mod exports {
            use crate::sys::*;
            use super::{id, real};
            #(#exports)*
        }

        /// Address of the shim's export for function `i`, or null for a
        /// declaration the shim does not export.
        pub fn hook_addr(i: usize) -> *mut ::core::ffi::c_void {
            match i {
                #(#addr_arms)*
                _ => ::core::ptr::null_mut(),
            }
        }
    };
    let file: syn::File = syn::parse2(tokens)
        .map_err(|e| Error(format!("generated hooks.rs does not parse: {e}")))?;
    Ok(format!(
        "// @generated by hookgen from cuda-headers/. Do not edit.\n{}",
        prettyplease::unparse(&file)
    ))
}

fn fn_ptr_type(f: &Func) -> TokenStream {
    let tys = f.params.iter().map(|(_, t)| t);
    let ret = &f.ret;
    quote! { unsafe extern "C" fn(#(#tys),*) -> #ret }
}

fn render_real(f: &Func) -> TokenStream {
    let name = format_ident!("{}", f.name);
    let params = f.params.iter().map(|(i, t)| quote! { #i: #t });
    let args = f.params.iter().map(|(i, _)| i);
    let ret = &f.ret;
    let pfn = fn_ptr_type(f);
    quote! {
        #[inline]
        pub unsafe fn #name(#(#params),*) -> #ret {
            match crate::real::get(super::id::#name) {
                // SAFETY: the pointer was returned by the real library's
                // dlsym for this exact symbol, whose C type is the one
                // declared in cuda-headers/ (checked by the ABI test).
                Some(__real_fn) => unsafe { ::core::mem::transmute::<*mut ::core::ffi::c_void, #pfn>(__real_fn)(#(#args),*) },
                None => <#ret as crate::ffi::Status>::NOT_FOUND,
            }
        }
    }
}

fn render_export(f: &Func) -> TokenStream {
    let name = format_ident!("{}", f.name);
    let params: Vec<TokenStream> = f.params.iter().map(|(i, t)| quote! { #i: #t }).collect();
    let args: Vec<&Ident> = f.params.iter().map(|(i, _)| i).collect();
    let ret = &f.ret;
    let real_call = quote! { unsafe { real::#name(#(#args),*) } };
    let body = match f.kind {
        Kind::Pass => quote! {
            crate::ffi::pass(id::#name);
            #real_call
        },
        Kind::Pre => {
            // No reentrancy guard: a pre step runs on every launch, calls
            // only real functions, and decides before the real call.
            let fam = format_ident!("{}", f.family.as_deref().unwrap_or_default());
            quote! {
                match crate::ffi::pre(id::#name, || unsafe { crate::hooks::#fam::#name(#(#args),*) }) {
                    Ok(()) => #real_call,
                    Err(__status) => __status,
                }
            }
        }
        Kind::Post | Kind::Override => {
            let fam = format_ident!("{}", f.family.as_deref().unwrap_or_default());
            let step = match f.kind {
                Kind::Post => quote! {
                    let __status = #real_call;
                    unsafe { crate::hooks::#fam::#name(__status, #(#args),*) }
                },
                _ => quote! { unsafe { crate::hooks::#fam::#name(#(#args),*) } },
            };
            quote! {
                crate::ffi::hook(id::#name, || { #step }, || #real_call)
            }
        }
        Kind::Real => unreachable!("real declarations are not exported"),
    };
    quote! {
        #[cfg_attr(not(test), unsafe(no_mangle))]
        pub unsafe extern "C" fn #name(#(#params),*) -> #ret {
            #body
        }
    }
}
