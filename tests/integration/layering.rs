//! The layering ARCHITECTURE.md declares ("Architecture invariants"), checked on the source
//! text of `src/`: the pure cores import no driver module and no crate that does I/O, the
//! top-level modules import one another without cycles, and no two files import each other.
//!
//! Every path a file names is read: `use` trees (groups expanded) and paths in code, with
//! `super::` and `self::` resolved against the file's module. Test code (`tests.rs`, modules
//! under `#[cfg(test)]`) is left out of the module checks: it may use anything. The file check
//! reads every file, test code included: two files that import each other are one module split
//! in two, whatever they are for.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The pure cores: they decide, and are handed every fact and `now`.
const CORES: [&str; 2] = ["proof", "agent::core"];

/// Modules that do I/O, read the clock or run the loop, which no core may import. A path is
/// matched by its leading segments; the items a module's root re-exports from a driver are
/// listed by name (`cgroup::CgroupWatcher` is `cgroup::watcher`'s).
const DRIVERS: [&str; 24] = [
    "activation",
    "atomic_file",
    "bench",
    "cgroup::CgroupWatcher",
    "cgroup::Notice",
    "cgroup::cgroup2_mount",
    "cgroup::mount",
    "cgroup::procs::ProcessTracker",
    "cgroup::procs::list_processes",
    "cgroup::procs::tracker",
    "cgroup::read_events_file",
    "cgroup::watcher",
    "cli",
    "clock",
    "control::client",
    "control::server",
    "journald",
    "service",
    "systemd::connect",
    "systemd::connect_async",
    "systemd::manager",
    "systemd::read",
    "systemd::runtime",
    "transient",
];

/// The parts of `agent` a core may import: the rest of it is the agent's driver (its loop, its
/// files, its bus).
const AGENT_NOT_DRIVER: [&str; 2] = ["agent::core", "agent::saved"];

/// Crates that do I/O, which no core may name.
const IO_CRATES: [&str; 5] = ["mio", "zbus", "inotify", "nix", "libc"];

/// Cycles between top-level modules that are allowed: none.
const ALLOWED_CYCLES: [&[&str]; 0] = [];

/// One file of the library: its module path and its code (comments and test code left out).
struct Source {
    path: PathBuf,
    module: Vec<String>,
    code: String,
}

/// A path named in a file: absolute (`a::b`, without `crate::`) when it is the crate's, and
/// the line it is on.
struct Named {
    line: usize,
    path: Vec<String>,
    ours: bool,
}

#[test]
fn the_cores_import_no_driver_and_no_io_crate() {
    let mut offences = Vec::new();
    for source in library() {
        let module = source.module.join("::");
        if !CORES
            .iter()
            .any(|core| module == *core || module.starts_with(&format!("{core}::")))
        {
            continue;
        }
        for named in names(&source) {
            if let Some(why) = forbidden(&named) {
                offences.push(format!(
                    "{}:{}: the core `{module}` imports `{}`: {why}",
                    source.path.display(),
                    named.line,
                    shown(&named),
                ));
            }
        }
    }
    assert!(
        offences.is_empty(),
        "a pure core reaches a driver (ARCHITECTURE.md, \"Architecture invariants\"):\n{}",
        offences.join("\n")
    );
}

#[test]
fn the_top_level_modules_import_one_another_without_cycles() {
    let graph = top_level_graph();
    let mut cycles = Vec::new();
    for start in graph.keys() {
        find_cycles(&graph, &mut vec![start.clone()], &mut cycles);
    }
    let allowed: BTreeSet<Vec<String>> = ALLOWED_CYCLES
        .iter()
        .map(|cycle| cycle.iter().map(|m| (*m).to_owned()).collect())
        .collect();
    let shown: Vec<String> = cycles
        .iter()
        .filter(|cycle| {
            !allowed.contains(&cycle.iter().map(|(m, _)| m.clone()).collect::<Vec<_>>())
        })
        .map(|cycle| {
            let steps: Vec<String> = cycle
                .iter()
                .enumerate()
                .map(|(i, (module, place))| {
                    let next = &cycle[(i + 1) % cycle.len()].0;
                    format!("  {module} -> {next} ({place})")
                })
                .collect();
            steps.join("\n")
        })
        .collect();
    assert!(
        shown.is_empty(),
        "top-level modules import one another in a cycle:\n{}",
        shown.join("\n\n")
    );
}

/// The proof is the innermost core: it decides from what it is handed and imports nothing of
/// the crate outside itself (not even systemd's pure decoders), so no change there reaches it.
#[test]
fn the_proof_imports_nothing_outside_itself() {
    let graph = top_level_graph();
    let edges = graph.get("proof").cloned().unwrap_or_default();
    assert!(
        edges.is_empty(),
        "proof imports other modules of the crate: {edges:?}"
    );
}

/// The check reads what it should: known imports are found, so a parser that finds nothing
/// cannot pass the checks above.
#[test]
fn the_check_sees_the_imports_that_are_there() {
    let graph = top_level_graph();
    for (from, to) in [
        ("agent", "proof"),
        ("agent", "systemd"),
        ("control", "record_name"),
    ] {
        assert!(
            graph.get(from).is_some_and(|edges| edges.contains_key(to)),
            "{from} -> {to} not seen"
        );
    }
    let core = library()
        .into_iter()
        .find(|source| source.module == ["agent", "core"])
        .expect("agent/core/mod.rs");
    let named: Vec<String> = names(&core).iter().map(shown).collect();
    for expected in [
        "systemd::snapshot::UnitSnapshot",
        "agent::saved::AgentState",
    ] {
        assert!(
            named.iter().any(|n| n == expected),
            "{expected} in {named:?}"
        );
    }
}

/// No two files of `src/` import each other: of two files that need each other, neither can
/// be read, tested or changed alone. A file imports another when it names a path into the
/// module that file is (`use crate::a::b`, `use super::x`, `super::x::f()`, a child `x::f()`).
/// A module and the file of a child it declares are one module tree, whose child sees the
/// parent's private items by design: they may.
#[test]
fn no_two_source_files_import_each_other() {
    let imports = file_imports();
    let mut pairs = Vec::new();
    for (from, tos) in &imports {
        for (to, place) in tos {
            let back = imports.get(to).and_then(|edges| edges.get(from));
            if let Some(back) = back
                && from < to
                && !parent_and_child(from, to)
            {
                pairs.push(format!(
                    "  {} <-> {} ({place}; {back})",
                    from.display(),
                    to.display()
                ));
            }
        }
    }
    assert!(
        pairs.is_empty(),
        "files import each other (move what both need into the lower one):\n{}",
        pairs.join("\n")
    );
}

/// The file check reads what it should: a child named without `crate::`, `super::` in a file of
/// tests, and `super::*` in an inline test module (the file's own module, not its parent).
#[test]
fn the_file_check_sees_the_imports_that_are_there() {
    let imports = file_imports();
    let edge = |from: &str, to: &str| {
        imports
            .get(Path::new(from))
            .is_some_and(|edges| edges.contains_key(Path::new(to)))
    };
    for (from, to) in [
        ("src/agent/sim/mod.rs", "src/agent/sim/harness.rs"),
        ("src/agent/sim/world_tests.rs", "src/agent/sim/bus.rs"),
        ("src/agent/mod.rs", "src/agent/core/mod.rs"),
    ] {
        assert!(edge(from, to), "{from} -> {to} not seen");
    }
    assert!(
        !edge("src/agent/sim/kernel.rs", "src/agent/sim/mod.rs"),
        "the inline test module's `super::*` is kernel.rs itself"
    );
}

/// Whether one of two files is a module and the other a child module it declares.
fn parent_and_child(a: &Path, b: &Path) -> bool {
    let (a, b) = (crate_and_module(a), crate_and_module(b));
    let child_of = |child: &(String, Vec<String>), parent: &(String, Vec<String>)| {
        child.0 == parent.0 && child.1.len() == parent.1.len() + 1 && child.1.starts_with(&parent.1)
    };
    child_of(&a, &b) || child_of(&b, &a)
}

/// Which file of `src/` imports which, each edge with one place it is made (`file:line`).
fn file_imports() -> BTreeMap<PathBuf, BTreeMap<PathBuf, String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    every_rs_file(&root.join("src"), &mut files);
    // Each crate's modules that have a file: (crate, module path) -> file.
    let modules: BTreeMap<(String, Vec<String>), PathBuf> = files
        .iter()
        .map(|file| {
            let path = file.strip_prefix(root).unwrap_or(file).to_owned();
            (crate_and_module(&path), path)
        })
        .collect();
    let mut imports: BTreeMap<PathBuf, BTreeMap<PathBuf, String>> = BTreeMap::new();
    for ((krate, module), path) in &modules {
        let text = fs::read_to_string(root.join(path))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let code = code_only(&text);
        let inline = inline_modules(&code);
        for (line, named) in paths_named(&code) {
            let mut within = module.clone();
            within.extend(inline[line - 1].iter().cloned());
            let Some(to) = file_named(&modules, krate, &within, &named) else {
                continue;
            };
            if to != path {
                let place = format!("{}:{line}", path.display());
                imports
                    .entry(path.clone())
                    .or_default()
                    .entry(to.clone())
                    .or_insert(place);
            }
        }
    }
    imports
}

fn every_rs_file(dir: &Path, files: &mut Vec<PathBuf>) {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            every_rs_file(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// The crate a file of `src/` belongs to (`lib`, `main`, or `bin/NAME`), and its module there.
fn crate_and_module(path: &Path) -> (String, Vec<String>) {
    let parts: Vec<String> = path
        .with_extension("")
        .iter()
        .skip(1)
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    match parts.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["main"] => ("main".to_owned(), Vec::new()),
        ["bin", name, ..] => (format!("bin/{name}"), Vec::new()),
        _ => {
            let mut module = parts;
            if module
                .last()
                .is_some_and(|last| last == "mod" || last == "lib")
            {
                module.pop();
            }
            ("lib".to_owned(), module)
        }
    }
}

/// For each line of `code` (see [`code_only`]), the inline modules (`mod tests { … }`) it is in.
fn inline_modules(code: &str) -> Vec<Vec<String>> {
    let mut open: Vec<(String, usize)> = Vec::new();
    let mut depth = 0;
    let mut lines = Vec::new();
    for line in code.lines() {
        if let Some(name) = module_declared(line.trim())
            && line.contains('{')
        {
            open.push((name, depth + 1));
        }
        lines.push(open.iter().map(|(name, _)| name.clone()).collect());
        for c in line.chars() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
        }
        open.retain(|(_, body_depth)| *body_depth <= depth);
    }
    // A last line with no newline still has its entry; `lines()` gives one per line.
    lines.push(Vec::new());
    lines
}

/// The file a path names, as module `module` of crate `krate` means it: the file of the longest
/// leading part of it that is a module with a file. `None` for another crate's path.
fn file_named<'a>(
    modules: &'a BTreeMap<(String, Vec<String>), PathBuf>,
    krate: &str,
    module: &[String],
    named: &str,
) -> Option<&'a PathBuf> {
    let segments: Vec<String> = named.split("::").map(str::to_owned).collect();
    let (krate, absolute) = match resolve(module, named, 0) {
        Some(resolved) if resolved.ours => (krate, resolved.path),
        // The binaries name the library by its crate's name.
        _ if krate != "lib" && segments[0] == "exitproof" => ("lib", segments[1..].to_vec()),
        // A path that begins with a child module of this one (`use harness::Sim;`).
        _ => {
            let mut child = module.to_vec();
            child.push(segments[0].clone());
            if !modules.contains_key(&(krate.to_owned(), child)) {
                return None;
            }
            let mut absolute = module.to_vec();
            absolute.extend(segments);
            (krate, absolute)
        }
    };
    (0..=absolute.len())
        .rev()
        .find_map(|len| modules.get(&(krate.to_owned(), absolute[..len].to_vec())))
}

/// Why `named` is no core's to import, if it is not.
fn forbidden(named: &Named) -> Option<&'static str> {
    let path: Vec<&str> = named.path.iter().map(String::as_str).collect();
    if !named.ours {
        return IO_CRATES
            .contains(&path[0])
            .then_some("a crate that does I/O");
    }
    let starts = |prefix: &str| {
        let prefix: Vec<&str> = prefix.split("::").collect();
        path.len() >= prefix.len() && path[..prefix.len()] == prefix[..]
    };
    if path[0] == "agent" && !AGENT_NOT_DRIVER.iter().any(|part| starts(part)) {
        return Some("the agent's driver");
    }
    DRIVERS
        .iter()
        .any(|driver| starts(driver))
        .then_some("a driver module")
}

fn shown(named: &Named) -> String {
    named.path.join("::")
}

/// Which top-level module imports which, each edge with one place it is made.
fn top_level_graph() -> BTreeMap<String, BTreeMap<String, String>> {
    let mut graph: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for source in library() {
        let Some(from) = source.module.first() else {
            continue;
        };
        for named in names(&source) {
            let to = &named.path[0];
            if named.ours && to != from {
                let place = format!("{}:{}", source.path.display(), named.line);
                graph
                    .entry(from.clone())
                    .or_default()
                    .entry(to.clone())
                    .or_insert(place);
            }
        }
    }
    graph
}

/// Extends `path` along every edge; each cycle back to its start is put in `cycles` once
/// (started from its least module), as its modules and the place of each edge.
fn find_cycles(
    graph: &BTreeMap<String, BTreeMap<String, String>>,
    path: &mut Vec<String>,
    cycles: &mut Vec<Vec<(String, String)>>,
) {
    let last = path.last().expect("a path starts somewhere").clone();
    for next in graph.get(&last).into_iter().flat_map(BTreeMap::keys) {
        if *next == path[0] {
            let mut cycle: Vec<(String, String)> = Vec::new();
            for (i, module) in path.iter().enumerate() {
                let to = path.get(i + 1).unwrap_or(&path[0]);
                cycle.push((module.clone(), graph[module][to].clone()));
            }
            cycles.push(cycle);
        } else if *next > path[0] && !path.contains(next) {
            path.push(next.clone());
            find_cycles(graph, path, cycles);
            path.pop();
        }
    }
}

/// Every file of the library that is not test code.
fn library() -> Vec<Source> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut sources = Vec::new();
    visit(&src, &src.join("lib.rs"), Vec::new(), &mut sources);
    sources
}

/// Reads `file` (module `module`) and, through its `mod` declarations, its children.
fn visit(src: &Path, file: &Path, module: Vec<String>, sources: &mut Vec<Source>) {
    let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let code = code_only(&text);
    let (code, test_children) = without_test_code(&code);
    // `a.rs` and `a/mod.rs` keep their children in `a/`; `lib.rs` in `src/`.
    let dir = if file
        .file_name()
        .is_some_and(|n| n == "mod.rs" || n == "lib.rs")
    {
        file.parent().expect("in a directory").to_owned()
    } else {
        file.with_extension("")
    };
    for child in declared_modules(&code) {
        if test_children.contains(&child) {
            continue;
        }
        let child_file = [
            dir.join(format!("{child}.rs")),
            dir.join(&child).join("mod.rs"),
        ]
        .into_iter()
        .find(|path| path.exists())
        .unwrap_or_else(|| panic!("{}: no file for `mod {child}`", file.display()));
        let mut child_module = module.clone();
        child_module.push(child);
        visit(src, &child_file, child_module, sources);
    }
    let path = file
        .strip_prefix(src.parent().expect("src has a parent"))
        .unwrap_or(file);
    sources.push(Source {
        path: path.to_owned(),
        module,
        code,
    });
}

/// `text` with its comments, string literals and character literals blanked (newlines kept, so
/// line numbers still hold): what is left is code, whose braces balance and whose paths are
/// paths.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let end = literal_end(&chars, i);
        if end > i {
            out.extend(
                chars[i..end]
                    .iter()
                    .map(|c| if *c == '\n' { '\n' } else { ' ' }),
            );
            i = end;
        } else {
            out.push(chars[i]);
            i += 1;
        }
    }
    out
}

/// Where the comment or literal that begins at `i` ends (`i` itself if none begins there).
fn literal_end(chars: &[char], i: usize) -> usize {
    let at = |k: usize| chars.get(k).copied().unwrap_or('\0');
    let after = |from: usize, end: &[char]| {
        (from..chars.len())
            .find(|k| chars[*k..].starts_with(end))
            .map_or(chars.len(), |k| k + end.len())
    };
    // A raw string whose `#`s begin at `k`; a raw identifier (`r#type`) is none.
    let raw = |k: usize| {
        let hashes = chars[k..].iter().take_while(|c| **c == '#').count();
        if at(k + hashes) != '"' {
            return i;
        }
        let mut end = vec!['"'];
        end.extend(std::iter::repeat_n('#', hashes));
        after(k + hashes + 1, &end)
    };
    let word_start = i == 0 || !is_ident(chars[i - 1]);
    match (at(i), at(i + 1)) {
        ('/', '/') => (i..chars.len())
            .find(|k| chars[*k] == '\n')
            .unwrap_or(chars.len()),
        ('/', '*') => {
            let (mut depth, mut k) = (0, i);
            while k < chars.len() {
                if chars[k..].starts_with(&['/', '*']) {
                    depth += 1;
                    k += 2;
                } else if chars[k..].starts_with(&['*', '/']) {
                    depth -= 1;
                    k += 2;
                    if depth == 0 {
                        return k;
                    }
                } else {
                    k += 1;
                }
            }
            chars.len()
        }
        ('"', _) => {
            let mut k = i + 1;
            while k < chars.len() && chars[k] != '"' {
                k += if chars[k] == '\\' { 2 } else { 1 };
            }
            k + 1
        }
        ('r', '"' | '#') if word_start => raw(i + 1),
        ('b', 'r') if word_start && matches!(at(i + 2), '"' | '#') => raw(i + 2),
        ('\'', '\\') => after(i + 2, &['\'']),
        // A character literal, not a lifetime (`'a`).
        ('\'', _) if at(i + 2) == '\'' => i + 3,
        _ => i,
    }
}

/// `code` without its inline `#[cfg(test)] mod … { … }` (cut to the end: test modules come
/// last), and the names of the child modules declared under `#[cfg(test)]`.
fn without_test_code(code: &str) -> (String, BTreeSet<String>) {
    let lines: Vec<&str> = code.lines().collect();
    let mut test_children = BTreeSet::new();
    let mut kept = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim();
        if line.starts_with("#[cfg(test)]") || line.starts_with("#[cfg(any(test") {
            let next = lines.get(i + 1).map_or("", |l| l.trim());
            if let Some(name) = module_declared(next) {
                if next.ends_with(';') {
                    test_children.insert(name);
                    i += 2;
                    continue;
                }
                break;
            }
        }
        kept.push(lines[i]);
        i += 1;
    }
    (kept.join("\n"), test_children)
}

/// The child modules `code` declares in files of their own (`mod a;`).
fn declared_modules(code: &str) -> Vec<String> {
    code.lines()
        .map(str::trim)
        .filter(|line| line.ends_with(';'))
        .filter_map(module_declared)
        .collect()
}

/// The module a line declares (`mod a;`, `pub(crate) mod a {`), if it declares one.
fn module_declared(line: &str) -> Option<String> {
    let rest = line.strip_prefix("pub ").or_else(|| {
        line.strip_prefix("pub(")
            .and_then(|r| r.split_once(") ").map(|(_, r)| r))
    });
    let rest = rest.unwrap_or(line).strip_prefix("mod ")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// Every path `source` names, made absolute.
fn names(source: &Source) -> Vec<Named> {
    paths_named(&source.code)
        .into_iter()
        .filter_map(|(line, path)| resolve(&source.module, &path, line))
        .collect()
}

/// Every path `code` names, with its line: its `use` trees expanded, and the paths in its code.
fn paths_named(code: &str) -> Vec<(usize, String)> {
    let mut named = Vec::new();
    let mut rest_of_code = String::with_capacity(code.len());
    let mut at = 0;
    // `use` statements first, as their groups need expanding; the rest is scanned for paths.
    while let Some(found) = find_use(code, at) {
        rest_of_code.push_str(&code[at..found]);
        let end = code[found..].find(';').map_or(code.len(), |e| found + e);
        let line = code[..found].matches('\n').count() + 1;
        let tree: String = code[found + 4..end]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        named.extend(expand(&tree).into_iter().map(|path| (line, path)));
        // Keep the lines so later line numbers hold.
        rest_of_code.push_str(&"\n".repeat(code[found..end].matches('\n').count()));
        at = end;
    }
    rest_of_code.push_str(&code[at..]);
    for (i, line) in rest_of_code.lines().enumerate() {
        named.extend(paths_in(line).into_iter().map(|path| (i + 1, path)));
    }
    named
}

/// Where the next `use` statement at or after `from` begins (its `use`).
fn find_use(code: &str, from: usize) -> Option<usize> {
    let mut search = from;
    while let Some(i) = code[search..].find("use ") {
        let at = search + i;
        let before = code[..at].trim_end_matches(' ');
        let starts_statement = before.is_empty()
            || before.ends_with('\n')
            || before.ends_with(';')
            || before.ends_with('{')
            || before.ends_with('}')
            || before.ends_with("pub")
            || before.ends_with(')');
        let word_start = at == 0 || !is_ident(code[..at].chars().next_back().unwrap_or(' '));
        if starts_statement && word_start {
            return Some(at);
        }
        search = at + 4;
    }
    None
}

/// The paths of a `use` tree (whitespace removed): `a::{b, c::{d, e}}` is `a::b`, `a::c::d`,
/// `a::c::e`; `as` renames are dropped.
fn expand(tree: &str) -> Vec<String> {
    let Some(open) = tree.find('{') else {
        let path = tree.split("as").next().unwrap_or(tree);
        return vec![path.trim_end_matches("::").to_owned()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|part| !part.is_empty())
        .flat_map(expand)
        .map(|path| match path.as_str() {
            "self" => prefix.trim_end_matches("::").to_owned(),
            _ => format!("{prefix}{path}"),
        })
        .collect()
}

/// The paths (`a::b…`, two segments at least) that start in `line`.
fn paths_in(line: &str) -> Vec<String> {
    let chars: Vec<char> = line.chars().collect();
    let mut paths = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        // A path begins at an identifier that does not continue a word or another path.
        let continues = i > 0 && is_ident(chars[i - 1]) || i >= 2 && chars[i - 2..i] == [':', ':'];
        let begins = is_ident(chars[i]) && !chars[i].is_ascii_digit() && !continues;
        if !begins {
            i += 1;
            continue;
        }
        let start = i;
        let mut segments = 0;
        loop {
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            segments += 1;
            if i + 2 < chars.len()
                && chars[i] == ':'
                && chars[i + 1] == ':'
                && is_ident(chars[i + 2])
            {
                i += 2;
            } else {
                break;
            }
        }
        if segments >= 2 {
            paths.push(chars[start..i].iter().collect());
        }
    }
    paths
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `path` as `module`'s code means it: the crate's own paths made absolute.
fn resolve(module: &[String], path: &str, line: usize) -> Option<Named> {
    let mut segments: Vec<String> = path.split("::").map(str::to_owned).collect();
    let ours = match segments[0].as_str() {
        "crate" => {
            segments.remove(0);
            true
        }
        "super" | "self" => {
            let mut base = module.to_vec();
            while segments.first().is_some_and(|s| s == "super") {
                base.pop();
                segments.remove(0);
            }
            if segments.first().is_some_and(|s| s == "self") {
                segments.remove(0);
            }
            base.extend(segments);
            segments = base;
            true
        }
        _ => false,
    };
    (!segments.is_empty() && segments[0] != "*").then_some(Named {
        line,
        path: segments,
        ours,
    })
}
