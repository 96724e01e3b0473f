// Where a build script finds a .proto of protos/sources.txt. Not a module of any crate: the
// root build.rs and crates/remora-nri/build.rs each `include!` this file, so the rule for
// reading the list is written once.

/// scripts/setup.sh's tools directory when `REMORA_TOOLS_DIR` is not set.
const DEFAULT_TOOLS_DIR: &str = "/var/tmp/remora-tools";

/// The .proto of `module`: the file `env` names, if set; else where scripts/setup.sh copies
/// the version and path `list` (protos/sources.txt) pins for `module`,
/// `$REMORA_TOOLS_DIR/protos/<module>@<version>/<path>`. Prints the `rerun-if-env-changed`
/// lines; the error is a message for the build script to report.
fn proto_path(
    list: &std::path::Path,
    module: &str,
    env: &str,
) -> Result<std::path::PathBuf, String> {
    use std::path::PathBuf;

    println!("cargo:rerun-if-env-changed={env}");
    println!("cargo:rerun-if-env-changed=REMORA_TOOLS_DIR");
    if let Some(p) = std::env::var_os(env).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let text = std::fs::read_to_string(list)
        .map_err(|e| format!("reading {}: {e}", list.display()))?;
    let (version, path) = text
        .lines()
        .map(str::split_whitespace)
        .map(|mut w| (w.next(), w.next(), w.next()))
        .find_map(|(m, version, path)| match (m, version, path) {
            (Some(m), Some(version), Some(path)) if m == module => Some((version, path)),
            _ => None,
        })
        .ok_or_else(|| format!("{} names no {module} <version> <path> line", list.display()))?;
    let tools = std::env::var_os("REMORA_TOOLS_DIR")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_TOOLS_DIR), PathBuf::from);
    Ok(tools
        .join("protos")
        .join(format!("{module}@{version}"))
        .join(path))
}
