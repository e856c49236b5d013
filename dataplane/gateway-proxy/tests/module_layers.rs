//! The crate's modules form a layered stack: no module reaches, through the `crate::` paths it
//! names, a module that names it back. A cycle (13 modules once went round in one, through
//! `error.rs` naming `upgrade.rs`) makes every module depend on every other, so a change to the
//! error type recompiles and re-reviews the whole crate. Read from the sources, so it fails the
//! moment someone names a higher module from a lower one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Module name -> the sibling modules its code (a submodule's folder included) names.
type Graph = BTreeMap<String, BTreeSet<String>>;

fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("source folder") {
        let path = entry.expect("folder entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            out.push(path);
        }
    }
}

/// The identifiers right after each `crate::` in `line`, and the names inside a
/// `use crate::{a, b::c}` group.
fn crate_paths(line: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (index, _) in line.match_indices("crate::") {
        let rest = &line[index + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or("");
            names.extend(group.split(',').map(|item| leading_ident(item.trim())));
        } else {
            names.push(leading_ident(rest));
        }
    }
    names.retain(|name| !name.is_empty());
    names
}

fn leading_ident(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

/// The module graph of the crate's sources (comments left out: a doc link is no dependency).
fn module_graph() -> Graph {
    let src = source_dir();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let module_of = |path: &Path| -> String {
        let relative = path.strip_prefix(&src).expect("under src");
        let first = relative.components().next().expect("a component");
        let first = first.as_os_str().to_string_lossy();
        first.trim_end_matches(".rs").to_string()
    };
    let modules: BTreeSet<String> = files
        .iter()
        .map(|path| module_of(path))
        .filter(|module| module != "lib")
        .collect();
    let mut graph: Graph = modules
        .iter()
        .map(|module| (module.clone(), BTreeSet::new()))
        .collect();
    for path in &files {
        let module = module_of(path);
        let Some(edges) = graph.get_mut(&module) else {
            continue;
        };
        let text = std::fs::read_to_string(path).expect("source file");
        for line in text.lines() {
            let code = line.split("//").next().unwrap_or("");
            for name in crate_paths(code) {
                if name != module && modules.contains(&name) {
                    edges.insert(name);
                }
            }
        }
    }
    graph
}

/// A cycle of `graph` as the path round it, if there is one (depth-first search).
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        graph: &Graph,
        module: &str,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(module) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = path.iter().position(|seen| seen == module).unwrap_or(0);
                let mut cycle = path[start..].to_vec();
                cycle.push(module.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(module.to_string(), Mark::Open);
        path.push(module.to_string());
        for next in &graph[module] {
            if let Some(cycle) = visit(graph, next, marks, path) {
                return Some(cycle);
            }
        }
        path.pop();
        marks.insert(module.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for module in graph.keys() {
        let mut path = Vec::new();
        if let Some(cycle) = visit(graph, module, &mut marks, &mut path) {
            return Some(cycle);
        }
    }
    None
}

#[test]
fn the_modules_import_each_other_in_no_cycle() {
    let graph = module_graph();
    assert!(
        graph.len() >= 20 && graph.contains_key("handler") && graph.contains_key("error"),
        "the sources were read: {:?}",
        graph.keys().collect::<Vec<_>>()
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_error_type_and_the_metrics_sit_below_what_uses_them() {
    let graph = module_graph();
    assert_eq!(
        graph["error"],
        BTreeSet::new(),
        "error.rs (and error/) names no other module of the crate"
    );
    let below_metrics = ["error", "fair_metrics", "forward_metrics"];
    for module in ["metrics", "tls", "fair_metrics", "forward_metrics"] {
        let named: Vec<_> = graph[module]
            .iter()
            .filter(|name| !below_metrics.contains(&name.as_str()))
            .collect();
        assert!(
            named.is_empty(),
            "{module}.rs names only the error type and the metric families, not {named:?}"
        );
    }
}

#[test]
fn a_planted_cycle_is_found() {
    let mut graph = module_graph();
    graph
        .get_mut("error")
        .expect("error module")
        .insert("handler".to_string());
    let cycle = find_cycle(&graph).expect("error -> handler -> error is a cycle");
    assert!(cycle.contains(&"error".to_string()), "{cycle:?}");
    assert_eq!(cycle.first(), cycle.last(), "{cycle:?}");
}

#[test]
fn crate_paths_are_read_from_plain_and_grouped_uses() {
    assert_eq!(crate_paths("use crate::error::ProxyError;"), ["error"]);
    assert_eq!(
        crate_paths("use crate::{head::Rewind, state};"),
        ["head", "state"]
    );
    assert_eq!(
        crate_paths("let x = crate::answer::record(crate::metrics::X);"),
        ["answer", "metrics"]
    );
}
