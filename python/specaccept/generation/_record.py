"""``generate(..., record=path)``: the verified steps of a run, saved in the
``.npz`` layout :func:`specaccept.compare_methods` and ``python -m specaccept
compare --from`` read (docs/spec.md section 6.6): one logged step per row per
chain step, as probabilities (the target's rows after temperature, top-k and
top-p; the draft's rows the drafts were drawn from)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .._errors import InputError

__all__ = ["Recorder", "check_path"]


def check_path(record: Any) -> str | None:
    """``record`` as a path whose folder exists (checked before any model call)."""
    if record is None:
        return None
    if not isinstance(record, (str, os.PathLike)):
        raise TypeError(f"record must be None or a path, got {type(record).__name__}")
    path = os.fspath(record)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise InputError(f"record: the folder {folder} does not exist", argument="record")
    if os.path.isdir(path):
        raise InputError(f"record: {path} is a folder, not a file", argument="record")
    return path


class Recorder:
    """The steps of a run, padded to ``k`` drafts (``num_draft_tokens`` per step);
    ``deterministic``: the drafter has no draft rows (prompt lookup), and the file
    none either."""

    def __init__(self, path: str, k: int, deterministic: bool):
        self.path, self.k, self.deterministic = path, k, deterministic
        self.ids: list[np.ndarray] = []
        self.target: list[np.ndarray] = []
        self.draft: list[np.ndarray] = []
        self.counts: list[np.ndarray] = []

    def add(
        self,
        ids: np.ndarray,
        target_probs: np.ndarray,
        draft_probs: np.ndarray | None,
        counts: np.ndarray,
    ) -> None:
        rows, width = ids.shape
        vocab = target_probs.shape[-1]
        padded_ids = np.zeros((rows, self.k), dtype=np.int64)
        padded_ids[:, :width] = ids
        target = np.zeros((rows, self.k + 1, vocab), dtype=np.float32)
        target[:, : width + 1] = target_probs[:, : width + 1]
        self.ids.append(padded_ids)
        self.target.append(target)
        self.counts.append(np.asarray(counts, dtype=np.int64))
        if not self.deterministic:
            # A step where no row drafted has no draft rows: zeros, never read.
            draft = np.zeros((rows, self.k, vocab), dtype=np.float32)
            if draft_probs is not None:
                draft[:, :width] = draft_probs[:, :width]
            self.draft.append(draft)

    def save(self) -> None:
        if not self.ids:
            raise InputError(
                "record: the run verified no drafted step, so there is nothing to record "
                "(max_new_tokens too small, or every row ended at once)",
                argument="record",
            )
        arrays: dict[str, Any] = {
            "draft_token_ids": np.concatenate(self.ids),
            "target_probs": np.concatenate(self.target),
            "num_draft_tokens": np.concatenate(self.counts),
        }
        if not self.deterministic:
            arrays["draft_probs"] = np.concatenate(self.draft)
        with open(self.path, "wb") as file:
            np.savez(file, **arrays)
