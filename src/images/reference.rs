//! Docker image references, parsed and normalised the way `distribution/reference` does
//! (`ParseNormalizedNamed` followed by `TagNameOnly`), because kubelet and users write
//! familiar names (`busybox`) and containerd stores fully qualified ones
//! (`docker.io/library/busybox:latest`). Two spellings of one image must normalise to one
//! string, or pulls of the same image would not coalesce.
//!
//! Grammar (from distribution/reference):
//!
//! ```text
//! reference  := name [ ":" tag ] [ "@" digest ]
//! name       := [domain "/"] path-component ["/" path-component]*
//! domain     := host [":" port]
//! path-component := [a-z0-9]+ (([._]|__|[-]+) [a-z0-9]+)*
//! tag        := [\w][\w.-]{0,127}
//! digest     := "sha256:" 64 lowercase hex digits
//! ```
//!
//! A bare `sha256:<hex>` (or 64 hex digits) is an image ID, not a reference; parsing it
//! yields [`ReferenceError::ImageId`] so the caller can look it up by ID instead.
//!
//! Why not `oci-spec`'s `distribution::Reference` (checked against oci-spec 0.10): it
//! normalises `docker.io/library/...` the same way, but its errors are bare variants ("invalid
//! reference format") that name neither the input nor the faulty part, which the CRI error
//! messages (and their tests) rely on; it does not tell an image ID from a name, so
//! `RemoveImage`/`ImageStatus` by ID would need a check of their own before it anyway; and it
//! accepts digests of any registered algorithm where remora takes only sha256 ([`Digest`]).

use std::fmt;

use thiserror::Error;

use crate::images::manifest::Digest;

/// The registry of unqualified names.
pub const DEFAULT_REGISTRY: &str = "docker.io";
/// Docker's legacy name for [`DEFAULT_REGISTRY`], normalised to it.
const LEGACY_DEFAULT_REGISTRY: &str = "index.docker.io";
/// Single-component names on Docker Hub live under `library/`.
const OFFICIAL_REPO_PREFIX: &str = "library/";
/// The tag of a reference that names neither tag nor digest.
pub const DEFAULT_TAG: &str = "latest";
/// distribution's `NameTotalLengthMax`.
const NAME_MAX_LEN: usize = 255;
/// Longest tag the grammar allows.
const TAG_MAX_LEN: usize = 128;

/// Why a string is not a usable image reference.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ReferenceError {
    /// The empty string.
    #[error("invalid image reference: empty")]
    Empty,
    /// An image ID (`sha256:<hex>` or 64 hex digits): look it up by ID, not by name.
    #[error("{id} is an image ID, not an image reference")]
    ImageId {
        /// The ID in canonical `sha256:<hex>` form.
        id: String,
    },
    /// The registry part (`host[:port]`) is malformed.
    #[error("invalid image reference {reference:?}: invalid registry {registry:?}")]
    InvalidRegistry {
        /// The input.
        reference: String,
        /// The registry part.
        registry: String,
    },
    /// The repository has uppercase letters, which the grammar forbids.
    #[error("invalid image reference {reference:?}: repository name must be lowercase")]
    UppercaseRepository {
        /// The input.
        reference: String,
    },
    /// A `/`-separated repository component is empty or malformed.
    #[error(
        "invalid image reference {reference:?}: invalid repository component {component:?} \
         (want lowercase letters and digits, separated by '.', '_', '__' or dashes)"
    )]
    InvalidRepositoryComponent {
        /// The input.
        reference: String,
        /// The offending component.
        component: String,
    },
    /// The name is longer than 255 characters.
    #[error("invalid image reference {reference:?}: name is {len} characters, at most {NAME_MAX_LEN} allowed")]
    NameTooLong {
        /// The input.
        reference: String,
        /// Length of the name.
        len: usize,
    },
    /// A `:` with nothing after it.
    #[error("invalid image reference {reference:?}: ':' without a tag")]
    EmptyTag {
        /// The input.
        reference: String,
    },
    /// The tag has characters the grammar forbids or is too long.
    #[error("invalid image reference {reference:?}: invalid tag {tag:?} (want [A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})")]
    InvalidTag {
        /// The input.
        reference: String,
        /// The tag.
        tag: String,
    },
    /// The part after `@` is not a valid sha256 digest.
    #[error("invalid image reference {reference:?}: invalid digest {digest:?}: {reason}")]
    InvalidDigest {
        /// The input.
        reference: String,
        /// The digest part.
        digest: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// A normalised image reference: `registry/repository[:tag][@digest]`.
///
/// A reference that names neither a tag nor a digest gets the tag `latest`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// Registry host, with port if any (`docker.io`, `localhost:5000`).
    pub registry: String,
    /// Repository path (`library/busybox`).
    pub repository: String,
    /// Tag, if any.
    pub tag: Option<String>,
    /// Digest (`sha256:<hex>`), if any.
    pub digest: Option<String>,
}

impl Reference {
    /// Parses and normalises `s` (see the module docs for the rules).
    pub fn parse(s: &str) -> Result<Self, ReferenceError> {
        if s.is_empty() {
            return Err(ReferenceError::Empty);
        }
        if let Some(id) = image_id(s) {
            return Err(ReferenceError::ImageId { id });
        }
        let (name_tag, digest) = match s.split_once('@') {
            Some((n, d)) => {
                let parsed = Digest::parse(d).map_err(|e| ReferenceError::InvalidDigest {
                    reference: s.to_owned(),
                    digest: d.to_owned(),
                    reason: e.to_string(),
                })?;
                (n, Some(parsed.to_string()))
            }
            None => (s, None),
        };
        // A tag is a ':' after the last '/'; an earlier ':' belongs to a registry port.
        let last_slash = name_tag.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match name_tag[last_slash..].rfind(':') {
            Some(i) => {
                let at = last_slash + i;
                (&name_tag[..at], Some(&name_tag[at + 1..]))
            }
            None => (name_tag, None),
        };
        if let Some(tag) = tag {
            if tag.is_empty() {
                return Err(ReferenceError::EmptyTag {
                    reference: s.to_owned(),
                });
            }
            if !valid_tag(tag) {
                return Err(ReferenceError::InvalidTag {
                    reference: s.to_owned(),
                    tag: tag.to_owned(),
                });
            }
        }
        if name.is_empty() {
            return Err(ReferenceError::InvalidRepositoryComponent {
                reference: s.to_owned(),
                component: String::new(),
            });
        }
        if name.len() > NAME_MAX_LEN {
            return Err(ReferenceError::NameTooLong {
                reference: s.to_owned(),
                len: name.len(),
            });
        }
        let (registry, repository) = split_registry(name);
        if !valid_registry(&registry) {
            return Err(ReferenceError::InvalidRegistry {
                reference: s.to_owned(),
                registry,
            });
        }
        if repository.chars().any(|c| c.is_ascii_uppercase()) {
            return Err(ReferenceError::UppercaseRepository {
                reference: s.to_owned(),
            });
        }
        if let Some(bad) = repository.split('/').find(|c| !valid_path_component(c)) {
            return Err(ReferenceError::InvalidRepositoryComponent {
                reference: s.to_owned(),
                component: bad.to_owned(),
            });
        }
        let full_len = registry.len() + 1 + repository.len();
        if full_len > NAME_MAX_LEN {
            return Err(ReferenceError::NameTooLong {
                reference: s.to_owned(),
                len: full_len,
            });
        }
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_owned()),
            (None, None) => Some(DEFAULT_TAG.to_owned()),
            (None, Some(_)) => None,
        };
        Ok(Self {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// `registry/repository`, e.g. `docker.io/library/busybox`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The same image pinned to `digest`; the tag is kept, as containerd keeps it for
    /// `name:tag@digest` references.
    pub fn with_digest(&self, digest: &Digest) -> Self {
        Self {
            digest: Some(digest.to_string()),
            ..self.clone()
        }
    }

    /// What to ask the registry's `manifests/` endpoint for: the digest if pinned (a digest
    /// wins over a tag, as in containerd), else the tag.
    pub fn object(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or(DEFAULT_TAG)
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Reference {
    type Err = ReferenceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// True if `s` is an image ID (`sha256:<64 hex>` or 64 bare hex digits) rather than a name.
pub fn is_image_id(s: &str) -> bool {
    image_id(s).is_some()
}

/// The canonical `sha256:<hex>` form of an image ID, if `s` is one.
fn image_id(s: &str) -> Option<String> {
    let hex = s.strip_prefix("sha256:").unwrap_or(s);
    (hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
        .then(|| format!("sha256:{hex}"))
}

/// distribution's `splitDockerDomain`: the first component is a registry only if it looks
/// like a host (has `.` or `:`, is `localhost`, or has uppercase letters, which a
/// repository cannot).
fn split_registry(name: &str) -> (String, String) {
    let (mut registry, mut rest) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            (first.to_owned(), rest.to_owned())
        }
        _ => (DEFAULT_REGISTRY.to_owned(), name.to_owned()),
    };
    if registry == LEGACY_DEFAULT_REGISTRY {
        DEFAULT_REGISTRY.clone_into(&mut registry);
    }
    if registry == DEFAULT_REGISTRY && !rest.contains('/') {
        rest = format!("{OFFICIAL_REPO_PREFIX}{rest}");
    }
    (registry, rest)
}

/// `host[:port]` where host is a DNS name, IPv4 address or bracketed IPv6 address.
fn valid_registry(registry: &str) -> bool {
    let (host, port) = if let Some(rest) = registry.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else {
            return false;
        };
        if v6.is_empty()
            || !v6
                .chars()
                .all(|c| c.is_ascii_hexdigit() || c == ':' || c == '.')
        {
            return false;
        }
        match after {
            "" => return true,
            p => match p.strip_prefix(':') {
                Some(port) => ("ok", Some(port)),
                None => return false,
            },
        }
    } else {
        match registry.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (registry, None),
        }
    };
    if let Some(p) = port {
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return false;
        }
    }
    !host.is_empty()
        && host.split('.').all(|c| {
            let b = c.as_bytes();
            !b.is_empty()
                && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// `[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*`
fn valid_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    let mut i = 0;
    loop {
        // One run of alphanumerics, required.
        let start = i;
        while i < b.len() && alnum(b[i]) {
            i += 1;
        }
        if i == start {
            return false;
        }
        if i == b.len() {
            return true;
        }
        // One separator, then loop for the next run.
        match b[i] {
            b'.' => i += 1,
            b'_' => {
                i += 1;
                if i < b.len() && b[i] == b'_' {
                    i += 1;
                }
            }
            b'-' => {
                while i < b.len() && b[i] == b'-' {
                    i += 1;
                }
            }
            _ => return false,
        }
    }
}

/// `[\w][\w.-]{0,127}`
fn valid_tag(t: &str) -> bool {
    let word = |x: u8| x.is_ascii_alphanumeric() || x == b'_';
    let b = t.as_bytes();
    b.len() <= TAG_MAX_LEN
        && b.first().is_some_and(|&x| word(x))
        && b.iter().all(|&x| word(x) || x == b'.' || x == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    fn norm(s: &str) -> String {
        Reference::parse(s).unwrap().to_string()
    }

    #[test]
    fn normalises_familiar_names() {
        assert_eq!(norm("busybox"), "docker.io/library/busybox:latest");
        assert_eq!(norm("busybox:1.36"), "docker.io/library/busybox:1.36");
        assert_eq!(norm("foo/bar"), "docker.io/foo/bar:latest");
        assert_eq!(
            norm("index.docker.io/busybox"),
            "docker.io/library/busybox:latest"
        );
        assert_eq!(norm("docker.io/foo/bar/baz:v1"), "docker.io/foo/bar/baz:v1");
        assert_eq!(norm("localhost/x"), "localhost/x:latest");
        assert_eq!(norm("localhost:5000/x"), "localhost:5000/x:latest");
        assert_eq!(norm("127.0.0.1:5000/x:tag"), "127.0.0.1:5000/x:tag");
        assert_eq!(
            norm("registry.k8s.io/pause:3.10"),
            "registry.k8s.io/pause:3.10"
        );
        assert_eq!(norm("[::1]:5000/a/b:c"), "[::1]:5000/a/b:c");
        assert_eq!(norm("a.b/c__d-e--f.g_h:T_1.-x"), "a.b/c__d-e--f.g_h:T_1.-x");
    }

    #[test]
    fn fields_and_name() {
        let r = Reference::parse("registry.k8s.io/pause:3.10").unwrap();
        assert_eq!(r.registry, "registry.k8s.io");
        assert_eq!(r.repository, "pause");
        assert_eq!(r.tag.as_deref(), Some("3.10"));
        assert_eq!(r.digest, None);
        assert_eq!(r.name(), "registry.k8s.io/pause");
        assert_eq!(r.object(), "3.10");
        assert_eq!(
            Reference::parse("busybox").unwrap().name(),
            "docker.io/library/busybox"
        );
    }

    #[test]
    fn digests_are_kept_with_or_without_tag() {
        let r = Reference::parse(&format!("busybox@sha256:{HEX}")).unwrap();
        assert_eq!(r.tag, None);
        assert_eq!(
            r.to_string(),
            format!("docker.io/library/busybox@sha256:{HEX}")
        );
        assert_eq!(r.object(), format!("sha256:{HEX}"));
        let r = Reference::parse(&format!("busybox:1.36@sha256:{HEX}")).unwrap();
        assert_eq!(r.tag.as_deref(), Some("1.36"));
        assert_eq!(
            r.to_string(),
            format!("docker.io/library/busybox:1.36@sha256:{HEX}")
        );
        assert_eq!(r.object(), format!("sha256:{HEX}"), "digest wins over tag");

        let d = Digest::parse(&format!("sha256:{HEX}")).unwrap();
        let pinned = Reference::parse("busybox:1.36").unwrap().with_digest(&d);
        assert_eq!(
            pinned.to_string(),
            format!("docker.io/library/busybox:1.36@sha256:{HEX}")
        );
    }

    #[test]
    fn image_ids_are_not_references() {
        assert!(is_image_id(&format!("sha256:{HEX}")));
        assert!(is_image_id(HEX));
        assert!(!is_image_id("busybox"));
        assert_eq!(
            Reference::parse(HEX),
            Err(ReferenceError::ImageId {
                id: format!("sha256:{HEX}")
            })
        );
        assert!(matches!(
            Reference::parse(&format!("sha256:{HEX}")),
            Err(ReferenceError::ImageId { .. })
        ));
    }

    #[test]
    fn rejects_malformed() {
        use ReferenceError as E;
        let err = |s: &str| Reference::parse(s).unwrap_err();
        assert_eq!(err(""), E::Empty);
        assert!(matches!(err("busybox:"), E::EmptyTag { .. }));
        assert!(matches!(
            err("docker.io/Busybox"),
            E::UppercaseRepository { .. }
        ));
        assert!(matches!(err("foo/Bar"), E::UppercaseRepository { .. }));
        assert!(matches!(err("busybox:-x"), E::InvalidTag { .. }));
        assert!(matches!(
            err(&format!("b:{}", "x".repeat(129))),
            E::InvalidTag { .. }
        ));
        assert!(matches!(err("a//b"), E::InvalidRepositoryComponent { .. }));
        assert!(matches!(err("a/b-"), E::InvalidRepositoryComponent { .. }));
        assert!(matches!(err("a/.b"), E::InvalidRepositoryComponent { .. }));
        assert!(matches!(
            err("a/b___c"),
            E::InvalidRepositoryComponent { .. }
        ));
        assert!(matches!(err("localhost:port/x"), E::InvalidRegistry { .. }));
        assert!(matches!(err("-bad.io/x"), E::InvalidRegistry { .. }));
        assert!(matches!(err("busybox@sha256:abc"), E::InvalidDigest { .. }));
        assert!(matches!(
            err(&format!("busybox@md5:{HEX}")),
            E::InvalidDigest { .. }
        ));
        assert!(matches!(
            err(&format!("busybox@sha256:{}", HEX.to_uppercase())),
            E::InvalidDigest { .. }
        ));
        assert!(matches!(err(&"a".repeat(256)), E::NameTooLong { .. }));
        assert!(matches!(err(":tag"), E::InvalidRepositoryComponent { .. }));
        // The message names the input and the problem.
        let msg = err("docker.io/Busybox").to_string();
        assert!(
            msg.contains("docker.io/Busybox") && msg.contains("lowercase"),
            "{msg}"
        );
    }
}
