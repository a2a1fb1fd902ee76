"""The prefetch strategy: same batches as the other strategies, real overlap, clean shutdown."""

from __future__ import annotations

import contextlib
import gc
import threading
import time
import traceback

import pytest
import torch

from looptune.data import prefetch
from looptune.data.loaders import make
from looptune.data.prefetch import THREAD_NAME, PrefetchSource
from looptune.errors import ConfigError
from looptune.recipe import LoaderConfig

CPU = torch.device("cpu")


def _cfg(strategy: str = "prefetch", **kw) -> LoaderConfig:
    return LoaderConfig(strategy=strategy, decode="tensorized", **{"batch_size": 32, **kw})


def _prefetch(data, seed: int = 0, **kw) -> PrefetchSource:
    return PrefetchSource(_cfg(**kw), data, device=CPU, seed=seed)


def _batches(source, epoch: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(raw uint8 x, normalized x, y) per batch; raw cloned: some sources yield views."""
    return [(x.clone(), *source.to_device(x, y)) for x, y in source.epoch(epoch)]


def _live_prefetch_threads(wait_s: float = 1.0) -> list[threading.Thread]:
    """The producer threads still alive after up to ``wait_s`` (they stop asynchronously)."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [t for t in threading.enumerate() if t.name == THREAD_NAME and t.is_alive()]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.01)


@pytest.fixture(autouse=True)
def no_leftover_threads():
    yield
    gc.collect()  # a test's abandoned iterators are closed by collection
    assert _live_prefetch_threads() == []


@pytest.mark.parametrize("depth", [1, 4])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("seed", [0, 3])
def test_batches_bit_identical_to_device_and_tensorized(make_image_data, seed, drop_last, depth):
    data = make_image_data(100)
    source = _prefetch(data, seed, drop_last=drop_last, prefetch_factor=depth)
    others = [make(_cfg(s, drop_last=drop_last), data, device=CPU, seed=seed)
              for s in ("device", "dataloader")]
    for epoch in range(3):
        ours = _batches(source, epoch)
        assert [len(y) for *_, y in ours] == ([32, 32, 32] if drop_last else [32, 32, 32, 4])
        for other in others:
            theirs = _batches(other, epoch)
            assert len(ours) == len(theirs)
            for (raw, x, y), (oraw, ox, oy) in zip(ours, theirs):
                assert raw.dtype == torch.uint8 and x.dtype == torch.float32
                assert torch.equal(raw, oraw) and torch.equal(x, ox) and torch.equal(y, oy)


@pytest.mark.parametrize(("drop_last", "batches", "samples"), [(False, 4, 100), (True, 3, 96)])
def test_len_and_samples_per_epoch(make_image_data, drop_last, batches, samples):
    source = _prefetch(make_image_data(100), drop_last=drop_last)
    assert len(source) == batches and source.samples_per_epoch == samples


def test_producer_exception_is_reraised_with_its_traceback(make_image_data, monkeypatch):
    calls = []
    real = prefetch._gather

    def failing_gather(*args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("corrupt shard")
        return real(*args, **kw)

    monkeypatch.setattr(prefetch, "_gather", failing_gather)
    source = _prefetch(make_image_data(128))
    got = []
    with pytest.raises(ValueError, match="corrupt shard") as info:
        for batch in source.epoch(0):
            got.append(batch)
    assert len(got) == 2  # the batches before the failure were delivered
    text = "".join(traceback.format_exception(info.value))
    assert "failing_gather" in text  # the producer thread's frames are kept
    assert f"{THREAD_NAME} producer thread while preparing batch 2 of epoch 0" in text


def test_break_then_new_epoch_and_no_thread_left(make_image_data):
    data = make_image_data(200)
    source = _prefetch(data, seed=5, batch_size=16)
    it = source.epoch(0)
    for i, _ in enumerate(it):
        if i == 1:
            break  # the generator is still referenced by `it`: its producer is alive
    reference = make(_cfg("device", batch_size=16), data, device=CPU, seed=5)
    ours, theirs = _batches(source, 1), _batches(reference, 1)  # epoch() shuts `it` down first
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[2], b[2]) for a, b in zip(ours, theirs))
    with pytest.raises(RuntimeError, match="epoch 0 was shut down"):
        next(it)  # a superseded iterator fails loudly instead of silently ending the epoch
    assert _live_prefetch_threads() == []


def test_abandoned_iterator_stops_its_thread(make_image_data):
    source = _prefetch(make_image_data(200), batch_size=8)
    it = source.epoch(0)
    next(it)
    assert len(_live_prefetch_threads(wait_s=0)) == 1
    del it  # garbage collection closes the generator, whose finally stops the thread
    gc.collect()
    assert _live_prefetch_threads() == []


@pytest.mark.parametrize("depth", [1, 3])
def test_producer_stays_at_most_depth_batches_ahead(make_image_data, monkeypatch, depth):
    calls = []
    real = prefetch._gather
    monkeypatch.setattr(prefetch, "_gather", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    it = _prefetch(make_image_data(320), batch_size=8, prefetch_factor=depth).epoch(0)
    next(it)
    time.sleep(0.2)  # plenty of time to run ahead if the queue were unbounded
    # at most: the batch in hand + `depth` queued + one prepared and waiting for room
    assert 1 < len(calls) <= 1 + depth + 1
    it.close()


def test_gather_overlaps_the_step(make_image_data, monkeypatch):
    real = prefetch._gather

    def slow_gather(*args, **kw):
        time.sleep(0.02)  # sleeping releases the GIL, as index_select does
        return real(*args, **kw)

    monkeypatch.setattr(prefetch, "_gather", slow_gather)
    source = _prefetch(make_image_data(80), batch_size=8)
    start = time.perf_counter()
    for x, y in source.epoch(0):
        source.to_device(x, y)
        time.sleep(0.02)  # the "step"
    elapsed = time.perf_counter() - start
    assert len(source) == 10
    assert elapsed < 0.33, f"10 batches took {elapsed * 1e3:.0f} ms: serial would be ~400 ms"


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_invalid_depth_names_value_and_fix(make_image_data, bad):
    with pytest.raises(ConfigError, match=rf"prefetch_factor={bad!r} is invalid.*Use e\.g\."):
        _prefetch(make_image_data(8), prefetch_factor=bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a build without CUDA")
def test_cuda_device_without_cuda_is_a_config_error(make_image_data):
    with pytest.raises(ConfigError, match="'cuda'.*no usable CUDA.*Use device='cpu'"):
        PrefetchSource(_cfg(), make_image_data(8), device=torch.device("cuda"), seed=0)


class _FakeStream:
    def __init__(self, device=None) -> None:
        self.waited: list = []

    def wait_event(self, event) -> None:
        self.waited.append(event)


class _FakeEvent:
    log: list[tuple] = []  # set per test by _FakeCuda.install

    def record(self, stream) -> None:
        self.log.append(("record", self))

    def synchronize(self) -> None:
        self.log.append(("sync", self))


class _FakeCuda:
    """Stands in for torch.cuda on a CPU build and logs the side-stream choreography."""

    def __init__(self) -> None:
        self.log: list[tuple] = []  # producer thread: gather / sync / record, in order
        self.current = _FakeStream()  # the training thread's current stream
        self.recorded: list[tuple] = []  # (tensor, stream) per record_stream call

    def install(self, monkeypatch) -> None:
        real = prefetch._gather
        monkeypatch.setattr(_FakeEvent, "log", self.log)
        monkeypatch.setattr(prefetch, "_side_stream_path", lambda device: True)
        monkeypatch.setattr(prefetch, "_gather",
                            lambda *a, **k: (self.log.append(("gather",)), real(*a, **k))[1])
        for name, value in {"Stream": _FakeStream, "Event": _FakeEvent,
                            "stream": lambda s: contextlib.nullcontext(),
                            "device": lambda d: contextlib.nullcontext(),
                            "current_stream": lambda device=None: self.current}.items():
            monkeypatch.setattr(torch.cuda, name, value)
        monkeypatch.setattr(torch.Tensor, "record_stream",
                            lambda t, s: self.recorded.append((t, s)), raising=False)


def test_cuda_path_choreography_with_a_fake_cuda(make_image_data, monkeypatch):
    """The CUDA-only path on a CPU build: events order slot reuse and the hand-over."""
    fake = _FakeCuda()
    fake.install(monkeypatch)
    data = make_image_data(100)
    source = _prefetch(data, seed=2, prefetch_factor=1, non_blocking=True)  # a ring of 2 slots
    yielded = list(source.epoch(0))
    theirs = _batches(make(_cfg("device"), data, device=CPU, seed=2), 0)
    assert len(yielded) == len(theirs) == 4
    # bit-identical although the ring was reused: yielded tensors never alias a ring buffer
    assert all(torch.equal(x, b[0]) and torch.equal(y, b[2]) for (x, y), b in zip(yielded, theirs))
    events = [entry[1] for entry in fake.log if entry[0] == "record"]
    expected = []  # batch k reuses slot k % 2: wait for batch k-2's copy before gathering into it
    for k, event in enumerate(events):
        expected += ([("sync", events[k - 2])] if k >= 2 else []) + [("gather",), ("record", event)]
    assert fake.log == expected
    assert fake.current.waited == events  # the training stream waits for each batch's copy
    assert [(id(t), s) for t, s in fake.recorded] == [
        (id(t), fake.current) for batch in yielded for t in batch]
