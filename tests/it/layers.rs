//! The layers of docs/ARCHITECTURE.md hold in the code: every `crate::` path in a source
//! file of `src/` names a layer that the table's "may use" column allows for the file's own
//! layer (directly or through a layer it may use), and the table itself is checked to forbid
//! what the architecture rules out (no layer reaches back up).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The layers of the table in docs/ARCHITECTURE.md, bottom up, each with the layers it may
/// use (transitively closed).
struct Layers {
    order: Vec<String>,
    allowed: BTreeMap<String, BTreeSet<String>>,
}

impl Layers {
    fn may_use(&self, from: &str, to: &str) -> bool {
        from == to || self.allowed.get(from).is_some_and(|a| a.contains(to))
    }
}

/// Names between backticks in a table cell, without `src/` and trailing `/` or `.rs`.
fn layer_name(cell: &str) -> Option<String> {
    let inner = cell.trim().strip_prefix('`')?.strip_suffix('`')?;
    let inner = inner.strip_prefix("src/")?;
    Some(inner.trim_end_matches('/').trim_end_matches(".rs").to_string())
}

/// Parses the "folder | owns | may use" table. `everything below` means every row above it
/// in the table; `the library` means every layer; `nothing` means none; otherwise the
/// backticked layer names of the cell.
fn parse_table(doc: &str) -> Layers {
    let mut order: Vec<String> = Vec::new();
    let mut direct: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut library = Vec::new();
    for line in doc.lines().filter(|l| l.starts_with("| `src/")) {
        let cells: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
        assert!(cells.len() >= 3, "docs/ARCHITECTURE.md: a layer row without 3 columns: {line}");
        let name = layer_name(cells[0]).unwrap_or_else(|| panic!("bad folder cell in: {line}"));
        let may = cells[cells.len() - 1].trim();
        let mut uses = BTreeSet::new();
        if may.starts_with("everything below") {
            uses.extend(order.iter().cloned());
        } else if may == "the library" {
            library.push(name.clone());
        } else if may != "nothing" {
            for used in may.split('`').skip(1).step_by(2) {
                uses.insert(used.to_string());
            }
            assert!(!uses.is_empty(), "docs/ARCHITECTURE.md: cannot read the \"may use\" of {name}: {may}");
        }
        order.push(name.clone());
        direct.insert(name, uses);
    }
    for name in library {
        let all = order.iter().filter(|l| **l != name).cloned().collect();
        direct.insert(name, all);
    }
    for (from, uses) in &direct {
        for u in uses {
            assert!(direct.contains_key(u), "docs/ARCHITECTURE.md: {from} may use `{u}`, which is no layer");
        }
    }
    // Transitive closure: what a layer may use, it may use through.
    let mut allowed = direct.clone();
    loop {
        let mut changed = false;
        for name in &order {
            let mut add = BTreeSet::new();
            for u in &allowed[name] {
                add.extend(allowed[u].iter().filter(|x| *x != name).cloned());
            }
            let a = allowed.get_mut(name).unwrap();
            let before = a.len();
            a.extend(add);
            changed |= a.len() != before;
        }
        if !changed {
            break;
        }
    }
    Layers { order, allowed }
}

/// The top-level modules that a source text names through `crate::`, with the line of
/// each (comments skipped). `use crate::{a, b::c}` names `a` and `b`.
fn crate_refs(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = line.trim_start();
        if code.starts_with("//") {
            continue;
        }
        let code = match code.find(" // ") {
            Some(c) => &code[..c],
            None => code,
        };
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + "crate::".len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // e.g. `mycrate::`; `$crate::` (a macro's) counts
            }
            if let Some(group) = rest.strip_prefix('{') {
                let mut depth = 0;
                let mut item = String::new();
                let mut items = Vec::new();
                for c in group.chars() {
                    match c {
                        '{' => depth += 1,
                        '}' if depth == 0 => break,
                        '}' => depth -= 1,
                        ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                        _ => item.push(c),
                    }
                }
                items.push(item);
                for it in items {
                    let name: String =
                        it.trim().chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                    if !name.is_empty() {
                        out.push((i + 1, name));
                    }
                }
            } else {
                let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    out.push((i + 1, name));
                }
            }
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

fn layers() -> Layers {
    parse_table(&std::fs::read_to_string(root().join("docs/ARCHITECTURE.md")).unwrap())
}

#[test]
fn no_module_imports_a_layer_the_table_forbids() {
    let layers = layers();
    let src = root().join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut bad = Vec::new();
    let mut checked = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
        let layer = first.trim_end_matches(".rs").to_string();
        if layer == "lib" || layer == "main" {
            continue; // the crate root declares the layers; main is the command line
        }
        assert!(
            layers.allowed.contains_key(&layer),
            "src/{} belongs to layer `{layer}`, which has no row in the table of docs/ARCHITECTURE.md",
            rel.display()
        );
        let text = std::fs::read_to_string(f).unwrap();
        for (line, used) in crate_refs(&text) {
            checked += 1;
            if !layers.allowed.contains_key(&used) {
                bad.push(format!("src/{}:{line}: crate::{used} is no layer of the table", rel.display()));
            } else if !layers.may_use(&layer, &used) {
                bad.push(format!(
                    "src/{}:{line}: layer `{layer}` uses crate::{used}; the table allows {:?}",
                    rel.display(),
                    layers.allowed[&layer]
                ));
            }
        }
    }
    assert!(checked > 100, "only {checked} crate:: paths found; is the scan broken?");
    assert!(bad.is_empty(), "imports that docs/ARCHITECTURE.md forbids:\n{}", bad.join("\n"));
}

#[test]
fn the_table_forbids_reaching_back_up() {
    let l = layers();
    for name in [
        "units",
        "fabric",
        "engine",
        "schedule",
        "collective",
        "exec",
        "scenario",
        "calibrate",
        "report",
        "cli",
    ] {
        assert!(l.order.contains(&name.to_string()), "no row for src/{name} in the table");
    }
    // Each layer may use only layers above it in the table (rows go bottom up).
    for (i, name) in l.order.iter().enumerate() {
        for used in &l.allowed[name] {
            let j = l.order.iter().position(|x| x == used).unwrap();
            assert!(j < i || name == "cli", "{name} may use {used}, which comes after it in the table");
        }
    }
    let forbidden = [
        ("units", "fabric"),
        ("engine", "collective"),
        ("engine", "schedule"),
        ("schedule", "fabric"),
        ("fabric", "collective"),
        ("collective", "exec"),
        ("scenario", "calibrate"),
        ("scenario", "report"),
        ("calibrate", "report"),
    ];
    for (from, to) in forbidden {
        assert!(!l.may_use(from, to), "the table lets {from} use {to}");
    }
    assert!(l.may_use("exec", "units"), "through fabric");
    assert!(l.may_use("calibrate", "collective"), "through scenario");
}

#[test]
fn crate_paths_are_read_from_use_lines_groups_and_expressions() {
    let text = "//! crate::report in a doc comment\nuse crate::{fabric::Fabric, units};\n\
                use crate::scenario::bench::{a, b};\nlet x = crate::exec::run(); // crate::cli\n\
                macro_rules! m { () => { $crate::engine } }\n";
    let got: Vec<(usize, String)> = crate_refs(text);
    let want: Vec<(usize, String)> = vec![
        (2, "fabric".into()),
        (2, "units".into()),
        (3, "scenario".into()),
        (4, "exec".into()),
        (5, "engine".into()),
    ];
    assert_eq!(got, want);
    let t = parse_table(
        "| `src/a.rs` | x | nothing |\n| `src/b/` | y | `a` |\n| `src/c/` | z | everything below |\n\
         | `src/d/` | w | the library |\n",
    );
    assert!(t.may_use("b", "a") && t.may_use("c", "b") && t.may_use("c", "a") && t.may_use("d", "c"));
    assert!(!t.may_use("a", "b") && !t.may_use("b", "c"));
}
