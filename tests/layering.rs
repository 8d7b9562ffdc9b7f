//! The layering docs/architecture.md promises: no two modules of one crate
//! import each other (a module's `crate::x` and `super::x` paths, outside
//! comments and its unit tests), in the shim, the core, the command, the
//! host file layer and the DRA plugin. A cycle creeps in one convenient
//! call at a time; this says which two modules, and where.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("source directory") {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a source file under `root` (`a/b.rs`, `a/b/mod.rs`:
/// `["a", "b"]`; `lib.rs`, `main.rs`: `[]`).
fn module_of(root: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(root).expect("under root");
    let mut parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|l| l == "mod") {
        parts.pop();
    }
    if parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main") {
        parts.clear();
    }
    parts
}

/// The source without comments and without a trailing `mod tests`.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Identifiers after each occurrence of `prefix` (`crate::`, `super::`).
fn paths_after<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut v = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find(prefix) {
        let before_ok = i == 0
            || !rest[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = &rest[i + prefix.len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(rest.len());
        if before_ok && end > 0 {
            v.push(&rest[..end]);
        }
    }
    v
}

/// Imports between a crate's top-level modules, and between sibling
/// submodules: (from, to) -> a file that does it.
fn imports(root: &Path) -> BTreeMap<(String, String), PathBuf> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut edges = BTreeMap::new();
    for f in files {
        // A module's unit tests in a file of their own (`mod tests;`):
        // as a trailing `mod tests` (see `code`), not the module's code.
        if f.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let m = module_of(root, &f);
        if m.is_empty() {
            continue;
        }
        let text = code(&std::fs::read_to_string(&f).expect("source"));
        let me_top = m[0].clone();
        for to in paths_after(&text, "crate::") {
            if to != me_top {
                edges
                    .entry((me_top.clone(), to.to_string()))
                    .or_insert(f.clone());
            }
        }
        // `super::x` in a submodule `a::b`: the sibling `a::x`.
        if m.len() >= 2 {
            let me = m[..2].join("::");
            for to in paths_after(&text, "super::") {
                let sibling = format!("{}::{to}", m[0]);
                if m.len() == 2 && sibling != me {
                    edges.entry((me.clone(), sibling)).or_insert(f.clone());
                }
            }
        }
    }
    edges
}

#[test]
fn no_two_modules_import_each_other() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut cycles = Vec::new();
    for krate in ["src", "core/src", "cli/src", "dra/src", "host/src"] {
        let edges = imports(&repo.join(krate));
        let seen: BTreeSet<_> = edges.keys().cloned().collect();
        for ((a, b), f) in &edges {
            if a < b
                && let Some(g) = edges.get(&(b.clone(), a.clone()))
                && seen.contains(&(b.clone(), a.clone()))
            {
                cycles.push(format!(
                    "{krate}: {a} and {b} import each other ({} and {})",
                    f.strip_prefix(repo).unwrap_or(f).display(),
                    g.strip_prefix(repo).unwrap_or(g).display()
                ));
            }
        }
    }
    assert!(cycles.is_empty(), "{}", cycles.join("\n"));
}

#[test]
fn the_check_sees_a_cycle() {
    // The check itself: two modules that call each other are found.
    let dir = std::env::temp_dir().join(format!("cuslice-layering-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).expect("dir");
    std::fs::write(dir.join("lib.rs"), "mod a;\nmod b;\n").expect("lib");
    std::fs::write(
        dir.join("a/mod.rs"),
        "mod x;\nmod y;\nfn f() { crate::b::g() }\n",
    )
    .expect("a");
    std::fs::write(dir.join("a/x.rs"), "use super::y::h; // super::z\n").expect("x");
    std::fs::write(dir.join("a/y.rs"), "fn h() { super::x::k() }\n").expect("y");
    std::fs::write(dir.join("b.rs"), "// crate::a\nfn g() { crate::a::f() }\n").expect("b");
    let edges = imports(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(edges.contains_key(&("a".into(), "b".into())), "{edges:?}");
    assert!(edges.contains_key(&("b".into(), "a".into())), "{edges:?}");
    assert!(
        edges.contains_key(&("a::x".into(), "a::y".into())),
        "{edges:?}"
    );
    assert!(
        edges.contains_key(&("a::y".into(), "a::x".into())),
        "{edges:?}"
    );
    // Comments do not count.
    assert!(
        !edges.contains_key(&("a::x".into(), "a::z".into())),
        "{edges:?}"
    );
}
