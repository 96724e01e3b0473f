#!/usr/bin/env python3
"""Push a fresh image with random layer content to the test bed registry, for benchmarks.

Usage: push_random.py REPO [--layers N] [--layer-kb KB] [--gzip-level L] [--config-kb KB]
                          [--registry URL]

Every run pushes content no runtime has seen (os.urandom), so a pull of it really fetches
every blob. The layers are gzip'ed tar files holding one random (incompressible) file each.
--config-kb pads the image config to about that size with build history entries of random
text (the part of a config that grows with an image's build steps, and that a runtime
reads but keeps nothing of). Prints one JSON object: {"repository", "tag", "manifest",
"config", "config_size", "layers": [digests], "bytes": total blob bytes}.
Standard library only; reuses build_push.py's registry client.
"""

import argparse
import gzip
import io
import json
import os
import sys
import tarfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_push import Registry, sha256  # noqa: E402

MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"


def layer(index, size, level):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        data = os.urandom(size)
        info = tarfile.TarInfo("bench/layer%d.bin" % index)
        info.size = len(data)
        info.mtime = 0
        tar.addfile(info, io.BytesIO(data))
    tar_bytes = raw.getvalue()
    return tar_bytes, gzip.compress(tar_bytes, compresslevel=level, mtime=0)


def history(kb):
    """Build history entries of random text, about kb KiB in all."""
    entries, left = [], kb * 1024
    while left > 0:
        n = min(left, 64 * 1024)
        entries.append({"created": "2024-01-01T00:00:00Z",
                        "created_by": "/bin/sh -c echo " + os.urandom(n // 2).hex()})
        left -= n
    return entries


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--layer-kb", type=int, default=2048)
    ap.add_argument("--registry", default="http://127.0.0.1:5000")
    ap.add_argument("--tag", default="v1")
    ap.add_argument("--gzip-level", type=int, default=9)
    ap.add_argument("--config-kb", type=int, default=0)
    args = ap.parse_args()

    reg = Registry(args.registry)
    layers, diff_ids = [], []
    for i in range(args.layers):
        tar_bytes, gz = layer(i, args.layer_kb * 1024, args.gzip_level)
        digest = sha256(gz)
        reg.push_blob(args.repo, digest, gz)
        layers.append({"mediaType": MT_LAYER, "digest": digest, "size": len(gz)})
        diff_ids.append(sha256(tar_bytes))
    config = {
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": ["/bin/true"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    if args.config_kb > 0:
        config["history"] = history(args.config_kb)
    config = json.dumps(config, sort_keys=True).encode()
    config_digest = sha256(config)
    reg.push_blob(args.repo, config_digest, config)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MT_MANIFEST,
        "config": {"mediaType": MT_CONFIG, "digest": config_digest, "size": len(config)},
        "layers": layers,
    }, sort_keys=True).encode()
    reg.put_manifest(args.repo, args.tag, manifest, MT_MANIFEST)
    print(json.dumps({
        "repository": args.repo, "tag": args.tag, "manifest": sha256(manifest),
        "config": config_digest, "config_size": len(config),
        "layers": [l["digest"] for l in layers],
        "bytes": len(manifest) + len(config) + sum(l["size"] for l in layers),
    }))


if __name__ == "__main__":
    main()
