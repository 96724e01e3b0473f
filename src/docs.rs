//! The documentation, checked against the tree. README.md and `docs/*.md` are read from the
//! source tree when the tests run:
//!
//! - docs/config.md's default file is what `remora config default` prints ([`DEFAULT_TOML`]);
//!
//! Text checks: they keep the prose from drifting from the tree, no more. A count or a path the
//! docs state in a way these do not recognise is not checked, so state them as these expect.

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
