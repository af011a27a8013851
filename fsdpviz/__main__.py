"""``python -m fsdpviz`` is the ``fsdpviz`` command."""

from fsdpviz.cli import main

if __name__ == "__main__":
    main()
