"""Speculative generation end to end: the loop, model sessions, drafters.

- :func:`generate` / :class:`Generation`: the batched loop (``_loop``).
- Sessions (``_session``): :class:`Session`, the state of a model over a batch
  of growing sequences with provisional drafts; :class:`SessionModel` opens
  them; :class:`LanguageModel` is the stateless protocol, run through
  :class:`StatelessSession`.
- Drafters (``_drafters``): :class:`PromptLookup`, draft models, trees, and the
  :class:`Drafter` protocol for your own.
- :mod:`specaccept.generation.hf`: Hugging Face models with key-value caches, and
  ``speculative``, the ``custom_generate`` entry of their ``generate``
  (``_custom_generate``).
- The options every entry point checks once (``_options``: ``Options``).
- ``record=`` (``_record``): verified steps saved for ``python -m specaccept compare``.

The verifiers (:mod:`specaccept`) do not depend on this package. The contract
is docs/spec.md section 12; the guide docs/generation.md.
"""

from ._drafters import Drafter, PromptLookup
from ._loop import Generation, generate
from ._session import LanguageModel, Session, SessionModel, StatelessSession

__all__ = [
    "Drafter",
    "Generation",
    "LanguageModel",
    "PromptLookup",
    "Session",
    "SessionModel",
    "StatelessSession",
    "generate",
]
