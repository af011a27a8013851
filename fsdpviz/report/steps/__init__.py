"""The "Across steps and ranks" section: step times of every step (``data``), its charts (``plots``)
and words (``section``)."""
