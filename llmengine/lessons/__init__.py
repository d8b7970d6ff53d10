"""The lessons layer: what only the notebooks in `lessons/` use.

Figures and tables written reproducibly (`artifacts`), drawings (`diagrams`), step-by-step
walkthroughs (`paged_walkthrough`, `forward_log`, `cached_generation`), the arithmetic of
fragmentation (`fragmentation`), the stress harness (`stress`), the deliberately wrong
resumes a lesson shows failing (`wrong_resumes`), admission rules measured against the core's
(`lookahead`, a deliberately insufficient reserve; `watermarks`, the watermark sweep), what a
swap run's outcomes say (`swap_runs`), the cost of one preemption on a GPU, recompute against
swap (`preemption_cost`), and victim rules other than the core's with a driver that detects a
scheduler looping (`victim_rules`). It may import the core and the bench layer; neither
imports it.
"""
