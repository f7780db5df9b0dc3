"""The compiled loops give exactly the values of the definitions they replace.

Each test computes the same thing a second, independent way (numpy prefix-sum spans on the
readable normalisation, ``np.minimum.at``), so a compiled loop that drifts by one bit, one
window or one white-space rule fails here, not only in the pinned bytes of test_golden.
"""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from neardup_store import MinHashConfig, MinHasher, Shingler, kernels
from neardup_store.hashing import span_hashes
from neardup_store.minhash import _EMPTY_BIN
from neardup_store.text import ShingleBatch, ShingleConfig, normalize

_texts = st.lists(
    st.sampled_from([*"abcZ xyz\n\t\r\x0bÄß\u3000\xa0\x1c\u2028\u0301ﬁ", "\U0001d538", " of "]),
    max_size=30,
).map("".join)
_configs = st.builds(
    ShingleConfig,
    kind=st.just("char"),
    size=st.integers(1, 9),
    casefold=st.booleans(),
    collapse_whitespace=st.booleans(),
    strip=st.booleans(),
    nfkc=st.booleans(),
    allow_empty=st.just(True),
)
_PROJECT_ROOT = Path(__file__).resolve().parent.parent


def _window_hashes_by_definition(text: str, shingler: Shingler) -> np.ndarray:
    """Every k-window of the readable normalisation, hashed as a numpy prefix-sum span."""
    norm = normalize(text, shingler.config)
    codes = np.frombuffer(norm.encode("utf-32-le", "surrogatepass"), dtype="<u4")
    k = shingler.config.shingle_size
    if not len(codes):
        return np.empty(0, dtype=np.uint64)
    starts = np.arange(max(len(codes) - k + 1, 1), dtype=np.int64)
    ends = np.minimum(starts + k, len(codes))
    return span_hashes(codes, starts, ends, shingler._shingle_key)


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(_texts, min_size=1, max_size=8), config=_configs)
def test_compiled_char_shingles_equal_spans_of_the_readable_normalisation(
    texts: list[str], config: ShingleConfig
) -> None:
    shingler = Shingler(config, seed=3)
    batch = shingler.hash_batch(texts)
    for i, text in enumerate(texts):
        assert batch.document(i).tolist() == _window_hashes_by_definition(text, shingler).tolist()


def test_a_batch_of_long_real_documents_matches_the_definition() -> None:
    rng = np.random.default_rng(5)
    words = ["alpha", "beta", "γάμμα", "delta\t", "\n\n", "épsilon", "  ", "ζ"]
    texts = [" ".join(rng.choice(words, size=int(n))) for n in rng.integers(0, 3000, 40)]
    shingler = Shingler(ShingleConfig(allow_empty=True))
    batch = shingler.hash_batch(texts)
    for i, text in enumerate(texts):
        assert np.array_equal(batch.document(i), _window_hashes_by_definition(text, shingler))


def test_windows_on_both_sides_of_the_direct_width_limit_match_the_definition() -> None:
    """Narrow windows are summed term by term over blocks of windows, wide ones rolled:
    both, across many blocks, short documents and the empty one."""
    rng = np.random.default_rng(11)
    words = ["alpha", "béta", "\U0001d538x", "delta\t", "  ", "ζ", "\x00", "x" * 40]
    texts = [" ".join(rng.choice(words, size=int(n))) for n in rng.integers(0, 900, 12)]
    texts += ["", "ab", "a" * (kernels.WINDOW_BLOCK + 1)]
    limit, block = kernels.DIRECT_WIDTH_LIMIT, kernels.WINDOW_BLOCK
    for size in sorted({1, 2, 5, limit, limit + 1, 40, block - 1, block + 7, 3000}):
        shingler = Shingler(ShingleConfig(size=size, allow_empty=True), seed=size)
        batch = shingler.hash_batch(texts)
        for i, text in enumerate(texts):
            expected = _window_hashes_by_definition(text, shingler)
            assert np.array_equal(batch.document(i), expected), (size, i)


@settings(max_examples=200, deadline=None)
@given(
    texts=st.lists(_texts, min_size=1, max_size=8),
    config=_configs,
    num_perm=st.sampled_from([1, 7, 64, 128, 256]),
    long_text=st.integers(0, 3000),
)
def test_signatures_binned_as_the_windows_are_hashed_equal_those_of_the_hashes(
    texts: list[str], config: ShingleConfig, num_perm: int, long_text: int
) -> None:
    """Signing a set of character shingles bins each window's hash as it is made; that
    must give the signatures of the stored hashes (signatures_from_hashes)."""
    texts = [*texts, "a rose is a rose. " * (long_text // 18)]
    hasher = MinHasher(MinHashConfig(num_perm=num_perm, shingles=config, seed=5))
    expected = hasher.signatures_from_hashes(hasher.shingler.hash_batch(texts))
    assert np.array_equal(hasher.signatures(texts), expected)


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(0, 300), min_size=1, max_size=12),
    num_perm=st.sampled_from([1, 2, 7, 64, 128, 256]),
    seed=st.integers(0, 2**32 - 1),
)
def test_compiled_oph_bins_equal_a_minimum_per_bin(
    counts: list[int], num_perm: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, 2**64, sum(counts), dtype=np.uint64, endpoint=False)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    owners = np.repeat(np.arange(len(counts)), counts)
    slots = owners * num_perm + ((hashes >> np.uint64(32)) * np.uint64(num_perm) >> np.uint64(32))
    expected = np.full(len(counts) * num_perm, _EMPTY_BIN, dtype=np.uint64)
    np.minimum.at(expected, slots.astype(np.int64), hashes & np.uint64(0xFFFFFFFF))
    hasher = MinHasher(MinHashConfig(num_perm=num_perm))
    assert np.array_equal(hasher._oph_bins(ShingleBatch(hashes, offsets)), expected)


def test_importing_and_querying_by_signature_do_not_load_numba() -> None:
    """Only signing text compiles or loads the loops: a CLI call or a reader that works on
    signatures does not pay numba's import."""
    script = """
import sys, tempfile
import numpy as np
import neardup_store as nd
with tempfile.TemporaryDirectory() as d, nd.Store.open(d + "/s", create=True) as store:
    signature = np.arange(store.hasher.num_perm, dtype=np.uint32)
    store.add("a", signature=signature)
    matches = store.query(signature=signature)
    loaded_before = "numba" in sys.modules
    store.add("b", "some text to sign")
print(len(matches), loaded_before, "numba" in sys.modules)
"""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.split() == ["1", "False", "True"]


def test_hash_batch_results_are_not_overwritten_by_the_next_call() -> None:
    """The loops write into reused per-thread buffers; what hash_batch returns is the
    caller's own."""
    shingler = Shingler()
    first = shingler.hash_batch(["the first batch of text", "and its second document"])
    kept = first.hashes.copy()
    shingler.hash_batch(["something else entirely, and longer than the first batch was"])
    assert np.array_equal(first.hashes, kept)


def test_threads_signing_at_once_get_the_signatures_of_one_thread() -> None:
    """The compiled loops release the GIL and their buffers are per thread."""
    rng = np.random.default_rng(9)
    words = ["alpha", "beta", "gamma", "delta", "épsilon", "\t", "zeta", "eta"]
    groups = [
        [" ".join(rng.choice(words, size=int(n))) for n in rng.integers(1, 4000, 30)]
        for _ in range(8)
    ]
    hasher = MinHasher(MinHashConfig(num_perm=64))
    alone = [hasher.signatures(group) for group in groups]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(hasher.signatures, groups * 3))
    for i, sigs in enumerate(together):
        assert np.array_equal(sigs, alone[i % len(groups)])


def test_a_batch_larger_than_the_reused_buffers_matches_the_definition() -> None:
    text = "a rose is  a rose\n" * (kernels.SCRATCH_LIMIT // 17)  # more codes than the limit
    shingler = Shingler()
    assert len(text) > kernels.SCRATCH_LIMIT
    expected = _window_hashes_by_definition(text, shingler)
    assert np.array_equal(shingler.hash_document(text), expected)


def test_signing_works_where_numba_has_nowhere_to_cache() -> None:
    """With no usable cache location (here: only the IPython locator, which declines
    outside IPython) numba refuses cache=True; the loops are compiled without it."""
    script = (
        "import numpy as np; from neardup_store import MinHasher; "
        "print(MinHasher().signature('a few words to sign').tobytes().hex())"
    )
    env = {**os.environ, "NUMBA_CACHE_LOCATOR_CLASSES": "IPythonCacheLocator"}
    uncached = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert uncached.returncode == 0, uncached.stderr
    expected = MinHasher().signature("a few words to sign").tobytes().hex()
    assert uncached.stdout.strip() == expected


_INTERRUPTED_IMPORT = """
import sys


class Interrupt:
    fired = False

    def find_spec(self, name, path=None, target=None):
        if name == "numba.core.typing" and not Interrupt.fired:  # well inside `import numba`
            Interrupt.fired = True
            raise KeyboardInterrupt
        return None


sys.meta_path.insert(0, Interrupt())
from neardup_store import MinHasher

hasher = MinHasher()
try:
    hasher.signature("a first document to sign")
except KeyboardInterrupt:
    print("interrupted")
assert Interrupt.fired
print(hasher.signature("a first document to sign").tolist() == hasher.signature(
    "a first document to sign"
).tolist())
"""


def test_a_ctrl_c_while_numba_imports_leaves_signing_working() -> None:
    """A Ctrl-C during the first signing (or cached query) of a process, while numba
    imports, left numba half made in sys.modules: every later call raised a raw
    AttributeError until the process restarted (review 33). A fresh interpreter, as numba
    is imported once per process."""
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_IMPORT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["interrupted", "True"]


_INTERRUPTED_LOAD = """
import os, signal, threading

import llvmlite.binding.executionengine as ee

# Another thread, which the kernel may hand the SIGINT to: blocking it in the main thread
# alone (pthread_sigmask) would not hold it back.
threading.Thread(target=threading.Event().wait, daemon=True).start()

original = ee.ExecutionEngine.set_object_cache
armed = []


def set_object_cache(self, notify_func=None, getbuffer_func=None):
    # llvmlite calls these through ctypes for every module numba compiles or loads.
    def interrupt_if_armed():
        if armed:
            armed.clear()
            os.kill(os.getpid(), signal.SIGINT)  # the user's Ctrl-C, now

    def notify(module, buf):
        interrupt_if_armed()
        return notify_func(module, buf)

    def getbuffer(module):
        interrupt_if_armed()
        return getbuffer_func(module)

    return original(self, notify if notify_func else None, getbuffer if getbuffer_func else None)


ee.ExecutionEngine.set_object_cache = set_object_cache
from neardup_store import MinHasher, kernels


class Timeout(Exception):
    pass


def time_out(signum, frame):
    raise Timeout


def attempt(call):
    armed.append(1)
    try:
        outcome = f"returned {call()}"
    except KeyboardInterrupt:
        outcome = "KeyboardInterrupt"
    except Timeout:
        outcome = "Timeout"
    assert not armed, "no callback ran"
    handler = signal.getsignal(signal.SIGINT)
    print(outcome, handler.__name__ if callable(handler) else handler.name)


attempt(lambda: MinHasher().signature("a first document to sign").sum())
print(MinHasher().signature("a first document to sign").tobytes().hex())
signal.signal(signal.SIGINT, time_out)
attempt(lambda: kernels.compile_loops({"triple": lambda x: 3 * x}).triple(2))
signal.signal(signal.SIGINT, signal.SIG_IGN)
attempt(lambda: kernels.compile_loops({"double": lambda x: 2 * x}).double(2))
"""


def test_a_ctrl_c_while_the_loops_load_is_raised_once_they_are_loaded() -> None:
    """llvmlite calls back into Python through ctypes while numba compiles or loads a loop;
    a KeyboardInterrupt raised in such a callback was printed as "Exception ignored" and
    dropped, so `neardup-admin add` ran to the end and exited 0 (review 41). A real
    SIGINT, sent from the first callback of each load: it reaches the caller once the load
    is done, through the handler it found (a raising custom one too), which is then back
    in place; an ignored SIGINT stays ignored. A fresh interpreter, as numba loads once."""
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_LOAD], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "Exception ignored" not in done.stderr
    signature = MinHasher().signature("a first document to sign").tobytes().hex()
    assert done.stdout.splitlines() == [
        "KeyboardInterrupt default_int_handler",
        signature,  # the loop was loaded whole, and signs
        "Timeout time_out",
        "returned 4 SIG_IGN",
    ]


_UNCOMPILED = """
import json
import numpy as np
from neardup_store import MinHashConfig, MinHasher, ShingleConfig, kernels

texts = json.loads(input())
loops = kernels.compiled()
out = {"compiled": any(hasattr(f, "_compile_for_args") for f in vars(loops).values())}
for scheme in ("oph", "kperm"):
    for kind in ("char", "word"):
        config = MinHashConfig(num_perm=64, scheme=scheme, shingles=ShingleConfig(kind=kind))
        out[scheme + " " + kind] = MinHasher(config).signatures(texts).tolist()
print(json.dumps(out))
"""


def test_signing_with_numba_s_jit_disabled_gives_the_compiled_signatures() -> None:
    """Under NUMBA_DISABLE_JIT=1 numba.njit returns the plain function, which has no
    _compile_for_args: every signing raised a raw AttributeError (review 52). The plain
    loops now run, without overflow warnings (errors here), and sign as compiled code."""
    import json

    texts = ["A few words to sign,  twice\tover.", "Straße ﬁne Ｔｅｘｔ e\u0301 한국어 文字", "ab"]
    env = {**os.environ, "NUMBA_DISABLE_JIT": "1", "PYTHONPATH": str(_PROJECT_ROOT)}
    done = subprocess.run(
        [sys.executable, "-W", "error::RuntimeWarning", "-c", _UNCOMPILED],
        input=json.dumps(texts), env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got.pop("compiled") is False  # the switch took effect: plain Python ran
    for name, signatures in got.items():
        scheme, kind = name.split()
        config = MinHashConfig(num_perm=64, scheme=scheme, shingles=ShingleConfig(kind=kind))  # type: ignore[arg-type]
        assert signatures == MinHasher(config).signatures(texts).tolist(), name
