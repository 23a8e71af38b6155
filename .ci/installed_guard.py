"""pytest plugin for .ci/run's install stages (loaded with ``-p installed_guard``,
``.ci/`` on PYTHONPATH): the tests must exercise the installed package, not the
repository's ``python/`` tree.

- After collection (every test module and conftest imported), ``specaccept`` and
  its extension must come from ``SPECACCEPT_CI_SITE`` (the venv's site-packages).
- With ``SPECACCEPT_CI_NO_IMPORT_SKIPS=1``, a test or module skipped by
  ``pytest.importorskip`` (an optional integration that did not import) fails the
  run: the integration stage installs them, so such a skip means they went untested.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

_import_skips: list[str] = []


def _under(path: str, root: str) -> bool:
    return Path(path).resolve().is_relative_to(Path(root).resolve())


def pytest_report_header(config):
    return f"installed_guard: site-packages expected at {os.environ.get('SPECACCEPT_CI_SITE')}"


def pytest_collection_finish(session):
    site = os.environ["SPECACCEPT_CI_SITE"]
    module = sys.modules.get("specaccept")
    if module is None:
        import specaccept as module
    native = module._native
    print(f"\ninstalled_guard: specaccept from {module.__file__}")
    print(f"installed_guard: extension from {native.__file__}")
    if not (_under(module.__file__, site) and _under(native.__file__, site)):
        raise pytest.UsageError(
            f"specaccept was imported from {module.__file__} ({native.__file__}), "
            f"not from the installed package under {site}"
        )


def _note_skip(report):
    if not report.skipped or os.environ.get("SPECACCEPT_CI_NO_IMPORT_SKIPS") != "1":
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if "could not import" in reason:
        _import_skips.append(f"{report.nodeid}: {reason}")


def pytest_collectreport(report):
    _note_skip(report)


def pytest_runtest_logreport(report):
    _note_skip(report)


def pytest_sessionfinish(session, exitstatus):
    if _import_skips:
        print("\ninstalled_guard: optional integrations skipped for a failed import:")
        for line in _import_skips:
            print(f"  {line}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
