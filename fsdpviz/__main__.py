"""``python -m fsdpviz`` is the ``fsdpviz`` command."""

from fsdpviz.cli import run

if __name__ == "__main__":
    run()
