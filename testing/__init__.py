"""The harness shared by tests/ and bench/: a kvfs daemon run as a user would (mount), emulated
namespaces (emulate: loop devices, cgroup throttles), a real redis-server (redis_server), the
inference engines' storage tiers in their own processes (engine and its <client>_ops modules),
and a real inference engine with LMCache's multiprocess server (inference).

It is not part of the kvfs package and is not installed with it. It imports kvfs only, never
tests or bench (tests/unit/test_structure.py checks).
"""
