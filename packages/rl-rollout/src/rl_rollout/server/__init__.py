"""The policy as an OpenAI-compatible server (`PolicyServer`) with per-session recording of
what the engine saw and sampled (`rl_rollout.server.sessions`)."""

from rl_rollout.server.app import PolicyServer
from rl_rollout.server.sessions import Session, SessionError, SessionStore, Trajectory

__all__ = ["PolicyServer", "Session", "SessionError", "SessionStore", "Trajectory"]
