#!/usr/bin/env python3
"""Compare the PTX of every CUDA kernel between two git revisions, without a GPU.

For refactors that must not change what runs (moving kernels between files, deleting variants,
turning run-time switches into plan-time options): each revision's tree is exported with
`git archive`, the given .cu files are compiled to PTX for one architecture, and every kernel
(.entry) of the old tree is matched by name (template arguments included; the namespace and file
hash of anonymous namespaces are ignored) with one of the new tree and compared:
  SAME  identical PTX up to the parameter block's size and local-depot numbering (a kernel whose
        argument struct lost fields it no longer reads stays SAME);
  REG   the same instructions in another order or register numbering (a multiset match: same
        operations, not a proof of the same data flow);
  DIFF  different instructions;  GONE / NEW  kernels only in the old / new tree.
Identical PTX gives identical SASS and so bitwise-identical results.

  scripts/ptx_compare.py OLD_REV NEW_REV 'kernels/attention/*.cu' [--arch compute_90a]
      [--rename OLD=NEW ...] [--include DIR ...]

--rename maps kernel names (e.g. PagedAttentionKernel=PagedTileKernel); --include adds include
directories (generated headers: the build's gen/ directory). Exit status 1 when any kernel is
DIFF or GONE.
"""
import argparse
import collections
import concurrent.futures
import fnmatch
import os
import re
import subprocess
import sys
import tempfile

ENTRY = re.compile(r"^(?:\.visible |\.weak )?\.entry (\S+)\(", re.M)


def export(rev, dest):
    os.makedirs(dest, exist_ok=True)
    archive = subprocess.run(["git", "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", dest], input=archive, check=True)


def compile_ptx(root, path, arch, includes, out):
    cmd = ["nvcc", "-I" + root] + ["-I" + i for i in includes] + [
        "-O2", "-DNDEBUG", "-arch=" + arch, "-std=c++17", "-x", "cu", "-ptx",
        os.path.join(root, path), "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"nvcc failed on {root}/{path}:\n{r.stderr}")
    return out


def entries(ptx_path):
    text = open(ptx_path).read()
    out = {}
    for m in ENTRY.finditer(text):
        end = text.index("\n}\n", m.start()) + 3
        out[m.group(1)] = text[m.start():end]
    return out


def key(mangled, renames):
    """The kernel's own name (renamed) and template arguments, without its namespaces."""
    if not mangled.startswith("_ZN"):
        return mangled
    i, name = 3, mangled
    while i < len(mangled) and mangled[i].isdigit():
        j = i
        while mangled[j].isdigit():
            j += 1
        n = int(mangled[i:j])
        name, i = mangled[j:j + n], j + n
    return renames.get(name, name) + mangled[i:]


def normalize(body, mangled):
    body = body.replace(mangled, "K")
    # Names in anonymous namespaces carry a hash of the file's contents; _ZZN: a kernel's
    # static __shared__ arrays.
    body = re.sub(r"_ZZ?N\S*?_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]+", "ANON", body)
    body = re.sub(r"\.param \.align \d+ \.b8 K_param_0\[\d+\]", "PARAM", body)
    body = re.sub(r"__local_depot\d+", "DEPOT", body)
    body = re.sub(r"\$L__\w+", "L", body)
    return body


def opcodes(body):
    lines = [l.strip() for l in body.splitlines() if l.strip() and not l.strip().startswith(".reg")]
    return collections.Counter(re.sub(r"%\w+", "R", l) for l in lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("files", help="glob of .cu files relative to the repository root")
    ap.add_argument("--arch", default="compute_90a")
    ap.add_argument("--rename", action="append", default=[])
    ap.add_argument("--include", action="append", default=[])
    ap.add_argument("-j", type=int, default=2)
    a = ap.parse_args()
    renames = dict(r.split("=", 1) for r in a.rename)
    with tempfile.TemporaryDirectory() as tmp:
        kernels = {}
        for side, rev in (("old", a.old), ("new", a.new)):
            root = os.path.join(tmp, side)
            export(rev, root)
            files = sorted(
                os.path.relpath(os.path.join(d, f), root)
                for d, _, fs in os.walk(root) for f in fs
                if fnmatch.fnmatch(os.path.relpath(os.path.join(d, f), root), a.files))
            with concurrent.futures.ThreadPoolExecutor(a.j) as pool:
                ptx = list(pool.map(
                    lambda p: compile_ptx(root, p, a.arch, a.include,
                                          os.path.join(tmp, side + "_" + p.replace("/", "_") + ".ptx")),
                    files))
            found = {}
            for p in ptx:
                for mangled, body in entries(p).items():
                    found[key(mangled, renames)] = normalize(body, mangled)
            kernels[side] = found
            print(f"{side} ({rev}): {len(files)} files, {len(found)} kernels")
    old, new = kernels["old"], kernels["new"]
    counts = collections.Counter()
    for k in sorted(old):
        if k not in new:
            status = "GONE"
        elif old[k] == new[k]:
            status = "SAME"
        elif opcodes(old[k]) == opcodes(new[k]):
            status = "REG"
        else:
            status = "DIFF"
        counts[status] += 1
        print(f"{status:4} {k}")
    for k in sorted(set(new) - set(old)):
        counts["NEW"] += 1
        print(f"NEW  {k}")
    print(" ".join(f"{s} {counts[s]}" for s in ("SAME", "REG", "DIFF", "GONE", "NEW")))
    return 1 if counts["DIFF"] or counts["GONE"] else 0


if __name__ == "__main__":
    sys.exit(main())
