"""Conformance suites that implementations of rl-core's contracts run against themselves.

Each submodule is a pytest suite to subclass in your own tests (`platform`: platforms;
further suites cover train and rollout engines). Importing this package imports nothing
heavy; the suites import pytest and load engines only when they run.
"""
