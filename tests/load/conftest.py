"""The load tests' cost models, made once a session from load_profiles.py's hand-made profiles."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # load_profiles (import-mode=importlib)
import load_profiles  # noqa: E402

from tuner.model.costmodel import CostModel  # noqa: E402


@pytest.fixture(scope="session")
def hand_model(tmp_path_factory: pytest.TempPathFactory) -> CostModel:
    return load_profiles.hand_model(tmp_path_factory.mktemp("hand"))


@pytest.fixture(scope="session")
def spec_model(tmp_path_factory: pytest.TempPathFactory) -> CostModel:
    return load_profiles.spec_model(tmp_path_factory.mktemp("spec"))


@pytest.fixture(scope="session")
def cliff_model(tmp_path_factory: pytest.TempPathFactory) -> CostModel:
    return load_profiles.cliff_model(tmp_path_factory.mktemp("cliff"))
