"""The compare page: loading and analysing the runs (``build``), the page's data (``data``), its
charts (``plots``) and words (``page``)."""
