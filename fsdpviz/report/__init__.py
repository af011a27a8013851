"""Tables -> holoviews objects (``plots``) -> one standalone offline HTML page (``html``)."""
