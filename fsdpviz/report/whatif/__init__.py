"""The ``fsdpviz whatif -o`` page: the recorded and the predicted step on one time axis."""
