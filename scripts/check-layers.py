#!/usr/bin/env python3
"""Checks the include structure of dcr (run by CI; exits 1 on a violation).

1. Layers: a header under include/dcr/<folder>/ includes only headers of the
   folders that scripts/layers.txt allows for <folder> (and its own).
2. CUDA code never includes Boost: no file under cuda/ reaches a <boost/...>
   include, directly or through the dcr headers it includes.
3. Every folder of include/dcr/ is listed in scripts/layers.txt.
"""
import os
import re
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
inc_root = os.path.join(root, "include")
include_re = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)


def read_layers():
    allowed = {}
    with open(os.path.join(root, "scripts", "layers.txt")) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            name, _, deps = line.partition(":")
            allowed[name.strip()] = set(deps.split())
    return allowed


def includes(path):
    with open(path, encoding="utf-8") as f:
        return include_re.findall(f.read())


def main():
    allowed = read_layers()
    errors = []
    dcr = os.path.join(inc_root, "dcr")
    for folder in sorted(os.listdir(dcr)):
        if os.path.isdir(os.path.join(dcr, folder)) and folder not in allowed:
            errors.append(f"include/dcr/{folder}/: not in scripts/layers.txt")
    for dirpath, _, files in os.walk(dcr):
        for name in sorted(files):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, inc_root)
            folder = rel.split(os.sep)[1]
            for kind, target in includes(path):
                if kind != '"' or not target.startswith("dcr/"):
                    continue
                dep = target.split("/")[1]
                if dep != folder and dep not in allowed.get(folder, set()):
                    errors.append(f"include/{rel}: includes {target} ({folder} may not include {dep})")

    # Transitive closure from every CUDA file through dcr headers.
    def reaches_boost(path, seen):
        for kind, target in includes(path):
            if target.startswith("boost/"):
                return [target]
            if kind == '"' and target.startswith("dcr/"):
                for base in (inc_root, os.path.join(root, "cuda")):
                    p = os.path.join(base, target)
                    if os.path.isfile(p):
                        if p in seen:
                            break
                        seen.add(p)
                        chain = reaches_boost(p, seen)
                        if chain:
                            return [target] + chain
                        break
        return None

    for dirpath, _, files in os.walk(os.path.join(root, "cuda")):
        for name in sorted(files):
            if name.endswith((".cu", ".cuh")):
                path = os.path.join(dirpath, name)
                chain = reaches_boost(path, set())
                if chain:
                    errors.append(f"{os.path.relpath(path, root)}: reaches Boost: " + " -> ".join(chain))

    for e in errors:
        print("layering:", e)
    if errors:
        print(f"layering: {len(errors)} violation(s); see scripts/layers.txt and docs/architecture.md")
        return 1
    print("layering: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
