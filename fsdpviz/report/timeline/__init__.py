"""The "Timeline of one step" section: which step to draw (``steps``), the per-unit Gantt's data
(``units``), the all-events view's data (``events``), one tab's data (``view``), the memory curve
(``memory``), the bokeh figures (``figure``) and the section's words (``section``)."""
