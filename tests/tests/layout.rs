//! Every crate keeps its files in layers: no file (subfolders included) imports one that imports
//! it back, directly or through others (a cycle makes every change to one touch the others), and
//! no file takes a sibling's names through the crate root's re-exports (which hides the arrow).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

fn identifiers(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|w| !w.is_empty())
}

/// The path or brace group after a `crate::`: up to the end of a path, or the matching `}`.
fn crate_path(after: &str) -> &str {
    let mut depth = 0;
    for (at, c) in after.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 1 => return &after[..=at],
            '}' => depth -= 1,
            c if depth == 0 && !(c.is_alphanumeric() || c == '_' || c == ':') => return &after[..at],
            _ => {}
        }
    }
    after
}

/// A crate's modules, by path (`rules`, `rules::raw`), each with its code before its unit tests
/// (`#[cfg(test)]` onwards does not count); the root (lib.rs, else main.rs) under "".
fn modules(src: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).expect("a source folder") {
            let path = entry.expect("a file").path();
            let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else { continue };
            let name = if prefix.is_empty() { stem.to_owned() } else { format!("{prefix}::{stem}") };
            if path.is_dir() {
                walk(&path, &name, out);
            } else if path.extension().and_then(|e| e.to_str()) == Some("rs") {
                let text = std::fs::read_to_string(&path).expect("readable");
                let code = text.split("#[cfg(test)]").next().unwrap_or_default().to_owned();
                let name = name.strip_suffix("::mod").map_or(name.clone(), str::to_owned);
                out.insert(name, code);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, "", &mut out);
    let root = out.remove("lib").or_else(|| out.remove("main")).unwrap_or_default();
    out.remove("main");
    out.insert(String::new(), root);
    out
}

/// What lib.rs (or main.rs) re-exports, by name: the module each name comes from.
fn reexports(root: &str, modules: &BTreeMap<String, String>) -> HashMap<String, String> {
    let mut owner = HashMap::new();
    for statement in root.split(';') {
        let Some(exported) = statement.trim().strip_prefix("pub use ") else { continue };
        let exported = exported.trim_start_matches("crate::").trim_start_matches("self::");
        let mut names = identifiers(exported);
        if let Some(file) = names.next().filter(|f| modules.contains_key(*f)) {
            owner.extend(names.map(|name| (name.to_owned(), file.to_owned())));
        }
    }
    owner
}

/// The module a path from `crate::` names: its longest prefix that is a module of the crate.
fn module_of(path: &str, modules: &BTreeMap<String, String>) -> Option<String> {
    let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
    (1..=parts.len()).rev().map(|n| parts[..n].join("::")).find(|m| modules.contains_key(m))
}

/// The paths a file names through `crate::` and `super::`, as paths from the crate's root (brace
/// groups expanded one level: `crate::{a::X, b}` names `a::X` and `b`).
fn named_paths(module: &str, code: &str) -> Vec<String> {
    let parent = module.rsplit_once("::").map_or("", |(parent, _)| parent);
    let mut paths = Vec::new();
    for (marker, base) in [("crate::", ""), ("super::", parent)] {
        for (at, _) in code.match_indices(marker) {
            if marker == "crate::" && code[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            if marker == "super::" && code[..at].ends_with(':') {
                continue;
            }
            let after = crate_path(&code[at + marker.len()..]);
            let join = |rest: &str| if base.is_empty() { rest.to_owned() } else { format!("{base}::{rest}") };
            match after.split_once('{') {
                Some((prefix, group)) => {
                    for item in group.trim_end_matches('}').split(',') {
                        paths.push(join(&format!("{prefix}{}", item.trim())));
                    }
                }
                None => paths.push(join(after)),
            }
        }
    }
    paths
}

/// Each module's imports of the crate's other modules: `crate::` and `super::` paths naming one,
/// or a name the root re-exports from one (`pub use file::{...}`).
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(src);
    let owner = reexports(&modules[""], &modules);
    let mut edges = BTreeMap::new();
    for (module, code) in modules.iter().filter(|(m, _)| !m.is_empty()) {
        let mut to = BTreeSet::new();
        for path in named_paths(module, code) {
            let target = module_of(&path, &modules)
                .filter(|m| !m.is_empty())
                .or_else(|| identifiers(&path).next().and_then(|name| owner.get(name).cloned()));
            to.extend(target.filter(|t| t != module && !module.starts_with(&format!("{t}::"))));
        }
        edges.insert(module.clone(), to);
    }
    edges
}

/// The names a module takes through the root's re-exports instead of from the sibling that
/// defines them (`crate::Store` where `crate::store::Store` is meant): each hides an arrow.
fn through_the_root(src: &Path) -> Vec<String> {
    let modules = modules(src);
    let owner = reexports(&modules[""], &modules);
    let mut found = Vec::new();
    for (module, code) in modules.iter().filter(|(m, _)| !m.is_empty()) {
        for path in named_paths(module, code) {
            if module_of(&path, &modules).is_some() {
                continue;
            }
            if let Some(from) = identifiers(&path).next().and_then(|name| owner.get(name)) {
                found.push(format!("{module}: crate::{path} (from {from})"));
            }
        }
    }
    found
}

/// Every crate of the workspace, by its source folder.
fn crates() -> Vec<std::path::PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("the workspace's manifest");
    let members = manifest.split("members = [").nth(1).and_then(|m| m.split(']').next()).expect("members");
    members.split(',').map(|m| root.join(m.trim().trim_matches('"')).join("src")).collect()
}

/// A cycle of files, if any: each imports the next, the last the first.
fn a_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        file: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|f| f == file) {
            return Some(path[at..].to_vec());
        }
        if done.contains(file) {
            return None;
        }
        path.push(file.to_owned());
        for next in edges.get(file).into_iter().flatten() {
            if let Some(cycle) = visit(next, edges, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(file.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|file| visit(file, edges, &mut Vec::new(), &mut done))
}

#[test]
fn no_file_of_any_crate_imports_one_that_imports_it_back() {
    let crates = crates();
    assert!(crates.len() >= 10, "{crates:?}");
    for src in crates {
        let edges = imports(&src);
        assert_eq!(a_cycle(&edges), None, "{}: files that import each other back", src.display());
    }
    let store = imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/store/src"));
    assert!(store.len() > 5 && store.values().any(|to| !to.is_empty()), "read the store's files: {store:?}");
    let core = imports(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/core/src"));
    assert!(core.contains_key("rules::validate"), "subfolders are read: {core:?}");
}

#[test]
fn no_file_takes_a_sibling_s_names_through_the_crate_root() {
    for src in crates() {
        assert_eq!(through_the_root(&src), Vec::<String>::new(), "{}: import from the file itself", src.display());
    }
}

/// The check itself finds a cycle where there is one.
#[test]
fn a_cycle_of_imports_is_found() {
    let edges: BTreeMap<String, BTreeSet<String>> = [("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]
        .into_iter()
        .map(|(from, to)| (from.to_owned(), BTreeSet::from([to.to_owned()])))
        .collect();
    let cycle = a_cycle(&edges).expect("a cycle");
    assert_eq!(cycle.len(), 3, "{cycle:?}");
    assert_eq!(crate_path("{inspect::{A, b}, C};\nuse x"), "{inspect::{A, b}, C}");
    assert_eq!(crate_path("keys::field::X(1)"), "keys::field::X");
    assert_eq!(
        named_paths("rules::validate", "use super::raw::*;\nuse crate::{keys::A, Store};"),
        ["keys::A", "Store", "rules::raw::"]
    );
}
