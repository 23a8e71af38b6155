"""``generate(..., record=path)``: the verified steps of a run, saved in the
``.npz`` layout :func:`specaccept.lab.compare_methods` and ``python -m specaccept
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
    """``record`` as a path a file can be written at (checked before any model call:
    a NUL byte, a missing or unwritable folder, a folder as the file)."""
    if record is None:
        return None
    if not isinstance(record, (str, bytes, os.PathLike)):
        raise TypeError(f"record must be None or a path, got {type(record).__name__}")
    path = os.fspath(record)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if "\0" in path:
        raise InputError("record: a path cannot hold a NUL character", argument="record")
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if not os.path.isdir(folder):
        raise InputError(f"record: the folder {folder} does not exist", argument="record")
    if os.path.isdir(path):
        raise InputError(f"record: {path} is a folder, not a file", argument="record")
    if not os.access(folder, os.W_OK):
        raise InputError(f"record: the folder {folder} is not writable", argument="record")
    try:
        longest = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        longest = 255
    if len(os.fsencode(os.path.basename(path))) > longest:
        raise InputError(
            f"record: the file name is longer than the {longest} bytes the folder allows",
            argument="record",
        )
    return path


class Recorder:
    """The steps of a run, each at its own width, padded to the widest drafted step
    when saved (``num_draft_tokens`` per row); ``deterministic``: the drafter has no
    draft rows (prompt lookup), and the file none either."""

    def __init__(self, path: str, deterministic: bool):
        self.path, self.deterministic = path, deterministic
        self.steps: list[tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]] = []
        # With a schedule: per recorded row, (request, step, available, acceptance).
        self.choices: list[tuple[int, int, int, np.ndarray]] = []

    def add(
        self,
        ids: np.ndarray,
        target_probs: np.ndarray,
        draft_probs: np.ndarray | None,
        counts: np.ndarray,
        choice: tuple[Any, list[int]] | None = None,
    ) -> None:
        """One step's verified rows; ``choice``: the schedule's ``KChoice`` of the
        step and, for each recorded row, its row in that choice."""
        width = ids.shape[1]
        target = np.asarray(target_probs[:, : width + 1], dtype=np.float32)
        draft = None if draft_probs is None else np.asarray(draft_probs[:, :width], np.float32)
        if choice is not None:
            made, rows = choice
            for r in rows:
                self.choices.append(
                    (
                        int(made.requests[r]),
                        len(self.steps),
                        int(made.available[r]),
                        made.acceptance[r],
                    )
                )
        self.steps.append((np.asarray(ids, np.int64), target, draft, np.asarray(counts, np.int64)))

    def save(self) -> None:
        if not any(counts.any() for _, _, _, counts in self.steps):
            raise InputError(
                "record: the run verified no drafted token, so there is nothing to record "
                "(k = 0, max_new_tokens too small, or no draft proposed)",
                argument="record",
            )
        rows = sum(ids.shape[0] for ids, _, _, _ in self.steps)
        width = max(ids.shape[1] for ids, _, _, _ in self.steps)
        vocab = self.steps[0][1].shape[-1]
        ids_all = np.zeros((rows, width), dtype=np.int64)
        target_all = np.zeros((rows, width + 1, vocab), dtype=np.float32)
        draft_all = None if self.deterministic else np.zeros((rows, width, vocab), np.float32)
        counts_all = np.zeros(rows, dtype=np.int64)
        row = 0
        for ids, target, draft, counts in self.steps:
            n, w = ids.shape
            ids_all[row : row + n, :w] = ids
            target_all[row : row + n, : w + 1] = target
            if draft_all is not None and draft is not None:
                draft_all[row : row + n, :w] = draft
            counts_all[row : row + n] = counts
            row += n
        arrays: dict[str, Any] = {
            "draft_token_ids": ids_all,
            "target_probs": target_all,
            "num_draft_tokens": counts_all,
        }
        if draft_all is not None:
            arrays["draft_probs"] = draft_all
        if self.choices and len(self.choices) == rows:
            arrays["request"] = np.array([c[0] for c in self.choices], dtype=np.int64)
            arrays["step"] = np.array([c[1] for c in self.choices], dtype=np.int64)
            arrays["available"] = np.array([c[2] for c in self.choices], dtype=np.int64)
            arrays["estimated_acceptance"] = np.array(
                [c[3] for c in self.choices], dtype=np.float32
            ).reshape(rows, -1)
        with open(self.path, "wb") as file:
            np.savez(file, **arrays)
