//! The documentation, checked against the tree. README.md and `docs/*.md` are read from the
//! source tree when the tests run:
//!
//! - docs/config.md's default file is what `remora config default` prints ([`DEFAULT_TOML`]);
//! - every count of a ratchet file's names that the docs state ([`COUNTED`]) is that file's
//!   count, read as the scripts read it;
//! - every `src/…`, `crates/…`, `integration/…`, `scripts/…` and `protos/…` path the docs name
//!   exists, and so does every relative link's target and heading;
//! - the README's code map names every top-level module of `src/` and every crate of
//!   `crates/`, and the README links every page of `docs/`.
//!
//! Text checks: they keep the prose from drifting from the tree, no more. A count or a path the
//! docs state in a way these do not recognise is not checked, so state them as these expect.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use crate::config::DEFAULT_TOML;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The file at `rel` (a path relative to the repository), as text.
fn read(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The names in directory `rel` of the repository, sorted.
fn entries(rel: &str) -> Vec<String> {
    let dir = repo().join(rel);
    let read = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut names: Vec<String> = read
        .map(|entry| {
            let entry = entry.expect("a readable directory entry");
            entry.file_name().to_string_lossy().into_owned()
        })
        .collect();
    names.sort();
    names
}

/// README.md and every page of docs/, each with its path relative to the repository.
fn pages() -> Vec<(String, String)> {
    let mut names = vec!["README.md".to_string()];
    names.extend(
        entries("docs")
            .into_iter()
            .filter(|n| n.ends_with(".md"))
            .map(|n| format!("docs/{n}")),
    );
    names
        .into_iter()
        .map(|n| {
            let text = read(&n);
            (n, text)
        })
        .collect()
}

// The configuration reference.

/// The page holding the configuration reference, and the heading of its default file.
const CONFIG_PAGE: &str = "docs/config.md";
const CONFIG_HEADING: &str = "The default file";

/// The ```toml block under the `## {heading}` line of `page` (before the next `## ` heading),
/// without its fences.
fn toml_block_under<'a>(page: &'a str, heading: &str) -> Option<&'a str> {
    let section = page.split(&format!("\n## {heading}\n")).nth(1)?;
    let section = section.split("\n## ").next()?;
    let body = section.split_once("```toml\n")?.1;
    Some(body.split_once("```")?.0)
}

#[test]
fn config_page_is_the_default_file() {
    let page = read(CONFIG_PAGE);
    let block = toml_block_under(&page, CONFIG_HEADING).unwrap_or_else(|| {
        panic!("{CONFIG_PAGE} has no ```toml block under \"## {CONFIG_HEADING}\"")
    });
    assert!(
        block == DEFAULT_TOML,
        "{CONFIG_PAGE}'s default file differs from `remora config default`; paste the output \
         of `remora config default` into it.\n--- {CONFIG_PAGE}\n{block}\n--- DEFAULT_TOML\n{DEFAULT_TOML}"
    );
}

#[test]
fn toml_block_is_found_only_under_its_heading() {
    let page = "# r\n```toml\nwrong = 1\n```\n## Reference\n\ntext\n\n```toml\na = 1\n```\n## Next\n```toml\nb = 2\n```\n";
    assert_eq!(toml_block_under(page, "Reference"), Some("a = 1\n"));
    let without = "# r\n## Reference\ntext\n## Next\n```toml\nb = 2\n```\n";
    assert_eq!(toml_block_under(without, "Reference"), None);
}

// The ratchet counts.

/// The names a ratchet file lists, read as `check_ratchet` (scripts/common.sh) and `listed`
/// (scripts/node-e2e.sh) read them: each line trimmed, blank lines and whole-line `#` comments
/// dropped (a name may contain `#`).
fn listed(text: &str) -> Vec<&str> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

const CRITEST: &str = "integration/critest-expected-pass.txt";
const CRITEST_WS: &str = "integration/critest-expected-pass-websocket.txt";
const CRITEST_NODE: &str = "integration/critest-node-expected-pass.txt";
const NODE_E2E: &str = "integration/node-e2e-expected-pass.txt";
const NODE_E2E_QUICK: &str = "integration/node-e2e-quick.txt";
const CONFORMANCE: &str = "integration/conformance-expected-pass.txt";

/// The counts the docs state: `(name, file, only)` is the number of names `file` lists, or of
/// those containing `only`; `{name}` stands for it in [`COUNTED`].
const RATCHETS: &[(&str, &str, Option<&str>)] = &[
    ("critest", CRITEST, None),
    ("critest_nri", CRITEST, Some("[k8s.io] NRI ")),
    ("critest_ws", CRITEST_WS, None),
    ("critest_node", CRITEST_NODE, None),
    ("critest_node_apparmor", CRITEST_NODE, Some("AppArmor")),
    ("critest_node_oom", CRITEST_NODE, Some("OOM")),
    ("critest_node_stats", CRITEST_NODE, Some("stats")),
    ("node_e2e", NODE_E2E, None),
    ("node_e2e_quick", NODE_E2E_QUICK, None),
    ("conformance", CONFORMANCE, None),
];

/// Where the docs state a ratchet's count: a file and a passage of it, `{name}` standing for
/// the count of that name in [`RATCHETS`]. Compared with every run of whitespace (line breaks
/// included) as one space. A passage reworded is reworded here too; a count added to the docs
/// is added here.
const COUNTED: &[(&str, &str)] = &[
    (
        "README.md",
        "| critest v1.37.0 | {critest} listed specs must pass (the ratchet), the {critest_ws} \
         streaming ones over WebSocket too |",
    ),
    (
        "README.md",
        "| {node_e2e} of 430 pass, the same {node_e2e} as containerd's CRI on the test bed (the \
         ratchet); {node_e2e_quick} of them in the test command |",
    ),
    ("README.md", "critest's {critest_nri} NRI specs pass"),
    ("docs/status.md", "critest's {critest_nri} NRI specs pass"),
    (
        "docs/status.md",
        "remora passes the same {node_e2e} tests as containerd's CRI",
    ),
    (
        "docs/status.md",
        "The test command runs {node_e2e_quick} of them (`integration/node-e2e-quick.txt`)",
    ),
    (
        "docs/status.md",
        "(../integration/critest-expected-pass.txt) ({critest} specs)",
    ),
    (
        "docs/status.md",
        "(../integration/critest-expected-pass-websocket.txt) ({critest_ws} specs)",
    ),
    (
        "docs/status.md",
        "(../integration/critest-node-expected-pass.txt) ({critest_node} specs: AppArmor, OOM \
         and stats)",
    ),
    ("docs/status.md", "the ratchet has grown to {critest} specs"),
    (
        "docs/conformance.md",
        "ratchet `integration/node-e2e-expected-pass.txt` lists those {node_e2e}.",
    ),
    (
        "docs/conformance.md",
        "remora with the Go shim: {node_e2e_quick} of the {node_e2e}, the ones",
    ),
    ("docs/nri.md", "critest's {critest_nri} NRI specs"),
    (
        "docs/conformance.md",
        "The ratchet `integration/conformance-expected-pass.txt` lists the {conformance} tests",
    ),
    (
        "README.md",
        "Kubernetes' `[Conformance]` suite: remora passes the {conformance} tests containerd's CRI \
         passes on the same one-node cluster (the ratchet)",
    ),
    (
        "docs/operating.md",
        "AppArmor ({critest_node_apparmor}), OOM ({critest_node_oom}) and stats \
         ({critest_node_stats}) specs, `integration/critest-node-expected-pass.txt`",
    ),
    (
        NODE_E2E_QUICK,
        "{node_e2e_quick} of {node_e2e}, about 4 minutes",
    ),
];

/// `text` with every run of whitespace as one space.
fn squash(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `passage` with each `{name}` replaced by its count; `None` when it names an unknown count.
fn fill(passage: &str, counts: &BTreeMap<&str, usize>) -> Option<String> {
    let mut out = String::new();
    let mut rest = passage;
    while let Some((before, after)) = rest.split_once('{') {
        let (name, after) = after.split_once('}')?;
        out.push_str(before);
        out.push_str(&counts.get(name)?.to_string());
        rest = after;
    }
    out.push_str(rest);
    Some(out)
}

/// Each ratchet's count by name.
fn ratchet_counts() -> BTreeMap<&'static str, usize> {
    RATCHETS
        .iter()
        .map(|&(name, file, only)| {
            let text = read(file);
            let count = listed(&text)
                .iter()
                .filter(|n| only.is_none_or(|o| n.contains(o)))
                .count();
            (name, count)
        })
        .collect()
}

#[test]
fn listed_reads_a_ratchet_as_the_scripts_do() {
    let text = "# a comment\n\n  one spec  \n\t\n#another\ntwo # not a comment\n   # indented\n";
    assert_eq!(listed(text), ["one spec", "two # not a comment"]);
}

#[test]
fn fill_puts_each_count_in_its_place() {
    let counts = BTreeMap::from([("a", 3), ("b", 40)]);
    assert_eq!(
        fill("{a} of {b}, the {a}", &counts).as_deref(),
        Some("3 of 40, the 3")
    );
    assert_eq!(fill("{c} of them", &counts), None);
}

#[test]
fn every_ratchet_names_each_test_once() {
    for file in [CRITEST, CRITEST_WS, CRITEST_NODE, NODE_E2E, NODE_E2E_QUICK] {
        let text = read(file);
        let names = listed(&text);
        let distinct: BTreeSet<&str> = names.iter().copied().collect();
        assert_eq!(distinct.len(), names.len(), "{file} lists a name twice");
        assert!(!names.is_empty(), "{file} lists nothing");
    }
    // The docs count the quick part as "N of" the whole ratchet.
    let (quick, whole) = (read(NODE_E2E_QUICK), read(NODE_E2E));
    let whole: BTreeSet<&str> = listed(&whole).into_iter().collect();
    let outside: Vec<&str> = listed(&quick)
        .into_iter()
        .filter(|n| !whole.contains(n))
        .collect();
    assert!(
        outside.is_empty(),
        "{NODE_E2E_QUICK} names tests {NODE_E2E} does not: {outside:#?}"
    );
}

#[test]
fn counts_in_the_docs_are_the_ratchets() {
    let counts = ratchet_counts();
    let mut wrong = Vec::new();
    for (file, passage) in COUNTED {
        let expected = fill(passage, &counts)
            .unwrap_or_else(|| panic!("{passage:?} names a count RATCHETS has not"));
        let text = squash(&read(file));
        if !text.contains(&squash(&expected)) {
            wrong.push(format!("{file}: not found: {expected:?}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "counts of the ratchet files in the docs differ from the files ({counts:?}): fix \
         the docs (or COUNTED, where a passage was reworded):\n{}",
        wrong.join("\n")
    );
}

// Paths.

/// The top-level directories of the repository whose paths the docs' text is searched for.
const ROOTS: &[&str] = &["src/", "crates/", "integration/", "scripts/", "protos/"];

/// Whether `c` can be part of a path word.
fn in_path(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-')
}

/// `word` with its first `{a,b,…}` group (and so each later one) expanded: one word per
/// alternative.
fn expand_braces(word: &str) -> Vec<String> {
    let Some((head, rest)) = word.split_once('{') else {
        return vec![word.to_string()];
    };
    let Some((group, tail)) = rest.split_once('}') else {
        return vec![word.to_string()];
    };
    group
        .split(',')
        .flat_map(|alt| expand_braces(&format!("{head}{alt}{tail}")))
        .collect()
}

/// The repository paths `text` names: words starting with one of [`ROOTS`] that no path
/// character precedes (not `/usr/src/x`, not `k8s.io/…/src/`), up to the first character that
/// cannot be in a path, `{a,b}` groups expanded and a trailing `.` dropped. A word with a `*` is
/// a pattern, not a path, and is left out.
fn repo_paths(text: &str) -> Vec<String> {
    let mut paths = Vec::new();
    for (at, _) in text.char_indices() {
        let rest = &text[at..];
        if !ROOTS.iter().any(|r| rest.starts_with(r)) {
            continue;
        }
        if text[..at].chars().next_back().is_some_and(in_path) {
            continue;
        }
        let mut depth = 0;
        let mut end = rest.len();
        for (i, c) in rest.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth > 0 => depth -= 1,
                ',' if depth > 0 => {}
                '*' => {}
                c if in_path(c) => {}
                _ => {
                    end = i;
                    break;
                }
            }
        }
        let word = rest[..end].trim_end_matches('.');
        if !word.contains('*') {
            paths.extend(expand_braces(word));
        }
    }
    paths
}

/// The anchors of `page`'s headings as GitHub makes them: lower case, spaces as `-`, every
/// character but letters, digits, `-` and `_` dropped, `-1`, `-2`… after a repeat. Headings in
/// fenced blocks are not headings.
fn anchors(page: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in page.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        let Some(heading) = line.trim_start_matches('#').strip_prefix(' ') else {
            continue;
        };
        if !line.starts_with('#') {
            continue;
        }
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let n = seen.entry(slug.clone()).or_default();
        out.insert(if *n == 0 { slug } else { format!("{slug}-{n}") });
        *n += 1;
    }
    out
}

/// The targets of `text`'s relative markdown links (`](target)`), each split into a path and
/// an anchor (either may be empty).
fn relative_links(text: &str) -> Vec<(&str, &str)> {
    text.split("](")
        .skip(1)
        .filter_map(|after| after.split_once(')'))
        .map(|(target, _)| target)
        .filter(|t| !t.contains("://") && !t.starts_with("mailto:") && !t.contains(' '))
        .map(|t| t.split_once('#').unwrap_or((t, "")))
        .collect()
}

/// `rel` (relative to `page`'s directory) as a path relative to the repository, `..` resolved;
/// `None` when it leaves the repository.
fn resolve(page: &str, rel: &str) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    let base = Path::new(page).parent().unwrap_or(Path::new(""));
    for part in base.join(rel).components() {
        match part {
            Component::Normal(p) => out.push(p),
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(out)
}

#[test]
fn repo_paths_finds_the_paths_as_written() {
    let text = "See `src/cri/service/`, src/lib.rs. Not /usr/src/x nor k8s.io/a/src/b; \
                crates/x/{a,b}.rs (integration/*.txt) scripts/test.sh: and `src/io/{fifo,cri_log}.rs`";
    assert_eq!(
        repo_paths(text),
        [
            "src/cri/service/",
            "src/lib.rs",
            "crates/x/a.rs",
            "crates/x/b.rs",
            "scripts/test.sh",
            "src/io/fifo.rs",
            "src/io/cri_log.rs",
        ]
    );
}

#[test]
fn anchors_and_links_are_read_as_github_renders_them() {
    let page = "# remora — design\n## The CRI RPCs and where they live\n```\n# not one\n```\n\
                ## remora's shim\n## Status\n## Status\n#hashtag\n";
    assert_eq!(
        anchors(page),
        BTreeSet::from(
            [
                "remora--design",
                "the-cri-rpcs-and-where-they-live",
                "remoras-shim",
                "status",
                "status-1"
            ]
            .map(String::from)
        )
    );
    let text = "[a](docs/a.md#x), [b](b.md), [web](https://x.io/y), [here](#status)";
    assert_eq!(
        relative_links(text),
        [("docs/a.md", "x"), ("b.md", ""), ("", "status")]
    );
    assert_eq!(
        resolve("docs/status.md", "../integration/x.txt"),
        Some(PathBuf::from("integration/x.txt"))
    );
    assert_eq!(resolve("README.md", "../x"), None);
}

#[test]
fn every_path_the_docs_name_exists() {
    let mut missing = Vec::new();
    for (page, text) in pages() {
        for path in repo_paths(&text) {
            if !repo().join(&path).exists() {
                missing.push(format!("{page}: {path}"));
            }
        }
        for (target, anchor) in relative_links(&text) {
            let Some(path) = (if target.is_empty() {
                Some(PathBuf::from(&page))
            } else {
                resolve(&page, target)
            }) else {
                missing.push(format!("{page}: link {target} leaves the repository"));
                continue;
            };
            if !repo().join(&path).exists() {
                missing.push(format!("{page}: link {target}"));
            } else if !anchor.is_empty() && path.extension().is_some_and(|e| e == "md") {
                let linked = read(&path.to_string_lossy());
                if !anchors(&linked).contains(anchor) {
                    missing.push(format!("{page}: link {target}#{anchor}: no such heading"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the docs name paths that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_readme_maps_every_home() {
    let readme = read("README.md");
    let named: BTreeSet<String> = repo_paths(&readme)
        .into_iter()
        .map(|p| p.trim_end_matches('/').to_string())
        .collect();
    let mut unnamed = Vec::new();
    for (dir, entry) in entries("src")
        .into_iter()
        .map(|e| ("src", e))
        .chain(entries("crates").into_iter().map(|e| ("crates", e)))
    {
        let home = format!("{dir}/{entry}");
        if !named.contains(&home) {
            unnamed.push(home);
        }
    }
    let linked: BTreeSet<String> = relative_links(&readme)
        .into_iter()
        .map(|(target, _)| target.to_string())
        .collect();
    for page in entries("docs").into_iter().filter(|n| n.ends_with(".md")) {
        let page = format!("docs/{page}");
        if !linked.contains(&page) {
            unnamed.push(format!("{page} (not linked)"));
        }
    }
    assert!(
        unnamed.is_empty(),
        "README.md's code map misses these homes (or its docs list these pages):\n{}",
        unnamed.join("\n")
    );
}
