"""The lessons layer: what only the notebooks in `lessons/` use. It may import the core and
the bench layer; neither imports it.

- Shared by every lesson: `artifacts` (figures and tables written reproducibly, tables shown
  as Markdown) and `exercises` (each lesson's exercises, `exercises.lesson_NN`, and the checks
  that say right or wrong).
- Figures too long to sit in a lesson, one module each, named for what they draw: `*_figure`
  modules, `block_size_trade` (08), `rows_per_forward` (09), `prefix_figures` (21),
  `chunked_prefill_figures` (22), `roofline` (23, 24), `diagrams` (the lifecycle, 10).
- Walkthroughs and readings of runs: `forward_log` and `cached_generation` (03-06),
  `paged_walkthrough` (07), `fragmentation`, `stress` (15), `swap_runs` and `preemption_cost`
  (18), `live_server` and `hostile` (20-22), `prefix_sharing` (21), `chunked_prefill` (22),
  `step_cost` (22-24).
- Rules other than the core's, each a subclass a lesson runs to show what it costs:
  `wrong_resumes` (15), `victim_rules` (16), `lookahead` and `watermarks` (17).
"""
