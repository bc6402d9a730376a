"""The single-controller trainer: role workers, the RL loop, checkpoints and metrics."""

import os

# Under `uv run`, Ray would rebuild the project into a fresh venv for every worker from an
# uploaded copy of the working directory. Workers here share the driver's interpreter and
# packages, so keep that off unless the user asks for it.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
