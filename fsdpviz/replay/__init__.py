"""The one clock: a recording read into a program per rank and step and played back (:mod:`.model`).

The recording is read into programs (:mod:`.recording`, :mod:`.recorded`): what the host thread did
between the framework's labels (busy time, without the time it waited), the compute of every unit
pass, each all-gather and reduce-scatter with its bytes and time, and each step's memory by category
(:mod:`.memory`, which also moves that memory under a setting). A setting (:mod:`.settings`) rewrites
a program the way FSDP would run it (:mod:`.program`): units merged, all-gathers issued earlier or
later, parameters kept after forward, collectives costed for another world size (:mod:`.comm`, fitted
on the recorded collectives). A small simulator of the host thread and FSDP's streams
(:mod:`.simulate`) runs it. Played as recorded, and without the profiler where the timers allow
(:mod:`.calibration` on CPU, :mod:`.hostcost` on GPU), it gives the run's clock (:mod:`.clock`): the
completed summary (``whatif.gains``), the report and ``whatif`` all read it.

The fourth layer (docs/architecture.md): above ``fsdpviz.analysis`` (it reads the analysed run),
below ``fsdpviz.whatif``. No torch and no plotting here.
"""
