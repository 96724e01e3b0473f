#!/usr/bin/env python3
"""Import circles among a crate's modules, from the text of its sources.

Usage: scripts/import_circles.py [SRC_DIR]   (default: src)

Reads every module file (test files and inline `#[cfg(test)] mod tests` left out, comments
dropped), collects the paths it names (`crate::a::b`, `super::x`, `use crate::{a, b}`, a
relative `use child::...` of its own `mod child;`), resolves each to the deepest module file
that exists, and prints the strongly connected components of two graphs:

- the top-level modules of the crate (`crate::a::x` and `crate::b::y` collapse to `a`, `b`);
- for each directory, its direct submodules (an edge between `d::a::...` and `d::b::...`).

For each circle it prints, per edge, the items one side takes from the other, so the fix
(moving the shared items to the module both use) can be read off. A child naming its parent
(`super::Item`) is how a submodule uses the module it belongs to, and does not count.
Exit status 1 when it finds a circle (scripts/test.sh's lint phase runs it as a gate), else 0.
"""
import os
import re
import sys

ROOT = sys.argv[1] if len(sys.argv) > 1 else "src"


def modpath(f):
    parts = os.path.relpath(f, ROOT)[:-3].split("/")
    if parts[-1] in ("lib", "main"):
        parts = parts[:-1]
    if parts and parts[-1] == "mod":
        parts = parts[:-1]
    return parts


def exists(mod):
    return os.path.exists(os.path.join(ROOT, *mod) + ".rs") or os.path.exists(
        os.path.join(ROOT, *mod, "mod.rs")
    )


# Modules declared only for tests (`#[cfg(test)] mod x;`): their imports are not the crate's.
test_mods = set()
for d, _, fs in os.walk(ROOT):
    for f in fs:
        if f.endswith(".rs"):
            p = os.path.join(d, f)
            for k in re.findall(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))? )?mod (\w+);", open(p).read()):
                test_mods.add(tuple(modpath(p) + [k]))

# (from module, to module) -> items named
edges = {}
for d, _, fs in os.walk(ROOT):
    for f in fs:
        if not f.endswith(".rs") or f == "tests.rs" or "/tests/" in os.path.join(d, f) + "/":
            continue
        p = os.path.join(d, f)
        m = modpath(p)
        if m and m[-1] == "tests" or any(tuple(m[:i]) in test_mods for i in range(1, len(m) + 1)):
            continue
        text = open(p).read()
        text = re.split(r"\n#\[cfg\(test\)\]\n(?:pub\(crate\) )?mod tests \{", text)[0]
        text = re.sub(r"//[^\n]*", "", text)
        paths = re.findall(r"\b((?:crate|super)(?:::\w+)+)", text)
        for pre, items in re.findall(r"\b((?:crate|super)(?:::super)*(?:::\w+)*)::\{([^}]*)\}", text):
            for i in items.split(","):
                i = i.strip()
                if i and i != "self":
                    paths.append(pre + "::" + i.split("::")[0].split(" ")[0])
                elif i == "self":
                    paths.append(pre)
        for k in re.findall(r"(?m)^\s*(?:pub(?:\([^)]*\))? )?mod (\w+);", text):
            for use in re.findall(r"\b" + k + r"((?:::\w+)+)", text):
                paths.append("crate::" + "::".join(m + [k]) + use)
        for path in paths:
            segs = path.split("::")
            if segs[0] == "crate":
                base, segs = [], segs[1:]
            else:
                base = m[:]
                while segs and segs[0] == "super":
                    base, segs = base[:-1], segs[1:]
            target = base[:]
            rest = segs
            for i, s in enumerate(segs):
                if exists(target + [s]):
                    target = target + [s]
                    rest = segs[i + 1 :]
                else:
                    break
            if target == m or target[: len(m)] == m or m[: len(target)] == target:
                continue  # itself, its own child, or its parent (super::Item)
            item = rest[0] if rest else "(module)"
            edges.setdefault((tuple(m), tuple(target)), set()).add(item)


def sccs(graph):
    idx, low, st, on, out, c = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        idx[v] = low[v] = c[0]
        c[0] += 1
        st.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in idx:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in idx:
            visit(v)
    return out


def report(title, collapse):
    """collapse(from, to) -> (a, b) node names, or None when the edge is not in this graph."""
    g, why = {}, {}
    for (a, b), items in edges.items():
        k = collapse(a, b)
        if k is None or k[0] == k[1]:
            continue
        g.setdefault(k[0], set()).add(k[1])
        why.setdefault(k, set()).update(
            f"{'::'.join(b)}::{i}" if i != "(module)" else "::".join(b) for i in items
        )
    found = sccs(g)
    for comp in found:
        print(f"{title}: circle {' <-> '.join(comp)}")
        for a in comp:
            for b in comp:
                if (a, b) in why:
                    print(f"    {a} -> {b}: {', '.join(sorted(why[(a, b)]))}")
    return len(found)


n = report("top level", lambda a, b: (a[0], b[0]) if a and b else None)
dirs = sorted({m[:i] for (m, _) in edges for i in range(1, len(m))})
for d in dirs:
    k = len(d)
    n += report(
        "::".join(d),
        lambda a, b, d=d, k=k: (a[k], b[k])
        if len(a) > k and len(b) > k and a[:k] == d and b[:k] == d
        else None,
    )
print(f"{n} circle(s)")
sys.exit(1 if n else 0)
