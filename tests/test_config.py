"""One settings scheme: each setting from its flag, else $WORKBENCH_<NAME>, else its default; a value that does not
parse is one clear line naming its variable; no other variable is read."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from workbench.agent.llm import LLMConfig
from workbench.config import Settings
from workbench.errors import WorkbenchError


def test_flags_win_over_the_environment_which_wins_over_the_defaults(monkeypatch, tmp_path):
    for name in ("WORKBENCH_DB", "WORKBENCH_OPERATORS", "WORKBENCH_TARGETS", "WORKBENCH_MODELS",
                 "WORKBENCH_REPLAY_STEPS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DB_URL", "sqlite:///not-ours.db")  # a field's own name is not a variable of the scheme
    plain = Settings.load()
    assert (plain.db_url, plain.operators_dir, plain.targets, plain.replay_steps) == (
        "sqlite:///workbench.db", Path("operators"), None, 6)
    monkeypatch.setenv("WORKBENCH_DB", f"sqlite:///{tmp_path / 'env.db'}")
    monkeypatch.setenv("WORKBENCH_TARGETS", "")  # empty: compile for no target, not unset
    monkeypatch.setenv("WORKBENCH_MODELS", f"{tmp_path / 'a'}:{tmp_path / 'b'}")
    monkeypatch.setenv("WORKBENCH_REPLAY_STEPS", "0")
    env = Settings.load()
    assert env.db_url.endswith("env.db") and env.targets == "" and env.replay_steps == 0
    assert env.model_dirs == [tmp_path / "a", tmp_path / "b"]
    assert Settings.load("sqlite:///flag.db", "ops").db_url == "sqlite:///flag.db"
    assert Settings.load("sqlite:///flag.db", "ops").operators_dir == Path("ops")
    # in code a field is set by its own name, over the environment; a name that is no field is an error
    assert Settings(db_url="sqlite:///code.db").db_url == "sqlite:///code.db"
    with pytest.raises(ValidationError):
        Settings(db="sqlite:///typo.db")


def test_a_value_that_does_not_parse_names_its_variable(monkeypatch):
    monkeypatch.setenv("WORKBENCH_REPLAY_STEPS", "six")
    with pytest.raises(WorkbenchError, match=r"^\$WORKBENCH_REPLAY_STEPS: 'six': Input should be a valid integer"):
        Settings.load()
    monkeypatch.setenv("WORKBENCH_REPLAY_STEPS", "-1")
    with pytest.raises(WorkbenchError, match="WORKBENCH_REPLAY_STEPS: '-1'"):
        Settings.load()


def test_the_llm_settings_are_the_same_scheme_under_workbench_llm(monkeypatch):
    monkeypatch.setenv("WORKBENCH_LLM_BASE_URL", "http://127.0.0.1:8000/v1")
    monkeypatch.setenv("WORKBENCH_LLM_RETRIES", "5")
    monkeypatch.setenv("WORKBENCH_LLM_TIMEOUT", "0.5")
    monkeypatch.setenv("WORKBENCH_LLM_MAX_TOKENS", "")  # empty: unset
    config = LLMConfig.load()
    assert (config.base_url, config.retries, config.timeout_s, config.max_tokens) == (
        "http://127.0.0.1:8000/v1", 5, 0.5, None)
    monkeypatch.setenv("WORKBENCH_LLM_RETRIES", "-2")
    with pytest.raises(WorkbenchError, match="retries must be at least 0"):
        LLMConfig.load()
