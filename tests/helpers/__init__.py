"""Helpers shared by the test suites (never shipped in the package): ``kineto`` writes Kineto JSON
traces whose answers are known by construction, ``jobs`` runs training jobs and ``fsdpviz record``."""
