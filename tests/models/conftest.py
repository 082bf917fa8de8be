"""The fixtures of the model recorders' tests (helpers: ``apis.py``, the server:
``model_server.py``)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from apis import APIS, Api


@pytest.fixture(params=APIS, ids=lambda a: a.name)
def api(request: pytest.FixtureRequest) -> Api:
    return request.param  # type: ignore[no-any-return]
