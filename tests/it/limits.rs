//! The house's size limits (issue 34): no file under `src/` holds more than
//! `MAX_FILE_LINES` lines of code outside its tests, and no function is
//! longer than `MAX_FN_LINES` lines, but for the exceptions named below
//! with their reason. Run alone with `cargo test --test it limits::`.
//!
//! A line of code is a line that is neither blank nor only a comment (doc
//! comments are comments); code under `#[cfg(test)]` (a test module, a
//! file declared only under it) is not counted. A function's length runs
//! from its `fn` keyword to its closing brace, blank lines and comments
//! inside it included: what a reader has to hold at once.
//!
//! And no signature outside tests returns a `Result` of a `Result`: a
//! refusal that is a decision is an [`toolgate::envelope::Checked`], an
//! executor's mistake the error around it; a row that cannot be read is
//! one error, not two.

use std::collections::BTreeMap;
use std::path::Path;

use syn::spanned::Spanned as _;
use syn::visit::{self, Visit};
use syn::{Attribute, ImplItemFn, ItemFn, TraitItemFn};

use crate::architecture::{Gate, cfg_gate, crate_dir, non_test_sources};

const MAX_FILE_LINES: usize = 800;
const MAX_FN_LINES: usize = 120;

/// Files allowed more than `MAX_FILE_LINES`: path under the crate, the
/// most they may hold, and why.
const FILE_EXCEPTIONS: &[(&str, usize, &str)] = &[];

/// Functions allowed more than `MAX_FN_LINES`: `path::name` (the file and
/// the function's own name), the most lines, and why.
const FN_EXCEPTIONS: &[(&str, usize, &str)] = &[
    (
        "src/envelope.rs::info",
        220,
        "the error table of DESIGN §6: one match arm per code, read (and pinned by table_is_locked) as one table",
    ),
    (
        "src/metrics.rs::default",
        140,
        "the registry: every metric registered in one place, so that their names are read and reviewed together",
    ),
];

#[test]
fn no_file_or_function_outgrows_the_limits() {
    let root = crate_dir();
    let mut files = BTreeMap::new();
    let mut functions: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for file in non_test_sources() {
        let rel = file
            .strip_prefix(&root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let measured = measure(&file);
        files.insert(rel.clone(), measured.code_lines);
        for (name, line, len) in measured.functions {
            let longest = functions.entry(format!("{rel}::{name}")).or_insert((0, 0));
            if len > longest.0 {
                *longest = (len, line);
            }
        }
    }
    let mut over = Vec::new();
    for (rel, lines) in &files {
        let limit = limit_of(FILE_EXCEPTIONS, rel, MAX_FILE_LINES);
        if *lines > limit {
            over.push(format!(
                "{rel}: {lines} lines of code outside tests (limit {limit})"
            ));
        }
    }
    for (key, (len, line)) in &functions {
        let limit = limit_of(FN_EXCEPTIONS, key, MAX_FN_LINES);
        if *len > limit {
            over.push(format!("{key} (line {line}): {len} lines (limit {limit})"));
        }
    }
    let mut largest: Vec<_> = files.iter().map(|(f, n)| (*n, f)).collect();
    largest.sort_by(|a, b| b.cmp(a));
    let mut longest: Vec<_> = functions.iter().map(|(f, (n, _))| (*n, f)).collect();
    longest.sort_by(|a, b| b.cmp(a));
    println!("largest files (lines of code outside tests):");
    for (n, f) in largest.iter().take(8) {
        println!("  {n:5} {f}");
    }
    println!("longest functions (lines):");
    for (n, f) in longest.iter().take(8) {
        println!("  {n:5} {f}");
    }
    assert!(
        over.is_empty(),
        "over the house's limits (split by concern, or name an exception with its reason in tests/it/limits.rs):\n  {}",
        over.join("\n  ")
    );
    for (name, _, why) in FILE_EXCEPTIONS {
        assert!(why.len() > 10, "the exception for {name} gives no reason");
        assert!(
            files.get(*name).is_some_and(|n| *n > MAX_FILE_LINES),
            "the exception for {name} is no longer needed: take it out"
        );
    }
    for (name, _, why) in FN_EXCEPTIONS {
        assert!(why.len() > 10, "the exception for {name} gives no reason");
        assert!(
            functions.get(*name).is_some_and(|(n, _)| *n > MAX_FN_LINES),
            "the exception for {name} is no longer needed: take it out"
        );
    }
}

#[test]
fn no_signature_returns_a_result_of_a_result() {
    let root = crate_dir();
    let mut nested = Vec::new();
    for file in non_test_sources() {
        let rel = file.strip_prefix(&root).unwrap().display().to_string();
        for (name, line) in measure(&file).nested_results {
            nested.push(format!("{rel}:{line}: {name}"));
        }
    }
    assert!(
        nested.is_empty(),
        "a Result of a Result (name the inner answer, e.g. envelope::Checked, or make it one error):\n  {}",
        nested.join("\n  ")
    );
}

/// The counting rules on a small file.
#[test]
fn tests_comments_and_blank_lines_do_not_count() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.rs");
    let long_body = "    let _ = 1;\n".repeat(5);
    std::fs::write(
        &file,
        format!(
            "//! A module.\n\n/// A function.\npub fn five() {{\n{long_body}}}\n\n\
             // a comment\n#[cfg(test)]\nmod tests {{\n    #[test]\n    fn t() {{}}\n}}\n\
             impl S {{\n    fn m(&self) {{\n        // inside\n    }}\n}}\npub struct S;\n"
        ),
    )
    .unwrap();
    let measured = measure(&file);
    // `pub fn five() {` + 5 + `}`, `impl S {`, `fn m…{`, `}`, `}`, `pub struct S;`
    assert_eq!(measured.code_lines, 12);
    assert_eq!(
        measured.functions,
        [("five".to_owned(), 4, 7), ("m".to_owned(), 19, 3)]
    );
    assert!(measured.nested_results.is_empty());
}

/// A `Result` of a `Result` is found however the outer one is spelled, in
/// free functions, methods and trait methods, but not in tests.
#[test]
fn a_result_of_a_result_is_found_in_any_spelling() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("x.rs");
    std::fs::write(
        &file,
        "fn a() -> Result<Result<u8, E>, F> { todo!() }
         fn b() -> rusqlite::Result<std::result::Result<u8, E>> { todo!() }
         fn c() -> Result<Option<u8>, E> { todo!() }
         impl S {
    fn d(&self) -> Result<Result<(), E>, E> { todo!() }
}
         trait T {
    fn e() -> io::Result<Result<(), E>>;
}
         #[cfg(test)]
mod tests {
    fn f() -> Result<Result<(), E>, E> { todo!() }
}
",
    )
    .unwrap();
    assert_eq!(
        measure(&file).nested_results,
        [
            ("a".to_owned(), 1),
            ("b".to_owned(), 2),
            ("d".to_owned(), 5),
            ("e".to_owned(), 8)
        ]
    );
}

struct Measured {
    code_lines: usize,
    /// Each function outside tests: name, first line, length in lines.
    functions: Vec<(String, usize, usize)>,
    /// Each signature outside tests returning a `Result` of a `Result`:
    /// name, line.
    nested_results: Vec<(String, usize)>,
}

/// The first type argument of `ty` when `ty` is a `Result` (any path
/// ending in `Result`: `io::Result`, `rusqlite::Result`, …).
fn result_ok_type(ty: &syn::Type) -> Option<&syn::Type> {
    let syn::Type::Path(p) = ty else {
        return None;
    };
    let last = p.path.segments.last()?;
    if last.ident != "Result" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    args.args.iter().find_map(|a| match a {
        syn::GenericArgument::Type(t) => Some(t),
        _ => None,
    })
}

fn measure(file: &Path) -> Measured {
    let text = std::fs::read_to_string(file).unwrap();
    let parsed = syn::parse_file(&text)
        .unwrap_or_else(|e| panic!("{}: does not parse: {e}", file.display()));
    let mut walker = Walker::default();
    walker.visit_file(&parsed);
    let mut test_lines = vec![false; text.lines().count() + 2];
    for (start, end) in &walker.test_spans {
        for line in *start..=*end {
            if let Some(slot) = test_lines.get_mut(line) {
                *slot = true;
            }
        }
    }
    let code_lines = text
        .lines()
        .enumerate()
        .filter(|(i, line)| {
            let t = line.trim();
            !t.is_empty()
                && !t.starts_with("//")
                && !test_lines.get(i + 1).copied().unwrap_or(false)
        })
        .count();
    Measured {
        code_lines,
        functions: walker.functions,
        nested_results: walker.nested_results,
    }
}

#[derive(Default)]
struct Walker {
    test_spans: Vec<(usize, usize)>,
    functions: Vec<(String, usize, usize)>,
    nested_results: Vec<(String, usize)>,
}

impl Walker {
    /// Leaves out code under `#[cfg(test)]`; `true` when it was left out.
    fn test_only(&mut self, attrs: &[Attribute], span: proc_macro2::Span) -> bool {
        if cfg_gate(attrs) == Gate::TestOnly {
            self.test_spans.push((span.start().line, span.end().line));
            return true;
        }
        false
    }

    fn function(
        &mut self,
        name: &syn::Ident,
        fn_token: proc_macro2::Span,
        close: proc_macro2::Span,
    ) {
        let start = fn_token.start().line;
        self.functions
            .push((name.to_string(), start, close.end().line - start + 1));
    }
}

impl<'ast> Visit<'ast> for Walker {
    fn visit_signature(&mut self, sig: &'ast syn::Signature) {
        if let syn::ReturnType::Type(_, ty) = &sig.output
            && result_ok_type(ty).and_then(result_ok_type).is_some()
        {
            self.nested_results
                .push((sig.ident.to_string(), sig.fn_token.span.start().line));
        }
        visit::visit_signature(self, sig);
    }

    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[Attribute] = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Macro(m) => &m.attrs,
            syn::Item::Type(t) => &t.attrs,
            _ => &[],
        };
        if !self.test_only(attrs, item.span()) {
            visit::visit_item(self, item);
        }
    }

    fn visit_item_fn(&mut self, f: &'ast ItemFn) {
        self.function(
            &f.sig.ident,
            f.sig.fn_token.span,
            f.block.brace_token.span.close(),
        );
        visit::visit_item_fn(self, f);
    }

    fn visit_impl_item_fn(&mut self, f: &'ast ImplItemFn) {
        if self.test_only(&f.attrs, f.span()) {
            return;
        }
        self.function(
            &f.sig.ident,
            f.sig.fn_token.span,
            f.block.brace_token.span.close(),
        );
        visit::visit_impl_item_fn(self, f);
    }

    fn visit_trait_item_fn(&mut self, f: &'ast TraitItemFn) {
        if let Some(block) = &f.default {
            self.function(
                &f.sig.ident,
                f.sig.fn_token.span,
                block.brace_token.span.close(),
            );
        }
        visit::visit_trait_item_fn(self, f);
    }
}

fn limit_of(exceptions: &[(&str, usize, &str)], key: &str, default: usize) -> usize {
    exceptions
        .iter()
        .find(|(name, _, _)| *name == key)
        .map_or(default, |(_, limit, _)| *limit)
}
