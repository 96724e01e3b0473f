//! The layers of the differential applier test (`apply.rs`): generated ones, built byte by
//! byte (so hostile and malformed ones can be), and the test bed registry's.

use std::collections::BTreeSet;

use crate::testbed::TESTBED_REGISTRY;

/// The media type of the generated layers (all gzip).
pub const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// A ustar header (the fields the generated layers use).
#[allow(clippy::too_many_arguments)]
fn header(
    flag: u8,
    name: &[u8],
    link: &[u8],
    mode: u32,
    owner: (u32, u32),
    size: usize,
    dev: (u32, u32),
    mtime: u64,
) -> [u8; 512] {
    let mut b = [0u8; 512];
    let octal = |f: &mut [u8], v: u64| {
        let s = format!("{:0w$o}\0", v, w = f.len() - 1);
        f.copy_from_slice(s.as_bytes());
    };
    b[..name.len()].copy_from_slice(name);
    octal(&mut b[100..108], u64::from(mode));
    octal(&mut b[108..116], u64::from(owner.0));
    octal(&mut b[116..124], u64::from(owner.1));
    octal(&mut b[124..136], size as u64);
    octal(&mut b[136..148], mtime);
    b[156] = flag;
    b[157..157 + link.len()].copy_from_slice(link);
    b[257..263].copy_from_slice(b"ustar\0");
    b[263..265].copy_from_slice(b"00");
    octal(&mut b[329..337], u64::from(dev.0));
    octal(&mut b[337..345], u64::from(dev.1));
    checksum(&mut b);
    b
}

fn checksum(b: &mut [u8; 512]) {
    b[148..156].copy_from_slice(b"        ");
    let sum: u64 = b.iter().map(|c| u64::from(*c)).sum();
    b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
}

/// A layer being generated.
#[derive(Default)]
struct Gen(Vec<u8>);

const T: u64 = 1_600_000_000;

impl Gen {
    fn raw(&mut self, block: [u8; 512], data: &[u8]) -> &mut Self {
        self.0.extend_from_slice(&block);
        self.0.extend_from_slice(data);
        self.0.resize(self.0.len().div_ceil(512) * 512, 0);
        self
    }
    fn file(&mut self, name: &str, data: &[u8], mode: u32, owner: (u32, u32)) -> &mut Self {
        let h = header(
            b'0',
            name.as_bytes(),
            b"",
            mode,
            owner,
            data.len(),
            (0, 0),
            T,
        );
        self.raw(h, data)
    }
    fn dir(&mut self, name: &str, mode: u32, owner: (u32, u32)) -> &mut Self {
        self.raw(
            header(b'5', name.as_bytes(), b"", mode, owner, 0, (0, 0), T),
            b"",
        )
    }
    fn link(&mut self, flag: u8, name: &str, target: &str) -> &mut Self {
        let h = header(
            flag,
            name.as_bytes(),
            target.as_bytes(),
            0o777,
            (0, 0),
            0,
            (0, 0),
            T + 1,
        );
        self.raw(h, b"")
    }
    fn node(&mut self, flag: u8, name: &str, dev: (u32, u32), mode: u32) -> &mut Self {
        self.raw(
            header(flag, name.as_bytes(), b"", mode, (0, 0), 0, dev, T),
            b"",
        )
    }
    fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Self {
        let mut out = Vec::new();
        for (k, v) in records {
            let body = k.len() + v.len() + 3;
            let mut len = body + body.to_string().len();
            if len.to_string().len() != body.to_string().len() {
                len += 1;
            }
            out.extend_from_slice(format!("{len} {k}=").as_bytes());
            out.extend_from_slice(v);
            out.push(b'\n');
        }
        let h = header(
            b'x',
            b"PaxHeaders/x",
            b"",
            0o644,
            (0, 0),
            out.len(),
            (0, 0),
            T,
        );
        self.raw(h, &out)
    }
    fn gzip(&self) -> Vec<u8> {
        use std::io::Write;
        let mut tar = self.0.clone();
        tar.extend_from_slice(&[0u8; 1024]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar).expect("gzip");
        gz.finish().expect("gzip")
    }
}

/// The parent every layer is also applied onto.
pub fn base_layer() -> Vec<u8> {
    let mut g = Gen::default();
    g.dir("etc", 0o755, (0, 0))
        .file("etc/conf", b"base", 0o644, (0, 0))
        .dir("opq", 0o755, (0, 0))
        .file("opq/old1", b"1", 0o644, (0, 0))
        .dir("opq/sub", 0o755, (0, 0))
        .file("opq/sub/old2", b"2", 0o644, (0, 0))
        .file("gone", b"g", 0o644, (0, 0))
        .dir("gonedir", 0o755, (0, 0))
        .file("gonedir/x", b"x", 0o644, (0, 0))
        .pax(&[("SCHILY.xattr.user.origin", b"base")])
        .dir("usr", 0o755, (0, 0))
        .dir("usr/lib", 0o700, (5, 6));
    g.gzip()
}

/// The generated layers, by name.
pub fn generated() -> Vec<(&'static str, Vec<u8>)> {
    let cap: &[u8] = &[1, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let mut out = Vec::new();
    let mut g = Gen::default();
    g.dir("a", 0o750, (1000, 1001))
        .file("a/f", b"hello", 0o4755, (1000, 1001))
        .link(b'2', "a/l", "f")
        .link(b'1', "a/h", "a/f")
        .node(b'3', "a/c", (1, 3), 0o666)
        .node(b'4', "a/b", (7, 0), 0o660)
        .node(b'6', "a/p", (0, 0), 0o600)
        .dir("tmp", 0o1777, (0, 0))
        .pax(&[
            ("mtime", b"1300000000.123456789"),
            ("atime", b"1400000000.5"),
            ("uid", b"70000"),
            ("SCHILY.xattr.user.comment", b"hi"),
            ("SCHILY.xattr.security.capability", cap),
            ("SCHILY.xattr.trusted.evil", b"1"),
        ])
        .file("a/pax", b"x", 0o755, (0, 0));
    out.push(("kinds", g.gzip()));
    let mut g = Gen::default();
    g.file(".wh.gone", b"", 0o644, (0, 0))
        .file(".wh.gonedir", b"", 0o644, (0, 0))
        .file(".wh.absent", b"", 0o644, (0, 0))
        .dir("opq", 0o711, (0, 0))
        .file("opq/.wh..wh..opq", b"", 0o644, (0, 0))
        .file("opq/new", b"n", 0o644, (0, 0));
    out.push(("whiteouts", g.gzip()));
    let mut g = Gen::default();
    g.file("usr/lib/deep/file", b"deep", 0o644, (0, 0))
        .file("etc/new", b"e", 0o600, (0, 0));
    out.push(("parents-not-listed", g.gzip()));
    let mut g = Gen::default();
    g.file("../../etc/x", b"1", 0o644, (0, 0))
        .file("/abs/path", b"2", 0o644, (0, 0))
        .file("a/../../../b", b"3", 0o644, (0, 0));
    out.push(("dot-dot-and-absolute", g.gzip()));
    let mut g = Gen::default();
    g.link(b'2', "s", "/")
        .file("s/x", b"via /", 0o644, (0, 0))
        .link(b'2', "up", "../../..")
        .file("up/y", b"via ..", 0o644, (0, 0))
        .link(b'2', "c1", "c2")
        .link(b'2', "c2", "/nowhere/deeper")
        .file("c1/z", b"chain", 0o644, (0, 0));
    out.push(("symlinked-parents", g.gzip()));
    let mut g = Gen::default();
    g.dir("d", 0o755, (0, 0))
        .file("d/child", b"c", 0o644, (0, 0))
        .file("d", b"now a file", 0o644, (0, 0))
        .file("f", b"f", 0o644, (0, 0))
        .dir("f", 0o711, (0, 0))
        .file("f/in", b"i", 0o644, (0, 0))
        .dir("m", 0o700, (0, 0))
        .file("m/keep", b"k", 0o644, (0, 0))
        .dir("m", 0o755, (3, 3))
        .file("dup", b"first", 0o600, (0, 0))
        .file("dup", b"second", 0o640, (0, 0));
    out.push(("replace-and-duplicates", g.gzip()));
    let mut g = Gen::default();
    g.link(b'2', "s", "/etc/passwd")
        .link(b'1', "hs", "s")
        .link(b'2', "ds", "etc")
        .file("etc/f", b"f", 0o644, (0, 0))
        .link(b'1', "hf", "ds/f");
    out.push(("hard-links-to-symlinks", g.gzip()));
    let mut g = Gen::default();
    g.link(b'1', "h", "../outside/marker");
    out.push(("hard-link-outside", g.gzip()));
    let mut g = Gen::default();
    g.link(b'2', "l1", "l2")
        .link(b'2', "l2", "l1")
        .file("l1/x", b"", 0o644, (0, 0));
    out.push(("symlink-loop", g.gzip()));
    let mut g = Gen::default();
    let mut h = header(b'0', b"neg", b"", 0o644, (0, 0), 0, (0, 0), T);
    h[108] = 0xff;
    h[109..116].fill(0xff);
    checksum(&mut h);
    g.raw(h, b"");
    out.push(("uid-minus-one", g.gzip()));
    let mut data = vec![0u8; 1 << 20];
    data[300_000] = 7;
    let mut g = Gen::default();
    g.file("sparse", &data, 0o644, (0, 0))
        .dir("./", 0o700, (0, 0))
        .pax(&[("mtime", b"-100")])
        .file("old", b"o", 0o644, (0, 0));
    out.push(("zeros-root-entry-old-time", g.gzip()));
    let mut g = Gen::default();
    let long = format!("{}/f", "d".repeat(200));
    let mut name = long.into_bytes();
    name.push(0);
    let mut h = header(
        b'L',
        b"././@LongLink",
        b"",
        0o644,
        (0, 0),
        name.len(),
        (0, 0),
        T,
    );
    h[257..265].copy_from_slice(b"ustar  \0");
    checksum(&mut h);
    g.raw(h, &name).file("short", b"long", 0o644, (0, 0));
    out.push(("gnu-long-name", g.gzip()));
    out
}

/// The layers of every image in the test bed registry (this host's platform), by digest.
/// The registry repositories of the test bed's images (scripts/images/images.json): each
/// name without its registry host and tag, as the test bed pushes them.
fn testbed_repositories() -> BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/images/images.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let spec: serde_json::Value = serde_json::from_str(&text).expect("images.json");
    let images = spec
        .as_array()
        .or_else(|| spec["images"].as_array())
        .expect("images.json lists images");
    let repos: BTreeSet<String> = images
        .iter()
        .flat_map(|i| i["names"].as_array().into_iter().flatten())
        .filter_map(|n| n.as_str())
        .map(|name| {
            let name = name.split('@').next().unwrap_or(name);
            let (host, rest) = name.split_once('/').unwrap_or(("", name));
            let rest = if host.contains('.') || host.contains(':') {
                rest
            } else {
                name
            };
            // The tag: after the last ':' of the last component.
            match rest.rsplit_once(':') {
                Some((repo, tag)) if !tag.contains('/') => repo.to_string(),
                _ => rest.to_string(),
            }
        })
        .collect();
    assert!(repos.len() > 5, "images.json named only {repos:?}");
    repos
}

pub async fn registry_layers() -> Vec<(String, String, Vec<u8>)> {
    const ACCEPT: &str = "application/vnd.oci.image.index.v1+json, \
        application/vnd.docker.distribution.manifest.list.v2+json, \
        application/vnd.oci.image.manifest.v1+json, \
        application/vnd.docker.distribution.manifest.v2+json";
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let http = reqwest::Client::new();
    let base = format!("http://{TESTBED_REGISTRY}/v2");
    let get = |url: String| {
        let http = http.clone();
        async move {
            let r = http.get(&url).header("Accept", ACCEPT).send().await;
            let r = r.unwrap_or_else(|e| panic!("{url}: {e}"));
            assert!(r.status().is_success(), "{url}: {}", r.status());
            r.bytes().await.expect("body").to_vec()
        }
    };
    let json = |b: Vec<u8>| serde_json::from_slice::<serde_json::Value>(&b).expect("json");
    let catalog = json(get(format!("{base}/_catalog?n=1000")).await);
    let ours = testbed_repositories();
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for repo in catalog["repositories"].as_array().into_iter().flatten() {
        let repo = repo.as_str().expect("repo");
        // The test bed's own images only: the registry also holds what other runs pushed
        // (the cluster's control plane, generated layers), which would make the corpus, and
        // this test's time, depend on what ran before.
        if !ours.contains(repo) {
            continue;
        }
        let tags = json(get(format!("{base}/{repo}/tags/list")).await);
        for tag in tags["tags"].as_array().into_iter().flatten() {
            let tag = tag.as_str().expect("tag");
            let mut m = json(get(format!("{base}/{repo}/manifests/{tag}")).await);
            if let Some(list) = m["manifests"].as_array() {
                let Some(pick) = list.iter().find(|d| {
                    d["platform"]["os"] == "linux" && d["platform"]["architecture"] == arch
                }) else {
                    continue;
                };
                let digest = pick["digest"].as_str().expect("digest");
                m = json(get(format!("{base}/{repo}/manifests/{digest}")).await);
            }
            for layer in m["layers"].as_array().into_iter().flatten() {
                let digest = layer["digest"].as_str().expect("digest").to_string();
                if seen.insert(digest.clone()) {
                    let media = layer["mediaType"].as_str().unwrap_or(GZIP).to_string();
                    let data = get(format!("{base}/{repo}/blobs/{digest}")).await;
                    out.push((digest, media, data));
                }
            }
        }
    }
    out
}
