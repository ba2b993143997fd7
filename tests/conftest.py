from __future__ import annotations

import pytest

from dse.catalog.hardware import default_efficiency, default_systems
from dse.catalog.models import default_models


@pytest.fixture(scope="session")
def systems():
    return default_systems()


@pytest.fixture(scope="session")
def models():
    return default_models()


@pytest.fixture(scope="session")
def efficiency():
    return default_efficiency()
