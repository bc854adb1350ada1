from tests.agent.conftest import service  # noqa: F401  (a real `blkpilot serve`)
