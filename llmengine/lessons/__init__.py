"""The lessons layer: what only the notebooks in `lessons/` use.

Figures and tables written reproducibly (`artifacts`), drawings (`diagrams`), step-by-step
walkthroughs (`paged_walkthrough`, `forward_log`, `cached_generation`), the arithmetic of
fragmentation (`fragmentation`), and victim rules other than the core's with a driver that
detects a scheduler looping (`victim_rules`). It may import the core and the bench layer;
neither imports it.
"""
