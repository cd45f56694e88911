"""The shared vocabulary: every word the workbench reports has a tone, every tone a colour in the CLI and on the
dashboard, and the verdicts the verifier and the agent write are words of the vocabulary."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import pytest

import workbench
from workbench.cli import TONE_STYLE
from workbench.vocabulary import (
    ERROR_VERDICTS,
    INTEGRITY_VERDICTS,
    NUMERIC_VERDICTS,
    SANDBOX_VERDICTS,
    BlockStatus,
    FailureClass,
    JobStatus,
    ReplayStatus,
    RunStatus,
    Tone,
    Verdict,
    tone,
)

PACKAGE = Path(workbench.__file__).resolve().parent
DASHBOARDS = PACKAGE / "dashboard"


@pytest.mark.parametrize("words", [Verdict, RunStatus, BlockStatus, ReplayStatus, JobStatus], ids=lambda e: e.__name__)
def test_every_reported_word_has_a_tone(words):
    assert [w for w in words if tone(w) is None] == []


def test_words_are_their_strings():
    """Stored, serialised and compared as the plain strings the store has always held."""
    assert Verdict.PASS == "pass" and f"{BlockStatus.NUMERICS_PASS}" == "numerics pass"
    assert json.loads(json.dumps({"v": Verdict.TARGET_COMPILE_ERROR})) == {"v": "target_compile_error"}
    assert tone("no such word") is None


def test_the_groups_partition_what_they_should():
    assert not set(ERROR_VERDICTS) & set(INTEGRITY_VERDICTS)
    assert set(SANDBOX_VERDICTS) <= set(ERROR_VERDICTS)
    assert Verdict.PASS not in ERROR_VERDICTS + INTEGRITY_VERDICTS + NUMERIC_VERDICTS
    assert INTEGRITY_VERDICTS[0] == Verdict.INSTRUMENTATION_ACCESS and INTEGRITY_VERDICTS[-1] == Verdict.OVERFIT_SHAPES
    assert not {str(c) for c in FailureClass} & {str(v) for v in Verdict}  # a diagnosis class is one or the other


def test_every_tone_has_a_colour_in_the_cli_and_on_the_dashboard():
    sys.path.insert(0, str(DASHBOARDS))
    try:
        import board
    finally:
        sys.path.remove(str(DASHBOARDS))
    assert set(TONE_STYLE) == set(Tone)
    assert set(board.TONE_COLOR) == set(Tone) and set(board.TONE_BADGE) == set(Tone)
    assert board.badge(RunStatus.PROMOTED) == ":green-badge[promoted]"
    assert board.badge("something new") == ":violet-badge[something new]"


def test_the_integrity_checks_report_integrity_verdicts():
    from workbench.verify.integrity import CHECKS

    named = {verdict for verdict, _ in CHECKS}
    assert named and named <= set(INTEGRITY_VERDICTS), named - set(INTEGRITY_VERDICTS)


def test_the_workers_failure_kinds_are_verdicts():
    source = (PACKAGE / "verify" / "worker.py").read_text()
    kinds = {node.values[i].value for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Dict)
             for i, key in enumerate(node.keys)
             if isinstance(key, ast.Constant) and key.value == "kind" and isinstance(node.values[i], ast.Constant)}
    assert kinds and kinds <= set(Verdict), kinds - set(Verdict)


def test_the_integrity_registry_ranks_the_verdicts_as_the_vocabulary_lists_them():
    """One function per verdict in one ordered table: its order is the priority, and every word is in it."""
    from workbench.verify.integrity import CHECKS, PRIORITY

    assert PRIORITY == INTEGRITY_VERDICTS
    assert len({verdict for verdict, _ in CHECKS}) == len(CHECKS) and all(callable(check) for _, check in CHECKS)
