"""One module per ``fsdpviz`` command: thin glue between the CLI and the layers below."""
