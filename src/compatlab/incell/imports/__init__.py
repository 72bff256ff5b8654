"""The import stage's machinery, run in the cell by its pytest suite (incell/suites/test_import.py).

Standard library and compatlab.incell only, Python 3.10 and later: the suite holds the test, these modules
the rest, in the order a run goes:

- plan.py: the declared distributions as installed, their modules to load and the order to load them;
- order.py: what the last runs on this environment learned of that order (which adoption refused whose loads);
- driver.py: the CUDA driver they load against, the machine's or a stand-in grown on demand;
- loader.py: where each load runs (a child of a fork server, else a fresh interpreter), jobs at a time;
- load.py: one target loaded, retried as its package would load it, and told as an ImportEntry;
- attempts.py: what a package's import tried to load and could not, judged;
- progress.py: the line the lab shows while the loads run;
- needed.py: whether a failed module is needed, from what its package's imports were seen to do;
- verdicts.py: each failed entry's verdict (broken, ignored, needs a GPU, could not be judged, a warning);
- labels.py: a file's label, its path relative to site-packages as RECORD spells it.
"""
