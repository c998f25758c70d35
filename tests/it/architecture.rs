//! The library's module graph, computed from `src/`, and the layering
//! `ARCHITECTURE.md` (and docs/internals.md) promise: no dependency cycle between modules (a
//! `mod.rs` and its own children aside), test helpers used only by test
//! helpers, the graph of concerns acyclic and the one `docs/module-edges.txt`
//! lists (a generated file: `TOOLGATE_BLESS=1` rewrites it), and every
//! arrow between concerns running down `LAYERS`, but for the few
//! `BACK_EDGES` named with their reason. Run alone with
//! `cargo test --test it architecture::`.
//!
//! Nodes are the library's modules, one per file (`src/lib.rs` is `crate`,
//! `src/x.rs` or `src/x/mod.rs` is `x`, `src/x/y.rs` is `x::y`); modules
//! that exist only under `#[cfg(test)]` and code under `#[cfg(test)]` are
//! left out; modules under `feature = "test-support"` are nodes of their
//! own kind, and code under it is test-helper code wherever it is.
//!
//! An edge A → B means A's code names an item defined in B: a `crate::`,
//! `super::` or `self::` path, or a path through a name in A's scope (a
//! `use` alias, a child module), in a `use` tree or in code, macro
//! arguments included, resolved through `use` and `pub use` (globs too) to
//! the module that defines the item. A `$crate::` path in a `macro_rules!`
//! body counts for the module that defines the macro. `mod x;` and a
//! re-export are not edges by themselves; naming a module is not, naming
//! an item through it is. Not seen: a type reached only by inference or a
//! method call (a value passed along without its type being named), and a
//! one-segment name inside a macro's arguments.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned as _;
use syn::visit::{self, Visit};
use syn::{Attribute, ImplItem, Item, Meta, TraitItem, UseTree};

const ROOT: usize = 0;
/// The generated list of the concerns' edges, beside the map that explains them.
const EDGES_FILE: &str = "docs/module-edges.txt";
const EDGES_HEADER: &str = "\
# The module graph of src/ collapsed to concerns (each top-level module one
# node, its IO side (`desk`, or `http` for a door's HTTP handlers) apart):
# one `from -> to` line per edge.
# Generated: `TOOLGATE_BLESS=1 cargo test --test it architecture::` rewrites
# it; `cargo test --test it architecture::` fails when it is not the code's.
";

/// The concerns, bottom up: an arrow may run within a layer or down to a
/// lower one, never up (ARCHITECTURE.md, "Layers").
const LAYERS: &[&[&str]] = &[
    // the leaves: time, bytes, contracts
    &["clock", "decode", "tools"],
    // the error table, who is calling, what is counted
    &[
        "envelope",
        "access",
        "identity",
        "metrics",
        "ratelimit",
        "entities",
        "budgets",
    ],
    // the pure cores that judge and record
    &["audit", "policy", "ledger"],
    &["approvals"],
    &["store"],
    // the IO sides of the cores
    &["approvals::desk", "ledger::desk", "entities::desk"],
    &["decision"],
    // the doors' cores, then their IO sides
    &["authzen", "ext_authz", "console"],
    &["authzen::http", "ext_authz::desk", "console::http"],
    &["config", "telemetry"],
    &["grpc"],
    &["listener"],
    &["server"],
    &["cli"],
];

/// The arrows that run up `LAYERS`, each with why it is still there.
const BACK_EDGES: &[(&str, &str, &str)] = &[
    // None: issue 34 moved the last three down (audit → approvals and
    // policy → approvals now read `ApprovedCall` / `ApprovalSubject`, which
    // the records give; ledger::desk → decision reads `AllowedCall`, which
    // the outcome gives).
];

// ---------------------------------------------------------------- the tests

#[test]
fn modules_have_no_cycle_across_subtrees() {
    let report = real_tree();
    println!(
        "{} module(s), {} edge(s), each with its first reference:\n{}",
        report.nodes.len(),
        report.edges.len(),
        show_edges(&report.edges),
    );
    println!(
        "parent/child cycles (informational, {}):\n{}",
        report.lineal_cycles.len(),
        report.show_cycles(&report.lineal_cycles),
    );
    assert!(
        report.cycles.is_empty(),
        "{} module cycle(s) leave a module's subtree; cut one edge of each:\n{}",
        report.cycles.len(),
        report.show_cycles(&report.cycles),
    );
}

#[test]
fn test_support_modules_are_used_only_by_test_support() {
    let report = real_tree();
    println!(
        "test-support modules: {:?}; their edges:\n{}",
        report.test_support,
        show_edges(&report.test_support_edges),
    );
    assert!(
        report.test_support_uses.is_empty(),
        "code outside `feature = \"test-support\"` names a test helper:\n{}",
        show_edges(&report.test_support_uses),
    );
}

#[test]
fn every_source_file_is_a_module_or_a_test() {
    let report = real_tree();
    let src = crate_dir().join("src");
    let mut seen: BTreeSet<PathBuf> = report.files.iter().cloned().collect();
    seen.extend(report.test_files.iter().cloned());
    seen.insert(src.join("main.rs"));
    let orphans: Vec<_> = rust_files(&src)
        .into_iter()
        .filter(|f| !seen.contains(f))
        .collect();
    assert!(
        orphans.is_empty(),
        "files under src/ that no `mod` declares (the graph would miss them): {orphans:?}"
    );
}

#[test]
fn concerns_form_an_acyclic_graph() {
    let report = real_tree();
    print!("{}", report.edge_file());
    assert!(
        report.concern_cycles.is_empty(),
        "{} cycle(s) between concerns (top-level modules, each `desk` and `http` its own):\n{}",
        report.concern_cycles.len(),
        show_cycles_in(&report.concern_edges, &report.concern_cycles),
    );
}

#[test]
fn the_edge_file_lists_the_concern_edges() {
    let report = real_tree();
    let path = crate_dir().join(EDGES_FILE);
    let expected = report.edge_file();
    if std::env::var_os("TOOLGATE_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &expected).unwrap();
        return;
    }
    let listed = std::fs::read_to_string(&path).unwrap_or_default();
    let listed = listed_edges(&listed);
    let actual = report.edge_lines();
    let missing: Vec<_> = actual.iter().filter(|e| !listed.contains(e)).collect();
    let stale: Vec<_> = listed.iter().filter(|e| !actual.contains(e)).collect();
    assert!(
        listed == actual,
        "{EDGES_FILE} is not the code's module graph.\n\
         in the code, not listed: {missing:?}\n\
         listed, not in the code: {stale:?}\n\
         rewrite it with `TOOLGATE_BLESS=1 cargo test --test it architecture::`"
    );
}

#[test]
fn arrows_run_down_the_layers() {
    let report = real_tree();
    let layer_of = layer_index();
    let unplaced: Vec<_> = report
        .concern_edges
        .keys()
        .flat_map(|(from, to)| [from, to])
        .filter(|c| !layer_of.contains_key(c.as_str()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    assert!(
        unplaced.is_empty(),
        "concerns in no layer of LAYERS (tests/it/architecture.rs): {unplaced:?}"
    );
    let up = report.back_edges(&layer_of);
    let allowed: BTreeSet<(String, String)> = BACK_EDGES
        .iter()
        .map(|(from, to, _)| ((*from).to_owned(), (*to).to_owned()))
        .collect();
    println!("{} arrow(s) run back up the layers:", up.len());
    for ((from, to), site) in &up {
        println!("  {from} → {to}: {site}");
    }
    let new: Vec<_> = up
        .iter()
        .filter(|(edge, _)| !allowed.contains(*edge))
        .map(|((from, to), site)| format!("{from} → {to}: {site}"))
        .collect();
    let gone: Vec<_> = allowed
        .iter()
        .filter(|edge| !up.contains_key(*edge))
        .collect();
    assert!(
        new.is_empty(),
        "arrows that run up the layers (move the item down, or name the edge in BACK_EDGES with its reason):\n  {}",
        new.join("\n  ")
    );
    assert!(
        gone.is_empty(),
        "BACK_EDGES names arrows the code no longer has (take them out): {gone:?}"
    );
}

/// The back-edge rule on a small tree: an arrow up is found with where it
/// is written, arrows within a layer and down are not.
#[test]
fn the_checker_finds_an_arrow_up_the_layers() {
    let dir = fixture(&[
        (
            "src/lib.rs",
            "pub mod low;
pub mod mid;
pub mod high;
",
        ),
        (
            "src/low.rs",
            "pub struct L;
pub fn up(_: crate::high::H) {}
",
        ),
        (
            "src/mid.rs",
            "pub struct M(pub crate::low::L);
",
        ),
        (
            "src/high.rs",
            "pub struct H(pub crate::mid::M);
",
        ),
    ]);
    let report = Report::of(&Tree::load(dir.path()));
    let layers = BTreeMap::from([("low", 0), ("mid", 1), ("high", 2)]);
    let up = report.back_edges(&layers);
    let shown: Vec<_> = up
        .iter()
        .map(|((from, to), site)| format!("{from} -> {to} at {site}"))
        .collect();
    assert_eq!(shown.len(), 1, "{shown:?}");
    assert!(shown[0].starts_with("low -> high at "), "{shown:?}");
    assert!(shown[0].contains("low.rs:2"), "{shown:?}");
}

/// A cycle through a glob re-export and a module alias is found, with
/// where each edge is written; test-only code is not counted; a test
/// helper named from ordinary code is reported.
#[test]
fn the_checker_finds_a_cycle_through_a_reexport() {
    let dir = fixture(&[
        (
            "src/lib.rs",
            "pub mod a;\npub mod b;\n#[cfg(feature = \"test-support\")]\npub mod helpers;\n\
             #[cfg(test)]\nmod t;\n",
        ),
        (
            "src/a/mod.rs",
            "mod x;\nmod y;\npub use self::x::*;\n\npub struct Core;\n",
        ),
        (
            "src/a/x.rs",
            "pub struct Ex;\npub fn make() -> crate::b::Bee {\n    crate::b::Bee\n}\n\
             pub fn back() {\n    super::y::why();\n}\n",
        ),
        (
            "src/a/y.rs",
            "use super::x::Ex;\n\npub fn why() -> Option<Ex> {\n    None\n}\n",
        ),
        (
            "src/b.rs",
            "use crate::a;\n\npub struct Bee;\npub fn take(_: a::Ex) {}\n\
             pub fn help(_: crate::helpers::Helper) {}\n\n\
             #[cfg(test)]\nmod tests {\n    use crate::a::Core;\n}\n",
        ),
        ("src/helpers.rs", "pub struct Helper;\n"),
        ("src/t.rs", "use crate::a::Core;\n"),
    ]);
    let report = Report::of(&Tree::load(dir.path()));

    assert_eq!(report.nodes, ["a", "a::x", "a::y", "b", "crate", "helpers"]);
    assert_eq!(report.test_support, ["helpers"]);
    assert_eq!(
        report.shown_cycles(&report.cycles),
        ["a::x → a::y → a::x", "a::x → b → a::x"],
        "{}",
        report.show_cycles(&report.cycles)
    );
    let shown = report.show_cycles(&report.cycles);
    assert!(
        shown.contains("a::x → b: src/a/x.rs:2 `crate::b::Bee`"),
        "{shown}"
    );
    assert!(shown.contains("b → a::x: src/b.rs:4 `a::Ex`"), "{shown}");
    assert!(
        shown.contains("a::x → a::y: src/a/x.rs:6 `super::y::why`"),
        "{shown}"
    );
    assert!(
        shown.contains("a::y → a::x: src/a/y.rs:1 `super::x::Ex`"),
        "{shown}"
    );
    assert!(!report.edges.contains_key(&("b".into(), "a".into())));
    assert_eq!(
        report.test_support_uses.keys().collect::<Vec<_>>(),
        [&("b".to_owned(), "helpers".to_owned())]
    );
    assert_eq!(report.edge_lines(), ["a -> b", "b -> a"]);
    assert_eq!(
        report.concern_cycles,
        [vec!["a".to_owned(), "b".to_owned()]]
    );
}

/// A tree whose only cycle is a `mod.rs` with its own child passes; the
/// cycle is listed apart; a `desk` or `http` is a concern of its own; `$crate::`
/// in a macro, a `self` in braces and test helpers are followed.
#[test]
fn the_checker_passes_a_layered_tree() {
    let dir = fixture(&[
        (
            "src/lib.rs",
            "pub mod a;\npub mod b;\npub mod c;\n\
             #[cfg(any(test, feature = \"test-support\"))]\npub mod helpers;\n",
        ),
        (
            "src/a/mod.rs",
            "pub mod desk;\nmod x;\npub use x::Ex;\n\npub struct Core;\n\
             pub fn first() -> x::Ex {\n    x::Ex(Core)\n}\n",
        ),
        ("src/a/x.rs", "pub struct Ex(pub super::Core);\n"),
        (
            "src/a/desk.rs",
            "use crate::b::Bee;\n\npub fn run(_: Bee, _: super::Core) {}\n",
        ),
        (
            "src/b.rs",
            "use crate::a::{self, Ex};\n\npub struct Bee(pub Ex);\npub fn f(_: a::Core) {}\n\
             #[macro_export]\nmacro_rules! sea {\n    () => {\n        $crate::c::Sea\n    };\n}\n",
        ),
        (
            "src/c.rs",
            "pub struct Sea;\n\n#[cfg(test)]\nmod tests {\n    use crate::b::Bee;\n}\n",
        ),
        (
            "src/helpers.rs",
            "use crate::b::Bee;\n\npub fn h(_: Bee) {}\n",
        ),
    ]);
    let report = Report::of(&Tree::load(dir.path()));

    assert!(
        report.cycles.is_empty(),
        "{}",
        report.show_cycles(&report.cycles)
    );
    assert_eq!(report.shown_cycles(&report.lineal_cycles), ["a → a::x → a"]);
    assert_eq!(report.test_support, ["helpers"]);
    assert!(report.test_support_uses.is_empty());
    assert_eq!(
        report.edge_lines(),
        ["a::desk -> a", "a::desk -> b", "b -> a", "b -> c"]
    );
    assert!(report.concern_cycles.is_empty());
    assert_eq!(listed_edges(&report.edge_file()), report.edge_lines());
}

// ------------------------------------------------------------- the report

/// Where one edge is written: the first reference, in file and line order.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Site {
    file: String,
    line: usize,
    path: String,
}

impl std::fmt::Display for Site {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{} `{}`", self.file, self.line, self.path)
    }
}

type Edges = BTreeMap<(String, String), Site>;

#[derive(Debug)]
struct Report {
    /// Every module (one per file), test helpers included, by name.
    nodes: Vec<String>,
    /// The modules under `feature = "test-support"`.
    test_support: Vec<String>,
    /// Module edges of ordinary code between ordinary modules.
    edges: Edges,
    /// Ordinary code naming a test helper.
    test_support_uses: Edges,
    /// Test-helper code naming anything.
    test_support_edges: Edges,
    /// Cycles with at least one edge between modules neither of which
    /// contains the other (each found once, from its smallest module).
    cycles: Vec<Vec<String>>,
    /// Cycles made only of edges between a module and its descendant.
    lineal_cycles: Vec<Vec<String>>,
    /// The collapsed graph: top-level modules, each `desk` and `http` on its own.
    concern_edges: Edges,
    concern_cycles: Vec<Vec<String>>,
    /// The files read, and those declared only under `#[cfg(test)]`.
    files: Vec<PathBuf>,
    test_files: Vec<PathBuf>,
}

impl Report {
    fn of(tree: &Tree) -> Report {
        let mut edges = Edges::new();
        let mut test_support_uses = Edges::new();
        let mut test_support_edges = Edges::new();
        for reference in &tree.refs {
            let Some(target) = tree.resolve(reference.module, &reference.path) else {
                continue;
            };
            let defined_in = match target {
                Target::Item(module) => module,
                // `use m::*` names the items of `m`; naming `m` alone does not.
                Target::Module(module) if reference.glob => module,
                Target::Module(_) => continue,
            };
            let from = tree.modules[reference.module].file_node;
            let to = tree.modules[defined_in].file_node;
            if from == to {
                continue;
            }
            let site = Site {
                file: tree.modules[from].file.clone(),
                line: reference.line,
                path: reference.path.join("::"),
            };
            let key = (tree.name(from), tree.name(to));
            let helper_code = reference.test_support || tree.modules[from].test_support;
            let map = if helper_code {
                &mut test_support_edges
            } else if tree.modules[to].test_support {
                &mut test_support_uses
            } else {
                &mut edges
            };
            let first = map.entry(key).or_insert_with(|| site.clone());
            if site < *first {
                *first = site;
            }
        }

        let mut cycles = BTreeSet::new();
        let mut lineal_cycles = BTreeSet::new();
        for (from, to) in edges.keys() {
            if !is_lineal(from, to) {
                if let Some(cycle) = cycle_through(&edges, from, to, |_, _| true) {
                    cycles.insert(cycle);
                }
            } else if let Some(cycle) = cycle_through(&edges, from, to, is_lineal) {
                lineal_cycles.insert(cycle);
            }
        }

        let mut concern_edges = Edges::new();
        for ((from, to), site) in &edges {
            let (from, to) = (concern(from), concern(to));
            if from != to {
                let first = concern_edges
                    .entry((from, to))
                    .or_insert_with(|| site.clone());
                if *site < *first {
                    *first = site.clone();
                }
            }
        }
        let mut concern_cycles = BTreeSet::new();
        for (from, to) in concern_edges.keys() {
            if let Some(cycle) = cycle_through(&concern_edges, from, to, |_, _| true) {
                concern_cycles.insert(cycle);
            }
        }

        let file_nodes =
            || (0..tree.modules.len()).filter(move |&m| tree.modules[m].file_node == m);
        let mut nodes: Vec<String> = file_nodes().map(|m| tree.name(m)).collect();
        nodes.sort();
        let mut test_support: Vec<String> = file_nodes()
            .filter(|&m| tree.modules[m].test_support)
            .map(|m| tree.name(m))
            .collect();
        test_support.sort();
        Report {
            nodes,
            test_support,
            edges,
            test_support_uses,
            test_support_edges,
            cycles: cycles.into_iter().collect(),
            lineal_cycles: lineal_cycles.into_iter().collect(),
            concern_edges,
            concern_cycles: concern_cycles.into_iter().collect(),
            files: file_nodes()
                .map(|m| tree.modules[m].path_on_disk.clone())
                .collect(),
            test_files: tree.test_files.clone(),
        }
    }

    /// `a → b → a`, one line per cycle.
    fn shown_cycles(&self, cycles: &[Vec<String>]) -> Vec<String> {
        cycles.iter().map(|cycle| arrow_path(cycle)).collect()
    }

    /// Each cycle as a path, then where each of its edges is written.
    fn show_cycles(&self, cycles: &[Vec<String>]) -> String {
        show_cycles_in(&self.edges, cycles)
    }

    /// The collapsed edges, sorted, as `a -> b` lines.
    fn edge_lines(&self) -> Vec<String> {
        self.concern_edges
            .keys()
            .map(|(from, to)| format!("{from} -> {to}"))
            .collect()
    }

    /// The text of `EDGES_FILE`.
    fn edge_file(&self) -> String {
        let mut file = EDGES_HEADER.to_owned();
        for line in self.edge_lines() {
            file.push_str(&line);
            file.push('\n');
        }
        file
    }

    /// The concern edges that run from a lower layer to a higher one, each
    /// with its first reference.
    fn back_edges(&self, layer_of: &BTreeMap<&str, usize>) -> Edges {
        self.concern_edges
            .iter()
            .filter(|((from, to), _)| {
                matches!(
                    (layer_of.get(from.as_str()), layer_of.get(to.as_str())),
                    (Some(f), Some(t)) if t > f
                )
            })
            .map(|(edge, site)| (edge.clone(), site.clone()))
            .collect()
    }
}

fn arrow_path(cycle: &[String]) -> String {
    let mut shown = cycle.join(" → ");
    if let Some(first) = cycle.first() {
        write!(shown, " → {first}").unwrap();
    }
    shown
}

fn show_cycles_in(edges: &Edges, cycles: &[Vec<String>]) -> String {
    let mut out = String::new();
    for cycle in cycles {
        writeln!(out, "  {}", arrow_path(cycle)).unwrap();
        for (i, from) in cycle.iter().enumerate() {
            let to = &cycle[(i + 1) % cycle.len()];
            let site = &edges[&(from.clone(), to.clone())];
            writeln!(out, "      {from} → {to}: {site}").unwrap();
        }
    }
    out
}

fn show_edges(edges: &Edges) -> String {
    edges
        .iter()
        .map(|((from, to), site)| format!("  {from} → {to}: {site}\n"))
        .collect()
}

/// The `a -> b` lines of an edge file (comments and blank lines aside).
fn listed_edges(file: &str) -> Vec<String> {
    file.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Each concern's layer, from `LAYERS`.
fn layer_index() -> BTreeMap<&'static str, usize> {
    let mut index = BTreeMap::new();
    for (layer, concerns) in LAYERS.iter().enumerate() {
        for concern in *concerns {
            assert!(
                index.insert(*concern, layer).is_none(),
                "{concern} is in two layers of LAYERS"
            );
        }
    }
    index
}

/// One module contains the other (the crate root contains every module).
fn is_lineal(a: &str, b: &str) -> bool {
    let contains = |outer: &str, inner: &str| {
        outer == "crate"
            || inner
                .strip_prefix(outer)
                .is_some_and(|rest| rest.starts_with("::"))
    };
    contains(a, b) || contains(b, a)
}

/// The concern a module belongs to: its top-level module, except that a
/// top-level module's `desk` (the IO side of the concern) or `http` (a door's
/// HTTP handlers) is its own.
fn concern(module: &str) -> String {
    let mut segments = module.split("::");
    let top = segments.next().unwrap_or(module);
    match segments.next() {
        Some(side @ ("desk" | "http")) => format!("{top}::{side}"),
        _ => top.to_owned(),
    }
}

/// The shortest cycle through the edge `from → to` whose way back from
/// `to` uses only edges `usable` allows, rotated to start at its smallest
/// node (so one cycle found from several edges is reported once).
fn cycle_through(
    edges: &Edges,
    from: &str,
    to: &str,
    usable: impl Fn(&str, &str) -> bool,
) -> Option<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (a, b) in edges.keys() {
        if usable(a, b) {
            next.entry(a.as_str()).or_default().push(b.as_str());
        }
    }
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([to]);
    let mut reached = to == from;
    while let Some(node) = queue.pop_front() {
        if node == from {
            reached = true;
            break;
        }
        for &succ in next.get(node).into_iter().flatten() {
            if succ != to && !came_from.contains_key(succ) {
                came_from.insert(succ, node);
                queue.push_back(succ);
            }
        }
    }
    if !reached {
        return None;
    }
    // from → to → … → from: walk back from `from` to `to`.
    let mut back = vec![from];
    let mut node = from;
    while node != to {
        node = came_from[node];
        back.push(node);
    }
    back.reverse(); // to … from
    let mut cycle: Vec<String> = std::iter::once(from)
        .chain(back.into_iter().take_while(|&n| n != from))
        .map(str::to_owned)
        .collect();
    let smallest = (0..cycle.len()).min_by_key(|&i| &cycle[i]).unwrap_or(0);
    cycle.rotate_left(smallest);
    Some(cycle)
}

// --------------------------------------------------------------- the tree

#[derive(Debug)]
struct Module {
    /// The path from the crate root, `[]` for the root.
    path: Vec<String>,
    parent: Option<usize>,
    /// The file-backed module whose file holds this one's code: itself,
    /// or for an inline `mod x { … }` the module of the enclosing file.
    file_node: usize,
    /// The file, relative to the crate (`src/store/mod.rs`).
    file: String,
    path_on_disk: PathBuf,
    /// Where `mod x;` inside this module looks for `x.rs` or `x/mod.rs`.
    child_dir: PathBuf,
    children: BTreeMap<String, usize>,
    /// The names of the items defined here, every namespace together.
    items: BTreeSet<String>,
    imports: Vec<Import>,
    test_support: bool,
}

#[derive(Debug, Clone)]
struct Import {
    /// The name the import binds; `None` for a glob or `as _`.
    name: Option<String>,
    glob: bool,
    path: Vec<String>,
}

/// A path written in a module's code or private `use`.
#[derive(Debug)]
struct Ref {
    module: usize,
    path: Vec<String>,
    line: usize,
    /// Written in code under `feature = "test-support"`.
    test_support: bool,
    glob: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Module(usize),
    /// An item, by the module that defines it.
    Item(usize),
}

#[derive(Debug)]
struct Tree {
    crate_dir: PathBuf,
    modules: Vec<Module>,
    refs: Vec<Ref>,
    test_files: Vec<PathBuf>,
}

impl Tree {
    fn load(crate_dir: &Path) -> Tree {
        let mut tree = Tree {
            crate_dir: crate_dir.to_owned(),
            modules: Vec::new(),
            refs: Vec::new(),
            test_files: Vec::new(),
        };
        let root = tree.load_file(crate_dir.join("src/lib.rs"), Vec::new(), None, false);
        assert_eq!(root, Some(ROOT));
        tree
    }

    fn name(&self, module: usize) -> String {
        let path = &self.modules[module].path;
        if path.is_empty() {
            "crate".to_owned()
        } else {
            path.join("::")
        }
    }

    fn load_file(
        &mut self,
        file: PathBuf,
        path: Vec<String>,
        parent: Option<usize>,
        test_support: bool,
    ) -> Option<usize> {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading `{}`: {e}", file.display()));
        let ast =
            syn::parse_file(&text).unwrap_or_else(|e| panic!("parsing `{}`: {e}", file.display()));
        let test_support = match cfg_gate(&ast.attrs) {
            Gate::TestOnly => {
                self.test_files.push(file);
                return None;
            }
            Gate::TestSupport => true,
            Gate::Always => test_support,
        };
        let dir = file.parent().unwrap().to_owned();
        let child_dir = match file.file_name().and_then(|n| n.to_str()) {
            Some("lib.rs" | "mod.rs") => dir,
            _ => dir.join(file.file_stem().unwrap()),
        };
        let id = self.modules.len();
        self.modules.push(Module {
            path,
            parent,
            file_node: id,
            file: file
                .strip_prefix(&self.crate_dir)
                .unwrap()
                .display()
                .to_string(),
            path_on_disk: file,
            child_dir,
            children: BTreeMap::new(),
            items: BTreeSet::new(),
            imports: Vec::new(),
            test_support,
        });
        self.walk(id, &ast.items, test_support);
        Some(id)
    }

    fn walk(&mut self, module: usize, items: &[Item], test_support: bool) {
        for item in items {
            let test_support = match cfg_gate(item_attrs(item)) {
                Gate::TestOnly => {
                    if let Item::Mod(decl) = item {
                        self.skip_test_module(module, decl);
                    }
                    continue;
                }
                Gate::TestSupport => true,
                Gate::Always => test_support,
            };
            match item {
                Item::Mod(decl) => self.add_mod(module, decl, test_support),
                Item::Use(decl) => self.add_use(module, decl, test_support),
                _ => {
                    if let Some(name) = item_name(item) {
                        self.modules[module].items.insert(name);
                    }
                    let mut collector = Collector {
                        module,
                        test_support,
                        refs: Vec::new(),
                        uses: Vec::new(),
                    };
                    collector.visit_item(item);
                    self.refs.extend(collector.refs);
                    for (decl, test_support) in collector.uses {
                        self.add_use(module, &decl, test_support);
                    }
                }
            }
        }
    }

    /// A `#[cfg(test)] mod x;`: its file, remembered as a test's. A test
    /// module may name its file with `#[path = "x_tests.rs"]` (a sibling
    /// of the file declaring it, as rustc reads a path in a file-backed
    /// module), so a leaf module keeps its tests beside it without
    /// becoming a folder.
    fn skip_test_module(&mut self, module: usize, decl: &syn::ItemMod) {
        if decl.content.is_some() {
            return;
        }
        let named = decl.attrs.iter().find_map(|a| match &a.meta {
            syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => Some(s.value()),
                _ => None,
            },
            _ => None,
        });
        let file = match named {
            Some(relative) => {
                let declaring = &self.modules[self.modules[module].file_node].path_on_disk;
                let file = declaring.parent().unwrap().join(relative);
                assert!(
                    file.exists(),
                    "`#[path]` test module: no `{}`",
                    file.display()
                );
                file
            }
            None => self.module_file(module, &decl.ident.to_string()),
        };
        self.test_files.push(file);
    }

    fn module_file(&self, module: usize, name: &str) -> PathBuf {
        let dir = &self.modules[module].child_dir;
        let flat = dir.join(format!("{name}.rs"));
        let nested = dir.join(name).join("mod.rs");
        match (flat.exists(), nested.exists()) {
            (true, false) => flat,
            (false, true) => nested,
            (true, true) => panic!("both `{}` and `{}`", flat.display(), nested.display()),
            (false, false) => panic!("`mod {name};`: no `{}`", flat.display()),
        }
    }

    fn add_mod(&mut self, module: usize, decl: &syn::ItemMod, test_support: bool) {
        assert!(
            !decl.attrs.iter().any(|a| a.path().is_ident("path")),
            "`#[path]` on `mod {}` in `{}`: not followed by this test",
            decl.ident,
            self.modules[module].file
        );
        let name = decl.ident.to_string();
        let mut path = self.modules[module].path.clone();
        path.push(name.clone());
        let test_support = test_support || self.modules[module].test_support;
        let id = match &decl.content {
            Some((_, items)) => {
                let id = self.modules.len();
                let outer = &self.modules[module];
                let inline = Module {
                    path,
                    parent: Some(module),
                    file_node: outer.file_node,
                    file: outer.file.clone(),
                    path_on_disk: outer.path_on_disk.clone(),
                    child_dir: outer.child_dir.join(&name),
                    children: BTreeMap::new(),
                    items: BTreeSet::new(),
                    imports: Vec::new(),
                    test_support,
                };
                self.modules.push(inline);
                self.walk(id, items, test_support);
                id
            }
            None => {
                let file = self.module_file(module, &name);
                match self.load_file(file, path, Some(module), test_support) {
                    Some(id) => id,
                    None => return,
                }
            }
        };
        self.modules[module].children.insert(name, id);
    }

    /// Binds the names of a `use`; a private `use` is also a reference
    /// (a re-export is not one by itself: naming what it re-exports is).
    fn add_use(&mut self, module: usize, decl: &syn::ItemUse, test_support: bool) {
        if decl.leading_colon.is_some() {
            return;
        }
        let reexport = !matches!(decl.vis, syn::Visibility::Inherited);
        let mut leaves = Vec::new();
        flatten_use(&decl.tree, &mut Vec::new(), &mut leaves);
        for leaf in leaves {
            self.modules[module].imports.push(Import {
                name: leaf.name,
                glob: leaf.glob,
                path: leaf.path.clone(),
            });
            if !reexport {
                self.refs.push(Ref {
                    module,
                    path: leaf.path,
                    line: leaf.line,
                    test_support,
                    glob: leaf.glob,
                });
            }
        }
    }

    fn resolve(&self, from: usize, path: &[String]) -> Option<Target> {
        self.resolve_in(from, path, &mut BTreeSet::new())
    }

    /// What `path`, written in module `from`, names. `None`: something
    /// outside the crate (or not followed: a variant through a glob).
    /// `busy` holds the imports being resolved, so that cyclic globs end.
    fn resolve_in(
        &self,
        from: usize,
        path: &[String],
        busy: &mut BTreeSet<(usize, usize)>,
    ) -> Option<Target> {
        let (first, rest) = path.split_first()?;
        let mut at = match first.as_str() {
            "crate" | "$crate" => ROOT,
            "self" => from,
            "super" => self.modules[from].parent?,
            "Self" => return None,
            name => match self.lookup(from, name, rest.is_empty(), busy)? {
                Target::Item(module) => return Some(Target::Item(module)),
                Target::Module(module) => module,
            },
        };
        for (i, segment) in rest.iter().enumerate() {
            at = match segment.as_str() {
                "super" => self.modules[at].parent?,
                "self" => at,
                name => match self.lookup(at, name, i + 1 == rest.len(), busy)? {
                    // The rest (a variant, an associated item) is the item's.
                    Target::Item(module) => return Some(Target::Item(module)),
                    Target::Module(module) => module,
                },
            };
        }
        Some(Target::Module(at))
    }

    /// `name` as seen inside `module`: its items, its child modules, its
    /// named imports, then (only if none of those) its globs. Where a path
    /// ends an item wins over a module of the same name; before, a module.
    fn lookup(
        &self,
        module: usize,
        name: &str,
        last: bool,
        busy: &mut BTreeSet<(usize, usize)>,
    ) -> Option<Target> {
        let here = &self.modules[module];
        let mut found = Vec::new();
        if here.items.contains(name) {
            found.push(Target::Item(module));
        }
        if let Some(&child) = here.children.get(name) {
            found.push(Target::Module(child));
        }
        for (i, import) in here.imports.iter().enumerate() {
            if import.name.as_deref() == Some(name) && busy.insert((module, i)) {
                found.extend(self.resolve_in(module, &import.path, busy));
                busy.remove(&(module, i));
            }
        }
        if found.is_empty() {
            for (i, import) in here.imports.iter().enumerate() {
                if import.glob && busy.insert((module, i)) {
                    if let Some(Target::Module(source)) =
                        self.resolve_in(module, &import.path, busy)
                    {
                        found.extend(self.lookup(source, name, last, busy));
                    }
                    busy.remove(&(module, i));
                }
            }
        }
        let item = found.iter().find(|t| matches!(t, Target::Item(_)));
        let module = found.iter().find(|t| matches!(t, Target::Module(_)));
        if last {
            item.or(module).copied()
        } else {
            module.or(item).copied()
        }
    }
}

struct Leaf {
    name: Option<String>,
    glob: bool,
    path: Vec<String>,
    line: usize,
}

fn flatten_use(tree: &UseTree, prefix: &mut Vec<String>, out: &mut Vec<Leaf>) {
    let bind = |prefix: &[String], ident: &syn::Ident| -> Vec<String> {
        let mut path = prefix.to_vec();
        if ident != "self" {
            path.push(ident.to_string());
        }
        path
    };
    match tree {
        UseTree::Path(p) => {
            prefix.push(p.ident.to_string());
            flatten_use(&p.tree, prefix, out);
            prefix.pop();
        }
        UseTree::Name(n) => {
            let path = bind(prefix, &n.ident);
            out.push(Leaf {
                name: path.last().cloned(),
                glob: false,
                path,
                line: line_of(n.ident.span()),
            });
        }
        UseTree::Rename(r) => out.push(Leaf {
            name: (r.rename != "_").then(|| r.rename.to_string()),
            glob: false,
            path: bind(prefix, &r.ident),
            line: line_of(r.ident.span()),
        }),
        UseTree::Glob(g) => out.push(Leaf {
            name: None,
            glob: true,
            path: prefix.clone(),
            line: line_of(g.span()),
        }),
        UseTree::Group(g) => {
            for tree in &g.items {
                flatten_use(tree, prefix, out);
            }
        }
    }
}

fn line_of(span: proc_macro2::Span) -> usize {
    span.start().line
}

/// The paths in one item's code, outside `#[cfg(test)]`, and the `use`
/// declarations in its blocks (bound as the module's: close enough).
struct Collector {
    module: usize,
    test_support: bool,
    refs: Vec<Ref>,
    uses: Vec<(syn::ItemUse, bool)>,
}

impl Collector {
    fn gated(&mut self, attrs: &[Attribute], visit: impl FnOnce(&mut Self)) {
        match cfg_gate(attrs) {
            Gate::TestOnly => {}
            Gate::TestSupport => {
                let outer = self.test_support;
                self.test_support = true;
                visit(self);
                self.test_support = outer;
            }
            Gate::Always => visit(self),
        }
    }

    fn push(&mut self, path: Vec<String>, line: usize) {
        self.refs.push(Ref {
            module: self.module,
            path,
            line,
            test_support: self.test_support,
            glob: false,
        });
    }
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item(&mut self, item: &'ast Item) {
        self.gated(item_attrs(item), |c| match item {
            Item::Use(decl) => c.uses.push((decl.clone(), c.test_support)),
            // A module inside a function body is not one of the crate's.
            Item::Mod(_) => {}
            _ => visit::visit_item(c, item),
        });
    }

    fn visit_impl_item(&mut self, item: &'ast ImplItem) {
        let attrs = match item {
            ImplItem::Const(i) => &i.attrs,
            ImplItem::Fn(i) => &i.attrs,
            ImplItem::Type(i) => &i.attrs,
            ImplItem::Macro(i) => &i.attrs,
            _ => &Vec::new(),
        };
        self.gated(attrs, |c| visit::visit_impl_item(c, item));
    }

    fn visit_trait_item(&mut self, item: &'ast TraitItem) {
        let attrs = match item {
            TraitItem::Const(i) => &i.attrs,
            TraitItem::Fn(i) => &i.attrs,
            TraitItem::Type(i) => &i.attrs,
            TraitItem::Macro(i) => &i.attrs,
            _ => &Vec::new(),
        };
        self.gated(attrs, |c| visit::visit_trait_item(c, item));
    }

    fn visit_field(&mut self, field: &'ast syn::Field) {
        self.gated(&field.attrs, |c| visit::visit_field(c, field));
    }

    fn visit_variant(&mut self, variant: &'ast syn::Variant) {
        self.gated(&variant.attrs, |c| visit::visit_variant(c, variant));
    }

    fn visit_arm(&mut self, arm: &'ast syn::Arm) {
        self.gated(&arm.attrs, |c| visit::visit_arm(c, arm));
    }

    fn visit_local(&mut self, local: &'ast syn::Local) {
        self.gated(&local.attrs, |c| visit::visit_local(c, local));
    }

    fn visit_field_value(&mut self, field: &'ast syn::FieldValue) {
        self.gated(&field.attrs, |c| visit::visit_field_value(c, field));
    }

    fn visit_stmt_macro(&mut self, stmt: &'ast syn::StmtMacro) {
        self.gated(&stmt.attrs, |c| visit::visit_stmt_macro(c, stmt));
    }

    /// Attributes name derives and tools outside the crate, and their
    /// strings are not code.
    fn visit_attribute(&mut self, _: &'ast Attribute) {}

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
            self.push(segments, line_of(path.span()));
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        visit::visit_macro(self, mac);
        let mut found = Vec::new();
        token_paths(mac.tokens.clone(), &mut found);
        for (path, line) in found {
            self.push(path, line);
        }
    }
}

/// The paths of two segments or more in a macro's tokens (its arguments,
/// or a `macro_rules!` body, where `$crate` is the crate root).
fn token_paths(tokens: TokenStream, out: &mut Vec<(Vec<String>, usize)>) {
    let tokens: Vec<TokenTree> = tokens.into_iter().collect();
    let is_punct = |i: usize, ch: char| matches!(tokens.get(i), Some(TokenTree::Punct(p)) if p.as_char() == ch);
    let path_sep = |i: usize| {
        matches!(tokens.get(i), Some(TokenTree::Punct(p)) if p.as_char() == ':' && p.spacing() == Spacing::Joint)
            && is_punct(i + 1, ':')
    };
    let mut i = 0;
    while let Some(token) = tokens.get(i) {
        let (first, line, mut next) = match token {
            TokenTree::Group(group) => {
                token_paths(group.stream(), out);
                i += 1;
                continue;
            }
            TokenTree::Punct(p) if p.as_char() == '$' => match tokens.get(i + 1) {
                Some(TokenTree::Ident(id)) if id == "crate" => {
                    ("$crate".to_owned(), line_of(id.span()), i + 2)
                }
                // A metavariable (`$x`), not a path.
                _ => {
                    i += 2;
                    continue;
                }
            },
            TokenTree::Ident(id) => (id.to_string(), line_of(id.span()), i + 1),
            TokenTree::Punct(_) | TokenTree::Literal(_) => {
                i += 1;
                continue;
            }
        };
        let leading_colon = i >= 2 && path_sep(i - 2);
        let mut path = vec![first];
        while path_sep(next) {
            match tokens.get(next + 2) {
                Some(TokenTree::Ident(id)) => {
                    path.push(id.to_string());
                    next += 3;
                }
                _ => break,
            }
        }
        if path.len() >= 2 && !leading_colon {
            out.push((path, line));
        }
        i = next;
    }
}

fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn item_name(item: &Item) -> Option<String> {
    let ident = match item {
        Item::Const(i) => &i.ident,
        Item::Enum(i) => &i.ident,
        Item::ExternCrate(i) => i.rename.as_ref().map_or(&i.ident, |(_, r)| r),
        Item::Fn(i) => &i.sig.ident,
        Item::Macro(i) => i.ident.as_ref()?,
        Item::Static(i) => &i.ident,
        Item::Struct(i) => &i.ident,
        Item::Trait(i) => &i.ident,
        Item::TraitAlias(i) => &i.ident,
        Item::Type(i) => &i.ident,
        Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

// ------------------------------------------------------------------ cfg

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Compiled in the library as shipped.
    Always,
    /// Compiled only with `feature = "test-support"`.
    TestSupport,
    /// Compiled only under `cfg(test)`.
    TestOnly,
}

/// What the `#[cfg]`s make of an item. Other conditions (`unix`, other
/// features) may hold, so they neither keep an item out nor in.
pub(crate) fn cfg_gate(attrs: &[Attribute]) -> Gate {
    let (mut shipped, mut with_helpers) = (true, true);
    for attr in attrs.iter().filter(|a| a.path().is_ident("cfg")) {
        let predicate: Meta = attr.parse_args().unwrap();
        shipped &= holds(&predicate, false) != Some(false);
        with_helpers &= holds(&predicate, true) != Some(false);
    }
    match (shipped, with_helpers) {
        (true, _) => Gate::Always,
        (false, true) => Gate::TestSupport,
        (false, false) => Gate::TestOnly,
    }
}

/// Whether a cfg predicate holds outside `cfg(test)`, with or without
/// the `test-support` feature; `None` when it depends on something else.
fn holds(predicate: &Meta, test_support: bool) -> Option<bool> {
    match predicate {
        Meta::Path(path) if path.is_ident("test") => Some(false),
        Meta::NameValue(nv) if nv.path.is_ident("feature") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) if s.value() == "test-support" => Some(test_support),
            _ => None,
        },
        Meta::List(list) => {
            let args = list
                .parse_args_with(Punctuated::<Meta, syn::Token![,]>::parse_terminated)
                .unwrap();
            let values: Vec<Option<bool>> = args.iter().map(|m| holds(m, test_support)).collect();
            if list.path.is_ident("not") {
                values.first().copied().flatten().map(|v| !v)
            } else if list.path.is_ident("all") {
                if values.contains(&Some(false)) {
                    Some(false)
                } else if values.iter().all(|v| *v == Some(true)) {
                    Some(true)
                } else {
                    None
                }
            } else if list.path.is_ident("any") {
                if values.contains(&Some(true)) {
                    Some(true)
                } else if values.iter().all(|v| *v == Some(false)) {
                    Some(false)
                } else {
                    None
                }
            } else {
                None
            }
        }
        _ => None,
    }
}

// ------------------------------------------------------------- helpers

pub(crate) fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The real tree, read once for all the tests above.
/// The library's source files compiled outside `cfg(test)` (test-support
/// helpers included).
pub(crate) fn non_test_sources() -> Vec<PathBuf> {
    real_tree().files.clone()
}

fn real_tree() -> &'static Report {
    static REPORT: OnceLock<Report> = OnceLock::new();
    REPORT.get_or_init(|| Report::of(&Tree::load(&crate_dir())))
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// A crate in a temporary folder, from (path, text) pairs.
fn fixture(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    dir
}
