"""Committed refits through the library's coordinator with the stores of the
C++ cluster programs, chosen by URL: a real etcd and a real Swift (s3api)
started as the C++ interop suites start them (servers.py), and the file
commit store with the fs object store. After every transition every
receiver byte equals a dense load_weights of the trained weights, and the
commit record names the version."""

import pytest

import dcr
from helpers import Run, vllm_receivers
from refit_models import VllmLikeModel
from servers import EtcdServer, SwiftServer, free_port


@pytest.fixture(scope="module")
def etcd():
    s = EtcdServer()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def swift():
    s = SwiftServer()
    yield s
    s.stop()


def etcd_url(server, prefix):
    return server.url.replace("http://", "etcd://") + "/" + prefix


def s3_store(swift, bucket, tmp_path, incarnation=""):
    store = dcr.ObjectStore(swift.url(bucket), incarnation, region=swift.region,
                            credentials=swift.credentials_file(tmp_path))
    store.create_bucket()
    return store


def coordinated(run, commits, store, **kw):
    """A coordinator over the run's owners and receivers, version 0 committed."""
    co = dcr.Coordinator(commits, store, run.owners,
                         {f"rx{i}": r for i, r in enumerate(run.receivers)}, **kw)
    assert co.take_over() >= 1
    for o, s in zip(run.owners, run.shards):
        o.set_candidate(s)
    co.bootstrap()
    return co


def committed_steps(run, co, commits, steps, *, attempts=1):
    for _ in range(steps):
        run.train()
        rep = co.transition()
        assert rep["committed_version"] == run.version
        assert [a["error"] is None for a in rep["attempts"]] == [False] * (attempts - 1) + [True]
        assert rep["attempts"][-1]["payloads"] > 0 and rep["attempts"][-1]["payload_bytes"] > 0
        assert run.mismatches() == []
        rec = commits.load()
        assert rec["version"] == run.version
        assert rec["committed_attempt"] == rep["attempts"][-1]["attempt"]
        assert [r for r, _ in rec["receivers"]] == [f"rx{i}" for i in range(len(run.receivers))]
        # The owners' baselines are the committed version now.
        assert all(o.baseline_digest == o.candidate_digest for o in run.owners)
        yield rep, rec


def test_committed_refit_through_s3_and_etcd(etcd, swift, tmp_path):
    # The trainer's parameters are the TP shards the owners read (views).
    run = Run("qwen3_moe", lr=1e-5, sharded=True,
              make_receivers=vllm_receivers(2, enable_expert_parallel=True))
    store = s3_store(swift, "dcr-py-refit", tmp_path)
    commits = dcr.CommitStore(etcd_url(etcd, "py/refit"))
    co = coordinated(run, commits, store)
    rec = commits.load()
    assert rec["version"] == 0 and rec["revision"] == 1 and len(rec["incarnation"]) == 32
    # A reader of the same history, as a rollout node's would be.
    reader = dcr.ObjectStore(swift.url("dcr-py-refit"), rec["incarnation"], region=swift.region,
                             credentials=swift.credentials_file(tmp_path))
    for rep, rec in committed_steps(run, co, commits, 3):
        assert rep["collected_objects"] > 0
        assert reader.fetch(rec["committed_attempt"]) == ([], [])  # collected after the commit
    assert rec["revision"] == 4


def test_overwrite_retry_through_s3_and_etcd(etcd, swift, tmp_path):
    # FP32 norms: a cast in the loader. At a learning rate that moves the
    # norms, the mixed attempt's relative items for them fail at the
    # receivers and the coordinator retries with every record an overwrite.
    run = Run("llama", lr=1e-2, sharded=True,
              make_receivers=vllm_receivers(2, fp32_norms=True))
    co = coordinated(run, dcr.CommitStore(etcd_url(etcd, "py/retry")),
                     s3_store(swift, "dcr-py-retry", tmp_path))
    for rep, _ in committed_steps(run, co, co.commits, 2, attempts=2):
        assert [a["mode"] for a in rep["attempts"]] == ["mixed", "overwrite_all"]
        code, message = rep["attempts"][0]["error"]
        assert code in dcr.errors.BY_CODE and "receiver rx" in message


def test_fenced_coordinator_gets_a_conflict(etcd, tmp_path):
    run = Run("qwen3", lr=1e-5, make_receivers=vllm_receivers(2))
    url = etcd_url(etcd, "py/fence")
    store = dcr.ObjectStore(f"fs:{tmp_path / 'objects'}")
    first = coordinated(run, dcr.CommitStore(url), store)
    second = dcr.Coordinator(dcr.CommitStore(url), store, run.owners,
                             {f"rx{i}": r for i, r in enumerate(run.receivers)})
    assert second.take_over() == first.epoch + 1
    run.train()
    with pytest.raises(dcr.Conflict, match="epoch"):
        first.transition()
    assert run.mismatches() != []  # nothing applied by the fenced one
    rep = second.transition()
    assert rep["committed_version"] == 1 and run.mismatches() == []
    assert dcr.CommitStore(url).load()["version"] == 1


def test_store_and_server_errors(swift, tmp_path, monkeypatch):
    monkeypatch.delenv("DCR_S3_ACCESS_KEY", raising=False)
    monkeypatch.delenv("DCR_S3_SECRET_KEY", raising=False)
    port = free_port()  # nothing listens there
    with pytest.raises(dcr.Unavailable, match="cannot connect"):
        dcr.CommitStore(f"etcd://127.0.0.1:{port}").take_over()
    with pytest.raises(dcr.InvalidArgument, match="HOST:PORT"):
        dcr.CommitStore("etcd://localhost/prefix")
    with pytest.raises(dcr.InvalidArgument, match="s3://HOST:PORT/BUCKET"):
        dcr.ObjectStore("s3://127.0.0.1:9000")
    with pytest.raises(dcr.InvalidArgument, match="no S3 credentials"):
        dcr.ObjectStore("s3://127.0.0.1:9000/bucket")  # no file, no keys in the environment
    # The environment's keys, as the C++ programs take them.
    monkeypatch.setenv("DCR_S3_ACCESS_KEY", swift.access_key)
    monkeypatch.setenv("DCR_S3_SECRET_KEY", swift.secret_key)
    env_store = dcr.ObjectStore(swift.url("dcr-py-env"), region=swift.region)
    env_store.create_bucket()
    assert env_store.fetch(1) == ([], [])
    bad = tmp_path / "bad"
    bad.write_text("access_key only-this\n")
    with pytest.raises(dcr.InvalidArgument, match="needs access_key and secret_key"):
        dcr.ObjectStore("s3://127.0.0.1:9000/bucket", credentials=str(bad))
    gone = tmp_path / "nope"
    with pytest.raises(dcr.InvalidArgument, match="cannot read"):
        dcr.ObjectStore("s3://127.0.0.1:9000/bucket", credentials=str(gone))
    # A wrong secret: the server refuses the signature (HTTP 403), not retried.
    wrong = tmp_path / "wrong"
    wrong.write_text(f"access_key {swift.access_key}\nsecret_key not-{swift.secret_key}\n")
    store = dcr.ObjectStore(swift.url("dcr-py-errors"), region=swift.region,
                            credentials=str(wrong))
    with pytest.raises(dcr.IOFailure, match="403"):
        store.create_bucket()
    # Nothing listens: unavailable after the store's retries.
    store = dcr.ObjectStore(f"s3://127.0.0.1:{port}/bucket", region=swift.region,
                            credentials=swift.credentials_file(tmp_path))
    with pytest.raises(dcr.Unavailable):
        store.fetch(1)


def test_file_commits_restore_a_dropped_receiver(tmp_path):
    """The file commit store and the fs object store; a receiver dropped between
    transitions rejoins through `restore`, densely at the committed version
    (checked by the coordinator against the record's digest)."""
    run = Run("qwen3", lr=1e-5, make_receivers=vllm_receivers(2))
    committed = {n: t.clone() for n, t in run.canonical().items()}
    restored = []

    def restore(rid):
        i = int(rid[2:])
        model = VllmLikeModel(run.cfg, i, 2)
        rx = dcr.torch.Receiver(model, run.plan.canonical)
        rx.dense_refit(committed)
        run.rx_models[i], run.receivers[i] = model, rx
        restored.append(rid)
        return rx

    commits = dcr.CommitStore(f"file:{tmp_path / 'control'}")
    co = coordinated(run, commits, dcr.ObjectStore(f"fs:{tmp_path / 'objects'}"),
                     restore=restore)
    steps = committed_steps(run, co, commits, 3)
    next(steps)
    committed = {n: t.clone() for n, t in run.canonical().items()}
    co.kill("rx1")
    rep, _ = next(steps)
    assert restored == ["rx1"] and rep["restore_seconds"] > 0
    assert co.counters("rx1")["restores"] == 1
    next(steps)


def test_coordinator_argument_errors(tmp_path):
    run = Run("llama", lr=1e-5, make_receivers=vllm_receivers(1))
    commits = dcr.CommitStore(f"file:{tmp_path}")
    store = dcr.ObjectStore("memory:")
    with pytest.raises(dcr.InvalidArgument, match="not a dcr owner"):
        dcr.Coordinator(commits, store, [object()], {"a": run.receivers[0]})
    with pytest.raises(dcr.InvalidArgument, match="no receivers"):
        dcr.Coordinator(commits, store, run.owners, {})
    co = dcr.Coordinator(commits, store, run.owners, {"a": run.receivers[0]})
    co.take_over()
    with pytest.raises(dcr.InvalidArgument, match="no candidate"):
        co.transition()


def test_a_missing_server_fails_under_ci(monkeypatch):
    import servers

    monkeypatch.setattr(servers, "ETCD", "/nonexistent/etcd")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="etcd-server.*CI is set"):
        servers.EtcdServer()
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match="etcd-server"):
        servers.EtcdServer()
    monkeypatch.setattr(servers, "SWIFT_BINARIES", ["/nonexistent/swift-proxy-server"])
    monkeypatch.setenv("CI", "1")
    with pytest.raises(pytest.fail.Exception, match="swift-proxy-server.*CI is set"):
        servers.SwiftServer()


@pytest.mark.parametrize("tcp", [False, True], ids=["pipes", "tcp"])
def test_committed_refit_through_a_relay_tree(etcd, tcp):
    """The relay tree transport (`--transport relay_tree`): payloads stream
    from the owners through a k-ary tree of the receivers' nodes, the commit
    record in etcd; one tree node per receiver (TP 4), fanout 2, over in-process
    pipes or loopback TCP."""
    run = Run("qwen3_moe", lr=1e-5, sharded=True,
              make_receivers=vllm_receivers(4, enable_expert_parallel=True))
    commits = dcr.CommitStore(etcd_url(etcd, f"py/relay-{'tcp' if tcp else 'pipes'}"))
    co = coordinated(run, commits, dcr.RelayTree(fanout=2, tcp=tcp))
    for rep, _ in committed_steps(run, co, commits, 2):
        assert rep["collected_objects"] == 0  # nothing stored: nothing to collect
    with pytest.raises(dcr.InvalidArgument, match="must be positive"):
        dcr.Coordinator(commits, dcr.RelayTree(fanout=0), run.owners, {"a": run.receivers[0]})
