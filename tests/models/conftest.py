from tests.agent.conftest import loop_device  # noqa: F401  (real loop devices)
