//! Which pod and container annotations reach the OCI spec.
//!
//! Why a filter: the OCI runtime reads the spec's annotations, and some of them are commands
//! to it — runc and crun turn `org.systemd.property.*` into systemd unit properties, crun
//! acts on `run.oci.*` (`run.oci.keep_original_groups`, `run.oci.seccomp_fail_unknown_syscall`,
//! …), Kata and gVisor on their own prefixes. Pod authors write annotations, so passing all of
//! them on would let anyone who can create a pod reconfigure the runtime. As containerd's CRI
//! (`runtime_handler.pod_annotations` / `container_annotations`, `GetPassthroughAnnotations`),
//! each runtime handler names the keys it passes through; none by default. remora's own
//! `io.kubernetes.cri.*` keys ([`super::annotations`]) are always set, with remora's values.
//!
//! Patterns follow Go's `filepath.Match` as containerd uses it, restricted to `*` (any run of
//! characters other than `/`) and `?` (one character other than `/`); `[` and `\` are
//! refused by [`check_pattern`] rather than read differently from containerd.

use std::collections::HashMap;

/// The annotation keys one runtime handler passes through to the OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassThrough {
    /// Patterns of pod annotations passed to the pause container's spec and to every
    /// container's spec of the pod.
    pub pod: Vec<String>,
    /// Patterns of container annotations passed to that container's spec.
    pub container: Vec<String>,
}

impl PassThrough {
    /// The pod annotations of `all` that the handler passes on.
    pub fn pod_annotations(&self, all: &HashMap<String, String>) -> HashMap<String, String> {
        filter(&self.pod, all)
    }

    /// The container annotations of `all` that the handler passes on.
    pub fn container_annotations(&self, all: &HashMap<String, String>) -> HashMap<String, String> {
        filter(&self.container, all)
    }
}

fn filter(patterns: &[String], all: &HashMap<String, String>) -> HashMap<String, String> {
    if patterns.is_empty() {
        return HashMap::new();
    }
    all.iter()
        .filter(|(k, _)| patterns.iter().any(|p| matches(p, k)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Why a configured pattern is refused.
pub fn check_pattern(pattern: &str) -> Result<(), String> {
    if pattern.is_empty() {
        return Err("is an empty pattern".into());
    }
    if let Some(c) = pattern.chars().find(|c| matches!(c, '[' | ']' | '\\')) {
        return Err(format!(
            "pattern {pattern:?} uses {c:?}; only '*' and '?' are supported"
        ));
    }
    Ok(())
}

/// Whether `key` matches `pattern` (`*`: any run of non-`/` characters, `?`: one non-`/`
/// character, anything else itself). Iterative with one backtrack point, so linear-ish in
/// the lengths and free of recursion on hostile keys.
pub fn matches(pattern: &str, key: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let k: Vec<char> = key.chars().collect();
    let (mut pi, mut ki) = (0, 0);
    // The last `*` seen and the key position it currently stands for the end of.
    let mut star: Option<(usize, usize)> = None;
    while ki < k.len() {
        match p.get(pi).copied() {
            Some('*') => {
                star = Some((pi, ki));
                pi += 1;
            }
            Some('?') if k[ki] != '/' => {
                pi += 1;
                ki += 1;
            }
            Some(c) if c != '*' && c != '?' && c == k[ki] => {
                pi += 1;
                ki += 1;
            }
            _ => match star {
                // Let the last `*` take one more character, unless that is a `/`.
                Some((sp, sk)) if k[sk] != '/' => {
                    star = Some((sp, sk + 1));
                    pi = sp + 1;
                    ki = sk + 1;
                }
                _ => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_as_go_filepath_match_does() {
        for (pattern, key, want) in [
            ("example.com/x", "example.com/x", true),
            ("example.com/x", "example.com/xy", false),
            ("example.com/*", "example.com/anything", true),
            ("example.com/*", "example.com/", true),
            ("example.com/*", "example.com/a/b", false),
            ("example.com/*", "example.org/a", false),
            ("*", "io.katacontainers.x", true),
            ("*", "a/b", false),
            ("*/*", "a/b", true),
            ("run.oci.*", "run.oci.keep_original_groups", true),
            ("run.oci.*", "run.ocix", false),
            ("org.systemd.property.?", "org.systemd.property.x", true),
            ("org.systemd.property.?", "org.systemd.property.xy", false),
            ("a*b*c", "aXXbYYc", true),
            ("a*b*c", "aXXbYY", false),
            ("*x", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxy", false),
        ] {
            assert_eq!(matches(pattern, key), want, "{pattern} ~ {key}");
        }
    }

    #[test]
    fn only_listed_annotations_pass() {
        let all: HashMap<String, String> = [
            ("org.systemd.property.CPUQuota", "1%"),
            ("run.oci.keep_original_groups", "1"),
            ("example.com/note", "n"),
            ("io.kubernetes.cri.sandbox-id", "forged"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert!(PassThrough::default().pod_annotations(&all).is_empty());
        assert!(PassThrough::default()
            .container_annotations(&all)
            .is_empty());
        let p = PassThrough {
            pod: vec!["example.com/*".into()],
            container: vec!["run.oci.keep_original_groups".into()],
        };
        assert_eq!(
            p.pod_annotations(&all).keys().collect::<Vec<_>>(),
            ["example.com/note"]
        );
        assert_eq!(
            p.container_annotations(&all).keys().collect::<Vec<_>>(),
            ["run.oci.keep_original_groups"]
        );
    }

    #[test]
    fn bracket_and_escape_patterns_are_refused() {
        assert!(check_pattern("example.com/*").is_ok());
        assert!(check_pattern("").is_err());
        assert!(check_pattern("a[bc]").unwrap_err().contains("'['"));
        assert!(check_pattern("a\\*").is_err());
    }
}
