//! Names as containerd reads them: Go's `filepath.Clean`, then resolved under the root.
//!
//! containerd cleans an entry's name lexically (`a/../b` is `b` even when `a` is a symlink),
//! splits off the last component, and resolves the parent under the root with `..` and
//! absolute symlink targets bound to the root (continuity's `fs.RootPath`). A name made only
//! of `..`, `.` or `/` resolves to the root itself, and containerd skips it.

/// One path component (never empty, `.` or `..` once cleaned under a root).
pub(super) type Component = Vec<u8>;

/// The components of `name` cleaned as a path under the root: Go's `Clean("/" + name)`,
/// `..` above the root staying at the root. An entry's name comes to the same: Go's `Clean`
/// keeps only the `..` it cannot cancel, at the front of a relative name, and the root
/// absorbs those.
pub(super) fn rooted_components(name: &[u8]) -> Vec<Component> {
    let mut out: Vec<Component> = Vec::new();
    for c in name.split(|b| *b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                out.pop();
            }
            c => out.push(c.to_vec()),
        }
    }
    out
}

/// `parent` (a physical path under the root, by components) joined with `target`, a
/// symlink's target, cleaned: absolute targets start again at the root.
pub(super) fn join_link(parent: &[Component], target: &[u8]) -> Vec<Component> {
    if target.starts_with(b"/") {
        return rooted_components(target);
    }
    let mut joined = parent.join(&b'/');
    joined.push(b'/');
    joined.extend_from_slice(target);
    rooted_components(&joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comps(v: &[&str]) -> Vec<Component> {
        v.iter().map(|s| s.as_bytes().to_vec()).collect()
    }

    #[test]
    fn names_clean_like_go_under_the_root() {
        assert_eq!(rooted_components(b"../../etc/x"), comps(&["etc", "x"]));
        assert_eq!(rooted_components(b"/abs/path"), comps(&["abs", "path"]));
        assert_eq!(rooted_components(b"./a//b/./c/"), comps(&["a", "b", "c"]));
        assert_eq!(rooted_components(b"a/../../b"), comps(&["b"]));
        assert_eq!(rooted_components(b"a/b/.."), comps(&["a"]));
        assert!(rooted_components(b"./").is_empty());
        assert!(rooted_components(b"../..").is_empty());
        assert!(rooted_components(b"/").is_empty());
    }

    #[test]
    fn symlink_targets_join_and_stay_under_the_root() {
        let parent = comps(&["usr", "lib"]);
        assert_eq!(join_link(&parent, b"../x"), comps(&["usr", "x"]));
        assert_eq!(join_link(&parent, b"../../../../x"), comps(&["x"]));
        assert_eq!(join_link(&parent, b"/etc"), comps(&["etc"]));
        assert_eq!(
            join_link(&parent, b"missing/../y"),
            comps(&["usr", "lib", "y"])
        );
        assert!(join_link(&parent, b"/").is_empty());
    }
}
