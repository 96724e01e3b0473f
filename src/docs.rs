//! The documentation, checked against the tree. README.md and `docs/*.md` are read from the
//! source tree when the tests run:
//!
//! - docs/config.md's default file is what `remora config default` prints ([`DEFAULT_TOML`]);
//! - every count of a ratchet file's names that the docs state ([`COUNTED`]) is that file's
//!   count, read as the scripts read it;
//!
//! Text checks: they keep the prose from drifting from the tree, no more. A count or a path the
//! docs state in a way these do not recognise is not checked, so state them as these expect.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::config::DEFAULT_TOML;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The file at `rel` (a path relative to the repository), as text.
fn read(rel: &str) -> String {
    let path = repo().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
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
