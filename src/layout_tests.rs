//! The layering of the core (docs/layout.md, "The core's modules"), read from
//! the sources: which top modules of `src/` each one names (`crate::name`,
//! test code left out). Apart from the one error every layer converts into
//! and returns (`error`, whose circle with `checkpoint` is by folder only),
//! they form no circle, and `limits` is a leaf. Inside a folder, no files
//! name each other in a circle either.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The identifier `s` starts with.
fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The identifiers `crate::` is followed by in `code` (both of `crate::{a, b}`).
fn named(code: &str) -> Vec<&str> {
    named_after(code, "crate::")
}

/// The identifiers `prefix` is followed by in `code` (both of `prefix{a, b}`).
fn named_after<'a>(code: &'a str, prefix: &str) -> Vec<&'a str> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices(prefix) {
        let rest = &code[at + prefix.len()..];
        match rest.strip_prefix('{') {
            Some(group) => {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                found.extend(group.split(',').map(|item| ident(item.trim())));
            }
            None => found.push(ident(rest)),
        }
    }
    found
}

/// Each top module of `src/` and the top modules it names.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let top = |path: &Path| {
        let first = path
            .strip_prefix(&src)
            .unwrap()
            .components()
            .next()
            .unwrap();
        let name = first.as_os_str().to_string_lossy();
        name.trim_end_matches(".rs").to_owned()
    };
    let modules: BTreeSet<String> = files.iter().map(|f| top(f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy();
        let module = top(file);
        if module == "lib" || name.ends_with("_tests.rs") || name == "tests.rs" {
            continue;
        }
        let code = code_of(file);
        let entry = graph.entry(module.clone()).or_default();
        for target in named(&code) {
            let target = if matches!(target, "Error" | "Result") {
                "error"
            } else {
                target
            };
            if target != module && modules.contains(target) {
                entry.insert(target.to_owned());
            }
        }
    }
    graph
}

/// The code of `file` without comments and inline unit tests (which come last in a file).
fn code_of(file: &Path) -> String {
    let text = fs::read_to_string(file).unwrap();
    let code = text.split("\n#[cfg(test)]\nmod tests {").next().unwrap();
    code.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Each file of each folder of `src/` (by its folder and name) and the files of
/// the same folder it names (`super::name`, `crate::folder::name`).
fn file_imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let folder = file.parent().unwrap();
        let name = file.file_stem().unwrap().to_string_lossy().into_owned();
        if folder == src || name == "mod" || name.ends_with("_tests") || name == "tests" {
            continue;
        }
        let folder_name = folder
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('/', "::");
        let siblings =
            |target: &&str| *target != name && folder.join(format!("{target}.rs")).exists();
        let code = code_of(file);
        let crate_path = format!("crate::{folder_name}::");
        let targets = named_after(&code, "super::")
            .into_iter()
            .chain(named_after(&code, &crate_path))
            .filter(siblings)
            .map(|target| format!("{folder_name}/{target}"));
        graph
            .entry(format!("{folder_name}/{name}"))
            .or_default()
            .extend(targets);
    }
    graph
}

/// A circle of `graph`, if it has one.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut found = path[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, graph, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_core_is_layered_without_circles() {
    let graph = imports();
    assert!(graph["limits"].is_empty(), "{:?}", graph["limits"]);
    let without_error: BTreeMap<String, BTreeSet<String>> = graph
        .iter()
        .filter(|(module, _)| *module != "error")
        .map(|(module, targets)| {
            let targets = targets.iter().filter(|t| *t != "error").cloned();
            (module.clone(), targets.collect())
        })
        .collect();
    assert_eq!(circle(&without_error), None, "{graph:#?}");
}

#[test]
fn no_files_of_a_folder_import_each_other() {
    let graph = file_imports();
    assert!(
        graph.values().any(|targets| !targets.is_empty()),
        "{graph:#?}"
    );
    assert_eq!(circle(&graph), None, "{graph:#?}");
}

#[test]
fn a_circle_is_found() {
    let graph = BTreeMap::from([
        ("a".to_owned(), BTreeSet::from(["b".to_owned()])),
        ("b".to_owned(), BTreeSet::from(["c".to_owned()])),
        ("c".to_owned(), BTreeSet::from(["a".to_owned()])),
    ]);
    assert_eq!(
        circle(&graph),
        Some(["a", "b", "c", "a"].map(String::from).to_vec())
    );
    assert_eq!(
        named("use crate::{Error, Result};\nuse crate::x::Y;"),
        ["Error", "Result", "x"]
    );
}
