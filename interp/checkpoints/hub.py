"""Hub revisions: the disk checked before each download, and each one evicted after scoring.

A revision already in the Hugging Face cache is read from it and left there. One that is not is
downloaded by :func:`interp.models.load_model` (through the cache, as any model is); before that,
:func:`prepare` checks that the cache's disk has room for the revision's files, and
:func:`evict` deletes them once the revision is scored (``--evict``), so a sweep over many
revisions of a large model needs the room of one.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from interp.errors import ModelLoadError
from interp.models import hub_offline, in_hf_cache

MARGIN = 1.1  # room asked for: the files' size and a tenth more


def cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def is_cached(name: str, revision: str) -> bool:
    """Whether the revision is in the Hugging Face cache already (:func:`interp.models.in_hf_cache`)."""
    return in_hf_cache(name, revision)


def download_size(name: str, revision: str) -> int:
    """Bytes of the files a revision's download fetches (the Hub's file list; network)."""
    from huggingface_hub import HfApi

    info = HfApi().model_info(name, revision=revision, files_metadata=True)
    return sum(int(s.size or 0) for s in info.siblings or [] if _fetched(s.rfilename))


def _fetched(filename: str) -> bool:
    """Files a model load reads: configs, tokenizer files and the weights (safetensors preferred)."""
    return filename.endswith((".json", ".safetensors", ".txt", ".model")) or filename == "merges.txt"


def free_bytes(path: Path) -> int:
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def prepare(name: str, revision: str) -> bool:
    """Before loading a Hub revision: ``False`` when it is cached (nothing to download), else check
    the disk has room for it (:class:`ModelLoadError`, one line, when not) and return ``True``."""
    if is_cached(name, revision):
        return False
    if hub_offline():
        return True  # load_model says in one line that it is neither cached nor reachable
    try:
        need = download_size(name, revision)
    except Exception:
        return True  # the Hub cannot say: load_model reports what is wrong with the name or revision
    free = free_bytes(cache_dir())
    if free < need * MARGIN:
        raise ModelLoadError(
            f"not enough disk for revision {revision!r} of {name!r}: it needs {_gb(need)} and {cache_dir()} has "
            f"{_gb(free)} free; free some space, point HF_HUB_CACHE at a larger disk, or pass evict=True",
            params="evict",
        )
    return True


def evict(name: str, revision: str) -> list[Path]:
    """Delete a revision's files from the cache (its snapshot, and the blobs no other snapshot uses)."""
    repo = cache_dir() / f"models--{name.replace('/', '--')}"
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = repo / "snapshots" / commit
    if not snapshot.is_dir():
        return []
    blobs = {p.resolve() for p in snapshot.rglob("*") if p.is_symlink()}
    for other in (repo / "snapshots").iterdir():
        if other != snapshot:
            blobs -= {p.resolve() for p in other.rglob("*") if p.is_symlink()}
    removed = [snapshot]
    shutil.rmtree(snapshot)
    for blob in blobs:
        if blob.is_file() and blob.parent == (repo / "blobs").resolve():
            blob.unlink()
            removed.append(blob)
    if ref.is_file():
        ref.unlink()
        removed.append(ref)
    return removed


def _gb(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
