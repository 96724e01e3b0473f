#!/usr/bin/env python3
"""Build the remora test bed images from local files and push them to the
local registry (distribution v2 HTTP API). Standard library only.

Usage: build_push.py [--registry http://127.0.0.1:5000] [--spec images.json]
                     [--cache DIR] [--only NAME_SUBSTRING] [--dry-run]

The spec (images.json next to this file) declares named layers and images.
Each image is built as gzip'ed tar layers, an OCI image config, an OCI
manifest and an OCI image index with a single linux/amd64 entry, then pushed
under each of its public names. A public name maps to the registry repository
"name without its registry host" (registry.k8s.io/pause:3.10 -> pause:3.10,
docker.io/library/busybox -> library/busybox), which is what containerd asks
for when hosts.toml points a registry host at the local registry.

Everything is deterministic (sorted entries, fixed mtimes, uid/gid 0, gzip
without timestamps, canonical JSON), so a re-run produces the same digests and
skips every push whose tag already points at the right index.

A spec may name other specs in "layers_from" (file names beside it) to use
their layers; only its own images are built.

Layer entry types (all paths are inside the image, without a leading "/"):
  {"dir": P, "mode": "0755"}
  {"file": P, "lines": [TEXT...] | "content": TEXT | "src": HOSTPATH,
   "mode": "0644"}
  {"symlink": P, "target": T}
  {"c_static": P, "src": FILE.c, "mode": "0755"}  # gcc -static -O2 -s
  {"elf": P, "src": HOSTPATH}  # the binary plus the shared libraries ldd lists
  {"busybox_applets": DIR, "binary": HOSTPATH, "exclude": [...],
   "hardlinks": false}          # DIR/<applet> -> busybox for each applet
  {"hardlink": P, "target": T}  # T is a path inside the image
  {"tree": P, "src": HOSTDIR, "libs": true}
                                # HOSTDIR's regular files and symlinks, recursively, at P; with
                                # "libs", the shared libraries ldd lists for each file too
Applets are symlinks unless "hardlinks" is true. Hard links matter where a
runtime masks one applet (critest masks /bin/ls): masking a symlink masks
the busybox binary it points to, and with it every applet.
"src" strings may use ${TOOLS} (REMORA_TOOLS_DIR) and ${HERE} (this directory).
Parent directories are added as 0755 when not declared.
"""

import argparse
import gzip
import hashlib
import io
import json
import os
import re
import string
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
# Fixed timestamp for tar entries and configs: 2024-01-01T00:00:00Z. Not 0,
# because some tools treat a zero mtime as "unknown".
EPOCH = 1704067200
CREATED = "2024-01-01T00:00:00Z"
DEFAULT_PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

MT_INDEX = "application/vnd.oci.image.index.v1+json"
MT_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MT_CONFIG = "application/vnd.oci.image.config.v1+json"
MT_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_KEYS = ("Entrypoint", "Cmd", "Env", "User", "WorkingDir", "Labels",
               "ExposedPorts", "StopSignal", "Volumes")


def log(msg):
    print("build_push.py: " + msg, file=sys.stderr, flush=True)


def canonical_json(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def sha256(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


class Builder:
    def __init__(self, spec, cache_dir, tools_dir):
        self.spec = spec
        self.cache_dir = cache_dir
        self.vars = {"TOOLS": tools_dir, "HERE": HERE}
        self.layer_cache = {}

    def expand(self, s):
        return string.Template(s).substitute(self.vars)

    # ---- layer contents ----------------------------------------------------

    def compile_static(self, src):
        """gcc -static; cached by source hash so re-runs skip the compiler."""
        path = os.path.join(HERE, src)
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()[:16]
        out = os.path.join(self.cache_dir, "%s-%s" % (os.path.basename(src), digest))
        if not os.path.exists(out):
            os.makedirs(self.cache_dir, exist_ok=True)
            tmp = out + ".tmp"
            subprocess.run(["gcc", "-static", "-O2", "-s", "-o", tmp, path], check=True)
            os.replace(tmp, out)
        return out

    @staticmethod
    def ldd(binary):
        """(path in image, host file) for each shared library of binary."""
        res = subprocess.run(["ldd", binary], capture_output=True, text=True)
        if res.returncode != 0:
            if "not a dynamic executable" in res.stdout + res.stderr:
                return []
            raise RuntimeError("ldd %s failed: %s" % (binary, res.stderr.strip()))
        libs = []
        for line in res.stdout.splitlines():
            line = line.strip()
            m = re.match(r"^\S+ => (/\S+) \(0x[0-9a-f]+\)$", line)
            if not m:
                m = re.match(r"^(/\S+) \(0x[0-9a-f]+\)$", line)  # the loader
            if m:
                libs.append((m.group(1).lstrip("/"), m.group(1)))
            elif "=> not found" in line:
                raise RuntimeError("ldd %s: %s" % (binary, line))
        return libs

    @staticmethod
    def applets(binary):
        out = subprocess.run([binary, "--list"], capture_output=True, text=True, check=True).stdout
        return sorted(set(out.split()))

    def layer_entries(self, name):
        """dict path -> (kind, mode, payload) for a named layer."""
        entries = {}

        def add(path, kind, mode, payload):
            path = path.strip("/")
            if not path:
                raise ValueError("layer %s: empty path" % name)
            old = entries.get(path)
            if old and old != (kind, mode, payload):
                # The same library pulled in by two binaries is fine; real
                # conflicts are spec errors.
                raise ValueError("layer %s: conflicting entries for /%s" % (name, path))
            entries[path] = (kind, mode, payload)

        def read(path):
            with open(path, "rb") as f:
                return f.read()

        for e in self.spec["layers"][name]:
            mode = int(e["mode"], 8) if "mode" in e else None
            if "dir" in e:
                add(e["dir"], "dir", 0o755 if mode is None else mode, None)
            elif "file" in e:
                if "lines" in e:
                    data = "".join(line + "\n" for line in e["lines"]).encode()
                elif "content" in e:
                    data = e["content"].encode()
                else:
                    data = read(self.expand(e["src"]))
                add(e["file"], "file", 0o644 if mode is None else mode, data)
            elif "symlink" in e:
                add(e["symlink"], "symlink", 0o777, e["target"])
            elif "hardlink" in e:
                add(e["hardlink"], "hardlink", 0o755, e["target"].strip("/"))
            elif "c_static" in e:
                binary = self.compile_static(e["src"])
                add(e["c_static"], "file", 0o755 if mode is None else mode, read(binary))
            elif "elf" in e:
                src = self.expand(e["src"])
                add(e["elf"], "file", 0o755 if mode is None else mode, read(src))
                for path, host in self.ldd(src):
                    add(path, "file", 0o755, read(os.path.realpath(host)))
            elif "tree" in e:
                top = self.expand(e["src"])
                for root, dirs, files in os.walk(top):
                    dirs.sort()
                    rel = os.path.relpath(root, top)
                    base = e["tree"].strip("/") if rel == "." else e["tree"].strip("/") + "/" + rel
                    for f in sorted(files):
                        host = os.path.join(root, f)
                        if os.path.islink(host):
                            add(base + "/" + f, "symlink", 0o777, os.readlink(host))
                        elif os.path.isfile(host):
                            add(base + "/" + f, "file", os.stat(host).st_mode & 0o777, read(host))
                            if e.get("libs"):
                                for path, lib in self.ldd(host):
                                    add(path, "file", 0o755, read(os.path.realpath(lib)))
            elif "busybox_applets" in e:
                d = e["busybox_applets"].strip("/")
                skip = set(e.get("exclude", []))
                hard = e.get("hardlinks", False)
                for applet in self.applets(self.expand(e["binary"])):
                    if applet in skip or applet == "busybox":
                        continue
                    if hard:
                        add(d + "/" + applet, "hardlink", 0o755, d + "/busybox")
                    else:
                        add(d + "/" + applet, "symlink", 0o777, "busybox")
            else:
                raise ValueError("layer %s: unknown entry %r" % (name, e))

        # Declare every parent directory so the tar is self-contained.
        for path in list(entries):
            parts = path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                entries.setdefault("/".join(parts[:i]), ("dir", 0o755, None))
        return entries

    def build_layer(self, name):
        """(gzip blob, diff_id) for a named layer; built once per run."""
        if name in self.layer_cache:
            return self.layer_cache[name]
        entries = self.layer_entries(name)
        raw = io.BytesIO()
        with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
            # Sorted by path, hard links last: a link needs its target first.
            for path in sorted(entries, key=lambda p: (entries[p][0] == "hardlink", p)):
                kind, mode, payload = entries[path]
                info = tarfile.TarInfo(path)
                info.mtime = EPOCH
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                info.mode = mode
                if kind == "dir":
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                elif kind == "symlink":
                    info.type = tarfile.SYMTYPE
                    info.linkname = payload
                    tar.addfile(info)
                elif kind == "hardlink":
                    if entries.get(payload, ("",))[0] != "file":
                        raise ValueError("layer %s: hard link /%s to /%s, which is not a file in the layer" % (name, path, payload))
                    info.type = tarfile.LNKTYPE
                    info.linkname = payload
                    tar.addfile(info)
                else:
                    info.size = len(payload)
                    tar.addfile(info, io.BytesIO(payload))
        raw = raw.getvalue()
        blob = gzip.compress(raw, compresslevel=6, mtime=0)
        self.layer_cache[name] = (blob, sha256(raw))
        return self.layer_cache[name]

    # ---- image -------------------------------------------------------------

    def build_image(self, image):
        """Returns (blobs {digest: bytes}, manifest bytes, index bytes)."""
        blobs = {}
        layers = []
        diff_ids = []
        history = []
        for lname in image["layers"]:
            blob, diff_id = self.build_layer(lname)
            digest = sha256(blob)
            blobs[digest] = blob
            layers.append({"mediaType": MT_LAYER, "digest": digest, "size": len(blob)})
            diff_ids.append(diff_id)
            history.append({"created": CREATED, "created_by": "remora build_push.py: layer " + lname})
        cfg = dict(image.get("config", {}))
        unknown = set(cfg) - set(CONFIG_KEYS)
        if unknown:
            raise ValueError("image %s: unknown config keys %s" % (image["names"][0], sorted(unknown)))
        cfg.setdefault("Env", [DEFAULT_PATH_ENV])
        config = {
            "created": CREATED,
            "architecture": "amd64",
            "os": "linux",
            "config": cfg,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
            "history": history,
        }
        config_blob = canonical_json(config)
        config_digest = sha256(config_blob)
        blobs[config_digest] = config_blob
        manifest = canonical_json({
            "schemaVersion": 2,
            "mediaType": MT_MANIFEST,
            "config": {"mediaType": MT_CONFIG, "digest": config_digest, "size": len(config_blob)},
            "layers": layers,
        })
        index = canonical_json({
            "schemaVersion": 2,
            "mediaType": MT_INDEX,
            "manifests": [{
                "mediaType": MT_MANIFEST,
                "digest": sha256(manifest),
                "size": len(manifest),
                "platform": {"architecture": "amd64", "os": "linux"},
            }],
        })
        return blobs, manifest, index


def split_name(name):
    """Public image name -> (repository, tag) in the local registry."""
    if "@" in name:
        raise ValueError("%s: digest references cannot be built locally" % name)
    first, sep, rest = name.partition("/")
    if not sep or not ("." in first or ":" in first or first == "localhost"):
        raise ValueError("%s: name must start with a registry host" % name)
    repo, _, tag = rest.rpartition(":") if ":" in rest else (rest, "", "latest")
    if not tag:
        tag = "latest"
    return repo, tag


class Registry:
    def __init__(self, url):
        self.url = url.rstrip("/")
        self.blob_home = {}  # digest -> a repository that already has it

    def request(self, method, path, data=None, headers=None, full_url=None):
        req = urllib.request.Request(full_url or self.url + path, data=data,
                                     method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    def has_blob(self, repo, digest):
        status, _, _ = self.request("HEAD", "/v2/%s/blobs/%s" % (repo, digest))
        return status == 200

    def push_blob(self, repo, digest, data):
        if self.has_blob(repo, digest):
            self.blob_home.setdefault(digest, repo)
            return
        home = self.blob_home.get(digest)
        if home and home != repo:
            # Cross-repository mount: no upload when another repo has it.
            status, _, _ = self.request("POST", "/v2/%s/blobs/uploads/?mount=%s&from=%s" % (repo, digest, home))
            if status == 201:
                return
        status, headers, body = self.request("POST", "/v2/%s/blobs/uploads/" % repo)
        if status != 202:
            raise RuntimeError("POST upload %s: HTTP %d %s" % (repo, status, body[:200]))
        location = headers["Location"]
        if location.startswith("/"):
            location = self.url + location
        sep = "&" if "?" in location else "?"
        status, _, body = self.request(
            "PUT", None, data=data, full_url="%s%sdigest=%s" % (location, sep, digest),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(len(data))})
        if status != 201:
            raise RuntimeError("PUT blob %s %s: HTTP %d %s" % (repo, digest, status, body[:200]))
        self.blob_home.setdefault(digest, repo)

    def manifest_digest(self, repo, ref):
        status, headers, _ = self.request(
            "HEAD", "/v2/%s/manifests/%s" % (repo, ref),
            headers={"Accept": ", ".join([MT_INDEX, MT_MANIFEST])})
        return headers.get("Docker-Content-Digest") if status == 200 else None

    def put_manifest(self, repo, ref, data, media_type):
        status, _, body = self.request("PUT", "/v2/%s/manifests/%s" % (repo, ref), data=data,
                                       headers={"Content-Type": media_type})
        if status != 201:
            raise RuntimeError("PUT manifest %s:%s: HTTP %d %s" % (repo, ref, status, body[:300]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--registry", default="http://127.0.0.1:5000")
    ap.add_argument("--spec", default=os.path.join(HERE, "images.json"))
    tools = os.environ.get("REMORA_TOOLS_DIR", "/var/tmp/remora-tools")
    ap.add_argument("--cache", default=os.path.join(tools, "images-cache"))
    ap.add_argument("--only", help="only images with a name containing this")
    ap.add_argument("--dry-run", action="store_true", help="build and print digests, push nothing")
    args = ap.parse_args()

    with open(args.spec) as f:
        spec = json.load(f)
    # "layers_from": other specs (beside this one) whose layers this spec's images may use; a
    # layer this spec defines itself wins. Their images are not built.
    for other in spec.get("layers_from", []):
        with open(os.path.join(os.path.dirname(os.path.abspath(args.spec)), other)) as f:
            for name, entries in json.load(f)["layers"].items():
                spec["layers"].setdefault(name, entries)
    builder = Builder(spec, args.cache, tools)
    registry = Registry(args.registry)

    # One repository:tag must not be claimed by two different images.
    owner = {}
    for image in spec["images"]:
        for name in image["names"]:
            key = split_name(name)
            if key in owner and owner[key] is not image:
                raise SystemExit("build_push.py: %s:%s is claimed by two images (%s)" % (key + (name,)))
            owner[key] = image

    pushed = skipped = 0
    for image in spec["images"]:
        if args.only and not any(args.only in n for n in image["names"]):
            continue
        blobs, manifest, index = builder.build_image(image)
        index_digest = sha256(index)
        targets = sorted({split_name(n) for n in image["names"]})
        if args.dry_run:
            print("%s %s" % (index_digest, " ".join(image["names"])))
            continue
        for repo, tag in targets:
            if registry.manifest_digest(repo, tag) == index_digest:
                skipped += 1
                continue
            for digest in sorted(blobs):
                registry.push_blob(repo, digest, blobs[digest])
            registry.put_manifest(repo, sha256(manifest), manifest, MT_MANIFEST)
            registry.put_manifest(repo, tag, index, MT_INDEX)
            got = registry.manifest_digest(repo, tag)
            if got != index_digest:
                raise SystemExit("build_push.py: %s:%s has %s after push, expected %s" % (repo, tag, got, index_digest))
            log("pushed %s:%s (%s)" % (repo, tag, index_digest))
            pushed += 1
    if not args.dry_run:
        log("%d tags pushed, %d already up to date" % (pushed, skipped))


if __name__ == "__main__":
    main()
