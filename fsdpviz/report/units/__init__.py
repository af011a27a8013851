"""The "Per unit" section: the per-unit table and bars' data (``table``), charts (``plots``) and words
(``section``)."""
