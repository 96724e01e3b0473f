//! The layering rules, checked on the source tree: only the CRI adapter and what wires it up
//! (`server.rs`, `main.rs`, `lib.rs`) may use `crate::cri`, the ports' error module
//! (`crates/remora-core/src/backend_error.rs`) is a leaf that uses nothing of remora's, and
//! `images/` matches no gRPC code. The modules already in `crates/remora-core` cannot use the
//! adapters at all (a crate edge); these checks cover what is still in the daemon.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("a readable directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Whether `line` names top-level module `module` of this crate: `crate::cri::x`,
/// `use crate::cri;`, or `cri` inside `use crate::{…}`.
fn names_module(line: &str, module: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let word_at = |rest: &str| {
        rest.strip_prefix(module)
            .is_some_and(|after| !after.starts_with(is_ident))
    };
    let mut rest = line;
    while let Some(at) = rest.find("crate::") {
        rest = &rest[at + "crate::".len()..];
        if word_at(rest) {
            return true;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let group = group.split('}').next().unwrap_or(group);
            if group.split(|c: char| !is_ident(c)).any(|w| w == module) {
                return true;
            }
        }
    }
    false
}

/// Lines of `text` outside comments that name `crate::<module>`.
fn uses_of<'a>(text: &'a str, module: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .filter(|l| names_module(l, module))
        .collect()
}

#[test]
fn nothing_below_cri_uses_cri() {
    let src = src();
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() > 50,
        "found only {} files under {}",
        files.len(),
        src.display()
    );
    let allowed = |p: &Path| {
        p.starts_with(src.join("cri"))
            || [
                src.join("server.rs"),
                src.join("main.rs"),
                src.join("lib.rs"),
                // This file, whose examples name the module.
                src.join("layering.rs"),
            ]
            .contains(&p.to_path_buf())
    };
    let mut offenders = Vec::new();
    for f in files.iter().filter(|f| !allowed(f)) {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for line in uses_of(&text, "cri") {
            offenders.push(format!("{}: {}", f.display(), line.trim()));
        }
    }
    assert!(
        offenders.is_empty(),
        "cri used below cri:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_backend_error_module_is_a_leaf() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/remora-core/src/backend_error.rs");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let uses: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("crate::") || l.contains("super::") && !l.contains("use super::*"))
        .collect();
    assert!(
        uses.is_empty(),
        "backend_error.rs uses remora modules: {uses:?}"
    );
}

/// Image code decides on containerd's answers through `BackendError`'s predicates
/// (`is_not_found`, `is_unavailable`, …): gRPC codes are matched only in `containerd/` and
/// `cri/`. Test code (a `tests.rs`, a `tests/` directory, or what follows a file's first
/// `#[cfg(test)]`) may still
/// build a fake containerd answer with a code.
#[test]
fn images_match_no_grpc_code() {
    let dir = src().join("images");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let mut offenders = Vec::new();
    let is_test =
        |f: &Path| f.ends_with("tests.rs") || f.components().any(|c| c.as_os_str() == "tests");
    for f in files.iter().filter(|f| !is_test(f)) {
        let text = std::fs::read_to_string(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let production = text.split("#[cfg(test)]").next().unwrap_or(&text);
        for line in production
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
        {
            let grouped = line
                .split("tonic::{")
                .nth(1)
                .is_some_and(|g| g.split('}').next().unwrap_or(g).contains("Code"));
            if line.contains("tonic::Code") || grouped {
                offenders.push(format!("{}: {}", f.display(), line.trim()));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "gRPC codes matched in images/:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_check_sees_a_use() {
    // The matcher itself: each form an import of the module can take is caught.
    for line in [
        "use crate::cri::ImageRuntime;",
        "    crate::cri::convert::sandbox_config(&c)",
        "use crate::{cri, store};",
        "use crate::{store, cri::convert};",
        "use crate::cri;",
    ] {
        assert!(names_module(line, "cri"), "missed {line:?}");
    }
    for line in [
        "use crate::criteria::X;",
        "use crate::{store, lifecycle};",
        "// crate::cri",
    ] {
        assert!(uses_of(line, "cri").is_empty(), "false hit {line:?}");
    }
}
