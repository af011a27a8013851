"""Predict what another wrap policy, prefetch, resharding or world size would do, from one recording.

The recording is read into a program per rank and step (:mod:`.recording`): what the host thread
did between the framework's labels (busy time, without the time it waited), the compute of every
unit pass, each all-gather and reduce-scatter with its bytes and time, and the memory each pass
allocated. A setting (:mod:`.settings`) rewrites that program the way FSDP would run it
(:mod:`.program`): units merged, all-gathers issued earlier or later, parameters kept after
forward, collectives costed for another world size (:mod:`.comm`, fitted on the recorded
collectives). A small simulator of the host thread and FSDP's streams (:mod:`.simulate`) runs the
program; :mod:`.predict` compares the result with the recording, :mod:`.explore` tries a grid of
settings. No torch and no plotting here (docs/architecture.md).
"""
