"""``fsdpviz record``: the launcher (parent side) and the rank-side agent."""
