//! The store and service crates keep their files in layers: no file imports one that imports it
//! back, directly or through others (a cycle makes every change to one touch the others).

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

/// Each file's imports of the crate's other files: `crate::` paths naming a file, or a name lib.rs
/// re-exports from one (`pub use file::{...}`). Unit tests (`#[cfg(test)]` onwards) do not count.
fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = BTreeMap::new();
    for entry in std::fs::read_dir(src).expect("the crate's src") {
        let path = entry.expect("a file").path();
        let (Some(stem), Some("rs")) =
            (path.file_stem().and_then(|s| s.to_str()), path.extension().and_then(|e| e.to_str()))
        else {
            continue;
        };
        let text = std::fs::read_to_string(&path).expect("readable");
        let code = text.split("#[cfg(test)]").next().unwrap_or_default().to_owned();
        files.insert(stem.to_owned(), code);
    }
    let lib = files.remove("lib").unwrap_or_default();
    let mut owner: HashMap<String, String> = HashMap::new();
    for statement in lib.split(';') {
        let Some(exported) = statement.trim().strip_prefix("pub use ") else { continue };
        let mut names = identifiers(exported);
        if let Some(file) = names.next().filter(|f| files.contains_key(*f)) {
            owner.extend(names.map(|name| (name.to_owned(), file.to_owned())));
        }
    }
    let mut edges = BTreeMap::new();
    for (file, code) in &files {
        let mut to = BTreeSet::new();
        for after in code.split("crate::").skip(1) {
            for name in identifiers(crate_path(after)) {
                let target = if files.contains_key(name) { Some(name) } else { owner.get(name).map(String::as_str) };
                to.extend(target.filter(|t| t != file).map(str::to_owned));
            }
        }
        edges.insert(file.clone(), to);
    }
    edges
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
fn no_file_of_the_store_or_the_service_crate_imports_one_that_imports_it_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for krate in ["shared/store/src", "shared/service/src"] {
        let edges = imports(&root.join(krate));
        assert!(edges.len() > 5, "{krate}: read its files ({edges:?})");
        assert!(edges.values().any(|to| !to.is_empty()), "{krate}: found its imports");
        assert_eq!(a_cycle(&edges), None, "{krate}: files that import each other back");
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
}
