//! Image manifest formats: OCI image index and manifest, Docker schema2 manifest list and
//! manifest, the image config, content digests, and platform selection.
//!
//! The OCI and Docker schema2 formats have the same JSON shape (a list has `manifests`, a
//! manifest has `config` and `layers`), so one struct serves each pair and the media type
//! tells them apart. Docker schema1 (signed, no config blob) is refused: containerd's CRI
//! refuses it too, and registries convert on request when asked for schema2.
//!
//! Why not `oci-spec`'s `image` types (checked against oci-spec 0.10): they would change what
//! is accepted and how it fails. Its `ImageIndex` requires `manifests` and its
//! `ImageConfiguration` requires `architecture`, `os` and a `rootfs.diff_ids` list, where Docker
//! writes `null` for empty lists and maps (every collection here takes `null`, see
//! `null_default`); its `Digest` accepts any algorithm (sha384, sha512, `multihash+base58`)
//! where remora takes only sha256 and names the problem ([`DigestError`]); its `MediaType`
//! knows only the OCI types, so Docker schema2 and schema1 would be `Other(..)` strings anyway;
//! and it has no platform normalisation ([`select_platform`]). What is kept here is that
//! lenient reading, the digest rules and containerd's platform matching; the types mirror the
//! OCI image-spec field names, so moving to oci-spec's later is a mechanical change.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};
use sha2::{Digest as _, Sha256};
use thiserror::Error;

/// OCI image index.
pub const MEDIA_TYPE_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
/// OCI image manifest.
pub const MEDIA_TYPE_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// Docker schema2 manifest list.
pub const MEDIA_TYPE_DOCKER_MANIFEST_LIST: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";
/// Docker schema2 manifest.
pub const MEDIA_TYPE_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
/// Docker schema1 manifest (unsupported; named for the error message).
pub const MEDIA_TYPE_DOCKER_SCHEMA1: &str =
    "application/vnd.docker.distribution.manifest.v1+prettyjws";
/// OCI image config.
#[cfg(test)]
pub const MEDIA_TYPE_OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// Docker image config.
#[cfg(test)]
pub const MEDIA_TYPE_DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
/// OCI gzip layer.
#[cfg(test)]
pub const MEDIA_TYPE_OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// Docker gzip layer.
#[cfg(test)]
pub const MEDIA_TYPE_DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";

/// Largest manifest or index remora reads (from a registry or from the content store): they
/// are held in memory whole to be parsed. containerd's resolver refuses manifests over this
/// same size (`MaxManifestSize`, 4 × 1048 × 1048 bytes, about 4.2 MiB), so remora takes every
/// manifest containerd takes. Real manifests are a few KiB (about 256 bytes per layer).
pub const MAX_MANIFEST_SIZE: u64 = 4 * 1048 * 1048;

/// Largest image config remora reads. containerd sets no limit on configs; remora needs one
/// because a config is read into memory whole to be parsed, and its parsed fields are kept.
/// 128 MiB is twice the largest config known to be in use (64 MiB, which containerd's CRI
/// pulls and so must remora), and bounds the memory one pull can take for its config.
pub const MAX_CONFIG_SIZE: u64 = 128 << 20;

/// The media types a registry may answer a manifest request with, in the order of the
/// `Accept` header.
pub const MANIFEST_MEDIA_TYPES: [&str; 4] = [
    MEDIA_TYPE_OCI_INDEX,
    MEDIA_TYPE_OCI_MANIFEST,
    MEDIA_TYPE_DOCKER_MANIFEST_LIST,
    MEDIA_TYPE_DOCKER_MANIFEST,
];

/// True for an index or manifest list.
pub fn is_index_media_type(mt: &str) -> bool {
    mt == MEDIA_TYPE_OCI_INDEX || mt == MEDIA_TYPE_DOCKER_MANIFEST_LIST
}

/// True for a single-platform image manifest.
pub fn is_image_manifest_media_type(mt: &str) -> bool {
    mt == MEDIA_TYPE_OCI_MANIFEST || mt == MEDIA_TYPE_DOCKER_MANIFEST
}

/// Why a digest string is invalid.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DigestError {
    /// Not `algorithm:hex`.
    #[error("digest {0:?} is not of the form sha256:<hex>")]
    Format(String),
    /// An algorithm other than sha256.
    #[error("digest {digest:?}: unsupported algorithm {algorithm:?} (only sha256)")]
    Algorithm {
        /// The digest.
        digest: String,
        /// Its algorithm.
        algorithm: String,
    },
    /// The hex part is not 64 lowercase hex digits.
    #[error("digest {0:?}: want 64 lowercase hex digits after sha256:")]
    Hex(String),
}

/// Contents that do not match what their descriptor promised.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum VerifyError {
    /// The sha256 differs.
    #[error("digest mismatch: expected {expected}, got {actual}")]
    Digest {
        /// From the descriptor.
        expected: Digest,
        /// Of the bytes received.
        actual: Digest,
    },
    /// The length differs.
    #[error("size mismatch: expected {expected} bytes, got {actual}")]
    Size {
        /// From the descriptor.
        expected: u64,
        /// Bytes received.
        actual: u64,
    },
    /// containerd's content store, which hashed the bytes as they were written, refused them
    /// at commit (remora leaves the digest check of layers to it).
    #[error("refused by containerd's content store: {0}")]
    RefusedByStore(String),
}

/// A content digest, `sha256:` followed by 64 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Digest(String);

impl Digest {
    /// Validates `s`.
    pub fn parse(s: &str) -> Result<Self, DigestError> {
        let (alg, hex) = s
            .split_once(':')
            .ok_or_else(|| DigestError::Format(s.to_owned()))?;
        if alg != "sha256" {
            return Err(DigestError::Algorithm {
                digest: s.to_owned(),
                algorithm: alg.to_owned(),
            });
        }
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(DigestError::Hex(s.to_owned()));
        }
        Ok(Self(s.to_owned()))
    }

    /// The digest of `data`.
    pub fn of(data: &[u8]) -> Self {
        Self::from_sha256(Sha256::digest(data).into())
    }

    fn from_sha256(sum: [u8; 32]) -> Self {
        Self(format!("sha256:{}", hex::encode(sum)))
    }

    /// `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The hex part.
    pub fn hex(&self) -> &str {
        // Invariant: parse/from_sha256 only build "sha256:<hex>".
        &self.0["sha256:".len()..]
    }

    /// Checks that `data` has this digest.
    pub fn verify(&self, data: &[u8]) -> Result<(), VerifyError> {
        let actual = Self::of(data);
        if &actual == self {
            Ok(())
        } else {
            Err(VerifyError::Digest {
                expected: self.clone(),
                actual,
            })
        }
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Digest {
    type Err = DigestError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// Hashes content as it streams by, then checks it against the expected digest and size.
#[derive(Debug, Clone)]
pub struct DigestVerifier {
    expected: Digest,
    expected_size: Option<u64>,
    hasher: Sha256,
    seen: u64,
}

impl DigestVerifier {
    /// Expects content with `digest` and, if given, exactly `size` bytes.
    pub fn new(digest: Digest, size: Option<u64>) -> Self {
        Self {
            expected: digest,
            expected_size: size,
            hasher: Sha256::new(),
            seen: 0,
        }
    }

    /// Feeds the next chunk. Fails as soon as the content outgrows the expected size, so a
    /// server sending an endless body is stopped early.
    pub fn update(&mut self, chunk: &[u8]) -> Result<(), VerifyError> {
        self.hasher.update(chunk);
        self.seen += chunk.len() as u64;
        match self.expected_size {
            Some(expected) if self.seen > expected => Err(VerifyError::Size {
                expected,
                actual: self.seen,
            }),
            _ => Ok(()),
        }
    }

    /// Bytes fed so far.
    #[cfg(test)]
    pub fn bytes_seen(&self) -> u64 {
        self.seen
    }

    /// Checks size, then digest, of everything fed.
    pub fn finish(self) -> Result<Digest, VerifyError> {
        if let Some(expected) = self.expected_size {
            if self.seen != expected {
                return Err(VerifyError::Size {
                    expected,
                    actual: self.seen,
                });
            }
        }
        let actual = Digest::from_sha256(self.hasher.finalize().into());
        if actual == self.expected {
            Ok(actual)
        } else {
            Err(VerifyError::Digest {
                expected: self.expected,
                actual,
            })
        }
    }
}

/// The platform of a manifest in an index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Platform {
    /// CPU architecture (`amd64`, `arm64`, ...).
    pub architecture: String,
    /// Operating system (`linux`, `windows`).
    pub os: String,
    /// CPU variant (`v7`, `v8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// OS version (Windows).
    #[serde(
        rename = "os.version",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub os_version: Option<String>,
    /// Required OS features.
    #[serde(rename = "os.features", default, skip_serializing_if = "Vec::is_empty")]
    pub os_features: Vec<String>,
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

/// A pointer to content: its media type, digest and size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Media type of the content.
    pub media_type: String,
    /// Digest of the content.
    pub digest: Digest,
    /// Size of the content in bytes.
    pub size: u64,
    /// Platform, for manifests in an index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
    /// Annotations.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_default"
    )]
    pub annotations: BTreeMap<String, String>,
    /// Alternative download URLs (foreign layers); not used for pulls.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "null_default"
    )]
    pub urls: Vec<String>,
}

/// An OCI image index or Docker manifest list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageIndex {
    /// Always 2.
    pub schema_version: u32,
    /// The media type, if the document states it (optional in OCI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// One manifest per platform (and possibly attestations).
    #[serde(deserialize_with = "null_default")]
    pub manifests: Vec<Descriptor>,
    /// Annotations.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_default"
    )]
    pub annotations: BTreeMap<String, String>,
}

/// An OCI image manifest or Docker schema2 manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    /// Always 2.
    pub schema_version: u32,
    /// The media type, if the document states it (optional in OCI).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// The image config blob.
    pub config: Descriptor,
    /// Layers, base first.
    #[serde(default, deserialize_with = "null_default")]
    pub layers: Vec<Descriptor>,
    /// Annotations.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "null_default"
    )]
    pub annotations: BTreeMap<String, String>,
}

/// A manifest fetched by media type: an index or a single image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Manifest {
    /// An index or manifest list.
    Index(ImageIndex),
    /// A single-platform manifest (boxed: it is much larger than an index).
    Image(Box<ImageManifest>),
}

/// A manifest or config that cannot be used.
#[derive(Debug, Error)]
pub enum ManifestError {
    /// Docker schema1, which has no config blob.
    #[error("Docker schema1 manifests are not supported; push the image with a current client")]
    Schema1,
    /// A media type that is not a manifest.
    #[error("unsupported manifest media type {0:?}")]
    UnsupportedMediaType(String),
    /// Not valid JSON for the type.
    #[error("invalid {what}: {source}")]
    Json {
        /// "image index", "image manifest" or "image config".
        what: &'static str,
        /// The parser's message.
        source: serde_json::Error,
    },
    /// A manifest, index or config larger than remora reads into memory.
    #[error("{what} {digest} is {size} bytes, over remora's limit of {limit} bytes")]
    TooLarge {
        /// "image index", "image manifest" or "image config".
        what: &'static str,
        /// The blob.
        digest: String,
        /// Its size, as its descriptor states it.
        size: u64,
        /// [`MAX_MANIFEST_SIZE`] or [`MAX_CONFIG_SIZE`].
        limit: u64,
    },
    /// The blocking task parsing a config did not finish (the runtime is shutting down).
    #[error("parsing the image config was aborted: {0}")]
    ParseAborted(String),
    /// No manifest in the index is for the wanted platform.
    #[error("no manifest for platform {wanted} in the image index; it offers: {offered}")]
    NoMatchingPlatform {
        /// The node's platform.
        wanted: String,
        /// The platforms in the index, comma-separated ("none" if empty).
        offered: String,
    },
}

impl ManifestError {
    /// `Err(TooLarge)` if a blob of `size` bytes is over `limit`.
    pub fn check_size(
        what: &'static str,
        digest: &str,
        size: u64,
        limit: u64,
    ) -> Result<(), ManifestError> {
        if size > limit {
            return Err(ManifestError::TooLarge {
                what,
                digest: digest.to_owned(),
                size,
                limit,
            });
        }
        Ok(())
    }
}

impl Manifest {
    /// Parses `data` as the kind `media_type` names. An empty or generic media type (some
    /// registries answer `application/json`) is resolved from the document's own
    /// `mediaType` field, then from its shape.
    pub fn parse(media_type: &str, data: &[u8]) -> Result<Self, ManifestError> {
        let mt = media_type.split(';').next().unwrap_or("").trim();
        if mt == MEDIA_TYPE_DOCKER_SCHEMA1
            || mt == "application/vnd.docker.distribution.manifest.v1+json"
        {
            return Err(ManifestError::Schema1);
        }
        if is_index_media_type(mt) {
            return Self::index(data);
        }
        if is_image_manifest_media_type(mt) {
            return Self::image(data);
        }
        if !(mt.is_empty() || mt == "application/json" || mt == "text/plain") {
            return Err(ManifestError::UnsupportedMediaType(mt.to_owned()));
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Sniff {
            media_type: Option<String>,
            schema_version: Option<u32>,
            manifests: Option<serde_json::Value>,
        }
        let sniff: Sniff = serde_json::from_slice(data).map_err(|source| ManifestError::Json {
            what: "image manifest",
            source,
        })?;
        // The document's own type decides, once: a generic one there again (`application/json`)
        // is no answer, and asking `parse` with it would recurse until the stack overflows.
        let own = sniff
            .media_type
            .as_deref()
            .map(|m| m.split(';').next().unwrap_or("").trim())
            .filter(|m| !(m.is_empty() || *m == "application/json" || *m == "text/plain"));
        match own {
            Some(m) if is_index_media_type(m) => Self::index(data),
            Some(m) if is_image_manifest_media_type(m) => Self::image(data),
            Some(m)
                if m == MEDIA_TYPE_DOCKER_SCHEMA1
                    || m == "application/vnd.docker.distribution.manifest.v1+json" =>
            {
                Err(ManifestError::Schema1)
            }
            Some(m) => Err(ManifestError::UnsupportedMediaType(m.to_owned())),
            _ if sniff.schema_version == Some(1) => Err(ManifestError::Schema1),
            _ if sniff.manifests.is_some() => Self::index(data),
            _ => Self::image(data),
        }
    }

    fn index(data: &[u8]) -> Result<Self, ManifestError> {
        serde_json::from_slice(data)
            .map(Self::Index)
            .map_err(|source| ManifestError::Json {
                what: "image index",
                source,
            })
    }

    fn image(data: &[u8]) -> Result<Self, ManifestError> {
        serde_json::from_slice(data)
            .map(|m| Self::Image(Box::new(m)))
            .map_err(|source| ManifestError::Json {
                what: "image manifest",
                source,
            })
    }
}

/// The image config blob (the parts the runtime uses).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ImageConfig {
    /// CPU architecture.
    #[serde(default)]
    pub architecture: String,
    /// Operating system.
    #[serde(default)]
    pub os: String,
    /// CPU variant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
    /// Creation time (RFC 3339), as the image states it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// Defaults for containers run from the image.
    #[serde(default, deserialize_with = "null_default")]
    pub config: ContainerConfig,
    /// The uncompressed layer digests, base first.
    pub rootfs: RootFs,
}

impl ImageConfig {
    /// Parses a config blob.
    pub fn parse(data: &[u8]) -> Result<Self, ManifestError> {
        serde_json::from_slice(data).map_err(|source| ManifestError::Json {
            what: "image config",
            source,
        })
    }
}

/// `config` of the image config. Docker writes `null` for empty lists and maps, so every
/// collection accepts `null`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
pub struct ContainerConfig {
    /// `user`, `user:group`, `uid` or `uid:gid`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// `KEY=value` entries.
    #[serde(default, deserialize_with = "null_default")]
    pub env: Vec<String>,
    /// Entrypoint.
    #[serde(default, deserialize_with = "null_default")]
    pub entrypoint: Vec<String>,
    /// Command (arguments to the entrypoint).
    #[serde(default, deserialize_with = "null_default")]
    pub cmd: Vec<String>,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// Labels.
    #[serde(default, deserialize_with = "null_default")]
    pub labels: BTreeMap<String, String>,
    /// Exposed ports (`80/tcp`); the values are empty objects.
    #[serde(default, deserialize_with = "null_default")]
    pub exposed_ports: BTreeMap<String, serde_json::Value>,
    /// Volume paths; the values are empty objects.
    #[serde(default, deserialize_with = "null_default")]
    pub volumes: BTreeMap<String, serde_json::Value>,
    /// Signal to stop the container (`SIGTERM`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
}

/// `rootfs` of the image config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct RootFs {
    /// Always `layers`.
    #[serde(rename = "type", default)]
    pub kind: String,
    /// Digests of the uncompressed layers, base first.
    #[serde(default, deserialize_with = "null_default")]
    pub diff_ids: Vec<Digest>,
}

/// `null` → `T::default()`.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// Normalises architecture names the way containerd's `platforms` package does.
pub(crate) fn normalize_arch(arch: &str, variant: Option<&str>) -> (String, Option<String>) {
    let arch = arch.to_ascii_lowercase();
    let variant = variant
        .filter(|v| !v.is_empty())
        .map(str::to_ascii_lowercase);
    match arch.as_str() {
        "i386" => ("386".into(), None),
        "x86_64" | "x86-64" | "amd64" => {
            // v1 is plain amd64.
            ("amd64".into(), variant.filter(|v| v != "v1"))
        }
        "aarch64" | "arm64" => {
            // v8 is the default arm64 variant; "8" and "v8.0" spell it too.
            let v = variant.filter(|v| !matches!(v.as_str(), "8" | "v8" | "v8.0"));
            ("arm64".into(), v)
        }
        "armhf" => ("arm".into(), Some("v7".into())),
        "armel" => ("arm".into(), Some("v6".into())),
        "arm" => {
            let v = match variant.as_deref() {
                None | Some("7") => Some("v7".into()),
                Some("5") | Some("6") | Some("8") => variant.map(|v| format!("v{v}")),
                _ => variant,
            };
            ("arm".into(), v)
        }
        _ => (arch, variant),
    }
}

/// Chooses the manifest for the node's platform from `index`.
///
/// The OS must match (case-insensitively) and the architecture after normalisation
/// (`x86_64` = `amd64`, `aarch64` = `arm64`); the variant must match after normalisation
/// (arm64 without variant = `v8`, arm without variant = `v7`). Entries that are not image
/// manifests (nested indexes, attestations with an `unknown` platform) never match. An entry
/// without a platform is taken only when no entry matches, as containerd sorts them last.
pub fn select_platform<'a>(
    index: &'a ImageIndex,
    os: &str,
    arch: &str,
    variant: Option<&str>,
) -> Result<&'a Descriptor, ManifestError> {
    let want = normalize_arch(arch, variant);
    let manifests = || {
        index
            .manifests
            .iter()
            .filter(|d| is_image_manifest_media_type(&d.media_type))
    };
    let exact = manifests().find(|d| {
        d.platform.as_ref().is_some_and(|p| {
            p.os.eq_ignore_ascii_case(os)
                && normalize_arch(&p.architecture, p.variant.as_deref()) == want
        })
    });
    if let Some(d) = exact.or_else(|| manifests().find(|d| d.platform.is_none())) {
        return Ok(d);
    }
    let mut wanted = format!("{os}/{arch}");
    if let Some(v) = variant.filter(|v| !v.is_empty()) {
        wanted = format!("{wanted}/{v}");
    }
    let offered: Vec<String> = index
        .manifests
        .iter()
        .filter_map(|d| d.platform.as_ref().map(ToString::to_string))
        .collect();
    Err(ManifestError::NoMatchingPlatform {
        wanted,
        offered: if offered.is_empty() {
            "none".into()
        } else {
            offered.join(", ")
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn digest_parse_and_verify() {
        let d = Digest::parse(&format!("sha256:{HEX}")).unwrap();
        assert_eq!(d.hex(), HEX);
        assert!(matches!(
            Digest::parse("sha256:abc"),
            Err(DigestError::Hex(_))
        ));
        assert!(matches!(Digest::parse(HEX), Err(DigestError::Format(_))));
        assert!(matches!(
            Digest::parse(&format!("sha512:{HEX}")),
            Err(DigestError::Algorithm { .. })
        ));
        let hello = Digest::of(b"hello");
        assert_eq!(
            hello.as_str(),
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert!(hello.verify(b"hello").is_ok());
        assert!(matches!(
            hello.verify(b"hullo"),
            Err(VerifyError::Digest { .. })
        ));
    }

    #[test]
    fn streaming_verifier_checks_size_and_digest() {
        let mut v = DigestVerifier::new(Digest::of(b"hello world"), Some(11));
        v.update(b"hello ").unwrap();
        v.update(b"world").unwrap();
        assert_eq!(v.bytes_seen(), 11);
        assert_eq!(v.finish().unwrap(), Digest::of(b"hello world"));

        let mut v = DigestVerifier::new(Digest::of(b"hello"), Some(5));
        assert!(matches!(
            v.update(b"hello!"),
            Err(VerifyError::Size {
                expected: 5,
                actual: 6
            })
        ));

        let mut v = DigestVerifier::new(Digest::of(b"hello"), Some(5));
        v.update(b"hullo").unwrap();
        assert!(matches!(v.finish(), Err(VerifyError::Digest { .. })));

        let mut v = DigestVerifier::new(Digest::of(b"hello"), Some(5));
        v.update(b"hell").unwrap();
        assert!(matches!(v.finish(), Err(VerifyError::Size { .. })));
    }

    fn desc(mt: &str, os: Option<(&str, &str, Option<&str>)>) -> Descriptor {
        Descriptor {
            media_type: mt.into(),
            digest: Digest::of(format!("{os:?}").as_bytes()),
            size: 1,
            platform: os.map(|(os, arch, variant)| Platform {
                os: os.into(),
                architecture: arch.into(),
                variant: variant.map(Into::into),
                ..Default::default()
            }),
            annotations: BTreeMap::new(),
            urls: vec![],
        }
    }

    #[test]
    fn selects_node_platform() {
        let index = ImageIndex {
            schema_version: 2,
            media_type: Some(MEDIA_TYPE_OCI_INDEX.into()),
            manifests: vec![
                desc(MEDIA_TYPE_OCI_MANIFEST, Some(("unknown", "unknown", None))),
                desc(MEDIA_TYPE_OCI_MANIFEST, Some(("linux", "arm", Some("v7")))),
                desc(
                    MEDIA_TYPE_OCI_MANIFEST,
                    Some(("linux", "arm64", Some("v8"))),
                ),
                desc(MEDIA_TYPE_OCI_MANIFEST, Some(("linux", "amd64", None))),
            ],
            annotations: BTreeMap::new(),
        };
        let pick = |os, arch, v| {
            select_platform(&index, os, arch, v)
                .unwrap()
                .platform
                .clone()
                .unwrap()
                .to_string()
        };
        assert_eq!(pick("linux", "amd64", None), "linux/amd64");
        assert_eq!(pick("linux", "x86_64", None), "linux/amd64");
        assert_eq!(pick("linux", "arm64", None), "linux/arm64/v8");
        assert_eq!(pick("linux", "aarch64", None), "linux/arm64/v8");
        assert_eq!(pick("linux", "arm", None), "linux/arm/v7");

        let err = select_platform(&index, "linux", "s390x", None).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("linux/s390x"), "{msg}");
        assert!(
            msg.contains("linux/arm/v7, linux/arm64/v8, linux/amd64"),
            "{msg}"
        );
    }

    #[test]
    fn parses_docker_list_and_manifest_and_config() {
        let list = format!(
            r#"{{"schemaVersion":2,"mediaType":"{MEDIA_TYPE_DOCKER_MANIFEST_LIST}",
            "manifests":[{{"mediaType":"{MEDIA_TYPE_DOCKER_MANIFEST}","digest":"sha256:{HEX}",
            "size":527,"platform":{{"architecture":"amd64","os":"linux"}}}}]}}"#
        );
        // A generic content type is resolved from the document.
        let Manifest::Index(idx) = Manifest::parse("application/json", list.as_bytes()).unwrap()
        else {
            panic!("not an index")
        };
        assert_eq!(idx.manifests[0].size, 527);

        let man = format!(
            r#"{{"schemaVersion":2,"mediaType":"{MEDIA_TYPE_DOCKER_MANIFEST}",
            "config":{{"mediaType":"{MEDIA_TYPE_DOCKER_CONFIG}","digest":"sha256:{HEX}","size":1}},
            "layers":[{{"mediaType":"{MEDIA_TYPE_DOCKER_LAYER_GZIP}","digest":"sha256:{HEX}","size":2}}]}}"#
        );
        let Manifest::Image(m) =
            Manifest::parse(MEDIA_TYPE_DOCKER_MANIFEST, man.as_bytes()).unwrap()
        else {
            panic!("not a manifest")
        };
        assert_eq!(m.layers.len(), 1);
        assert!(matches!(
            Manifest::parse(MEDIA_TYPE_DOCKER_SCHEMA1, b"{}"),
            Err(ManifestError::Schema1)
        ));
        assert!(matches!(
            Manifest::parse("text/html", b"{}"),
            Err(ManifestError::UnsupportedMediaType(_))
        ));

        let cfg = format!(
            r#"{{"architecture":"amd64","os":"linux","config":{{"User":"1000:1000",
            "Env":["PATH=/bin"],"Entrypoint":null,"Cmd":["sh"],"WorkingDir":"/w",
            "Labels":null,"ExposedPorts":{{"80/tcp":{{}}}},"Volumes":{{"/data":{{}}}},
            "StopSignal":"SIGQUIT"}},"rootfs":{{"type":"layers","diff_ids":["sha256:{HEX}"]}}}}"#
        );
        let c = ImageConfig::parse(cfg.as_bytes()).unwrap();
        assert_eq!(c.config.user.as_deref(), Some("1000:1000"));
        assert!(c.config.entrypoint.is_empty());
        assert_eq!(c.config.cmd, vec!["sh"]);
        assert!(c.config.labels.is_empty());
        assert!(c.config.exposed_ports.contains_key("80/tcp"));
        assert_eq!(c.config.stop_signal.as_deref(), Some("SIGQUIT"));
        assert_eq!(c.rootfs.diff_ids.len(), 1);
        assert!(ImageConfig::parse(br#"{"rootfs":{"diff_ids":["bad"]}}"#).is_err());
    }
}
