#!/usr/bin/env python3
"""Push a fresh image with random layer content to the test bed registry, for benchmarks.

Usage: push_random.py REPO [--layers N] [--layer-kb KB] [--registry URL]

Every run pushes content no runtime has seen (os.urandom), so a pull of it really fetches
every blob. The layers are gzip'ed tar files holding one random file each. Prints one JSON
object: {"repository", "tag", "manifest", "config", "layers": [digests]}.
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


def layer(index, size):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
        data = os.urandom(size)
        info = tarfile.TarInfo("bench/layer%d.bin" % index)
        info.size = len(data)
        info.mtime = 0
        tar.addfile(info, io.BytesIO(data))
    tar_bytes = raw.getvalue()
    return tar_bytes, gzip.compress(tar_bytes, mtime=0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("repo")
    ap.add_argument("--layers", type=int, default=5)
    ap.add_argument("--layer-kb", type=int, default=2048)
    ap.add_argument("--registry", default="http://127.0.0.1:5000")
    ap.add_argument("--tag", default="v1")
    args = ap.parse_args()

    reg = Registry(args.registry)
    layers, diff_ids = [], []
    for i in range(args.layers):
        tar_bytes, gz = layer(i, args.layer_kb * 1024)
        digest = sha256(gz)
        reg.push_blob(args.repo, digest, gz)
        layers.append({"mediaType": MT_LAYER, "digest": digest, "size": len(gz)})
        diff_ids.append(sha256(tar_bytes))
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": ["/bin/true"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }, sort_keys=True).encode()
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
        "config": config_digest, "layers": [l["digest"] for l in layers],
    }))


if __name__ == "__main__":
    main()
