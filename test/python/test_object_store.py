"""Payloads through an object store named by URL: owners publish each
attempt's payloads and manifest, receivers fetch what the manifests list."""

import glob
import os

import pytest

import dcr
from helpers import Run, vllm_receivers


def test_fs_object_store_refit(tmp_path):
    run = Run("qwen3", lr=1e-5, make_receivers=vllm_receivers(2))
    url = f"fs:{tmp_path / 'store'}"
    owner_side = dcr.ObjectStore(url)
    reader = dcr.ObjectStore(url, owner_side.incarnation)  # another process, same history
    stranger = dcr.ObjectStore(url)  # another commit history: sees nothing of it
    for _ in range(2):
        run.train()
        run.attempt += 1
        digests = [owner_side.publish(run.attempt, r,
                                      o.build(run.attempt, run.version))
                   for r, o in enumerate(run.owners)]
        assert all(len(d) == 32 for d in digests)
        payloads, owners = reader.fetch(run.attempt)
        assert owners == [0, 1] and payloads
        assert stranger.fetch(run.attempt) == ([], [])
        run.apply(payloads)
        assert run.mismatches() == []
        run.commit()
        assert reader.collect(run.attempt) > 0
        assert reader.fetch(run.attempt) == ([], [])


def test_store_errors(tmp_path):
    with pytest.raises(dcr.InvalidArgument, match="memory:, fs:<directory> or s3://"):
        dcr.ObjectStore("gs://bucket")
    with pytest.raises(dcr.InvalidArgument, match="expected s3://HOST:PORT/BUCKET"):
        dcr.ObjectStore("s3://bucket")
    with pytest.raises(dcr.InvalidArgument, match="32 lower-case hex"):
        dcr.ObjectStore("memory:", "not-an-id")
    run = Run("llama", lr=1e-5, make_receivers=vllm_receivers(1))
    run.train()
    store = dcr.ObjectStore(f"fs:{tmp_path}")
    run.attempt += 1
    store.publish(run.attempt, 0, run.owners[0].build(run.attempt, run.version))
    files = [f for f in glob.glob(str(tmp_path / "**" / "*"), recursive=True)
             if os.path.isfile(f) and "/payload/" in f]
    with open(files[0], "r+b") as f:
        f.seek(40)
        b = f.read(1)
        f.seek(40)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(dcr.DigestMismatch, match="manifest's digest"):
        store.fetch(run.attempt)
