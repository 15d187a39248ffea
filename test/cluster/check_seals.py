#!/usr/bin/env python3
"""Checks that every object a keyed cluster run wrote is sealed with the job
key, by kind, against the plain BLAKE2b-128 an unkeyed run would carry:

- sealed text (manifests, the commit record): last line `digest <hex>` over
  the lines before it;
- payloads (magic "DCRP", format v2): bytes 80..95, over header bytes 0..79
  and the body from byte 96;
- dense exports (`.../incarnation/<inc>/dense/...`): the last 16 bytes, over
  "dcr-dense 1\\n<inc>\\n<name>\\n" and the bytes before them.

    check_seals.py KEY_FILE PATH... [--need KIND,KIND,...]

Prints a count per kind; exits 1 when any seal is unkeyed or wrong, or a
kind named in --need was not seen."""

import hashlib
import os
import sys


def job_key(path: str) -> bytes:
    secret = open(path, "rb").read()
    # As seal_key::from_secret: up to 64 bytes is the key, longer is hashed.
    return secret if len(secret) <= 64 else hashlib.blake2b(secret, digest_size=64).digest()


def b2(data: bytes, key: bytes = b"") -> bytes:
    return hashlib.blake2b(data, digest_size=16, key=key).digest()


def check(path: str, key: bytes):
    data = open(path, "rb").read()
    parts = path.split(os.sep)
    if "dense" in parts and "incarnation" in parts:
        i = parts.index("incarnation")
        inc, name = parts[i + 1], "/".join(parts[i + 2:])
        body, seal = data[:-16], data[-16:]
        msg = f"dcr-dense 1\n{inc}\n{name}\n".encode() + body
        return "dense export", seal, msg
    if data[:4] == b"DCRP":
        return "payload", data[80:96], data[:80] + data[96:]
    at = data.rstrip(b"\n").rfind(b"\n") + 1
    last = data[at:]
    if last.startswith(b"digest "):
        kind = "commit record" if os.path.basename(path) == "commit" else "manifest"
        return kind, bytes.fromhex(last[7:].strip().decode()), data[:at]
    return None, None, None


def main(argv) -> int:
    need = set()
    if "--need" in argv:
        i = argv.index("--need")
        need = set(argv[i + 1].split(","))
        argv = argv[:i] + argv[i + 2:]
    key = job_key(argv[0])
    seen, bad = {}, []
    for root in argv[1:]:
        files = [root] if os.path.isfile(root) else \
            [os.path.join(d, f) for d, _, fs in os.walk(root) for f in fs]
        for f in sorted(files):
            kind, seal, msg = check(f, key)
            if kind is None:
                continue
            seen[kind] = seen.get(kind, 0) + 1
            if seal == b2(msg):
                bad.append(f"{f}: {kind} sealed WITHOUT the job key (plain BLAKE2b-128)")
            elif seal != b2(msg, key):
                bad.append(f"{f}: {kind} seal matches neither the job key nor none")
    print("seals: " + ", ".join(f"{n} {k}(s) keyed" for k, n in sorted(seen.items())))
    for b in bad:
        print("FAIL: " + b)
    missing = need - set(seen)
    if missing:
        print("FAIL: no " + ", ".join(sorted(missing)) + " seen")
    return 1 if bad or missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
