"""Predict what another wrap policy, prefetch, resharding or world size would do, from one recording,
and advise: the replay (``fsdpviz.replay``) played under a setting and compared with the recording
(:mod:`.predict`, with the memory bounds of :mod:`.bounds` and :mod:`.known`), a grid of settings tried
(:mod:`.explore`), the summary's actions priced once per run (:mod:`.gains`), a setting written as
code for the recorded architecture (:mod:`.apply`) and predictions saved beside the run
(:mod:`.saved`). No torch and no plotting here (docs/architecture.md).
"""
